"""data: the rows on the Ray Train workers.

Owns: loading a dataset and its images, the bad-row scan, the eval split and the collator (``dataset``);
the scan kept with the run (``scan_store``); a row as token ids (``encoding``); each epoch's order of
rows (``sampler``); the streaming path: what a run streams and the stream's state in checkpoints
(``stream_plan``), a shard's bytes read and checked against the manifest's sha256 (``stream_read``), the Ray
Data CPU stage that checks, decodes and tokenises rows (``stream_rows``), each worker's split, the record of
what it trained and the Trainer's dataloader (``streaming``).

May import: job.
"""
