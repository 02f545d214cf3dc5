"""data: the rows on the Ray Train workers.

Owns: loading a dataset and its images, the bad-row scan, the eval split and the collator (``dataset``);
the scan kept with the run (``scan_store``); a row as token ids (``encoding``); each epoch's order of
rows (``sampler``); the streaming path: what a run streams and the stream's state in checkpoints
(``stream_plan``), the Ray Data CPU stage that checks, decodes and tokenises rows (``stream_rows``), each
worker's split, the record of what it trained and the Trainer's dataloader (``streaming``); a shard's read
is job's (``trainer.job.shard_read``: it runs on any node).

May import: job.
"""
