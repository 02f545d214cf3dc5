"""data: the rows on the Ray Train workers.

Owns: loading a dataset and its images, the bad-row scan, the eval split and the collator (``dataset``);
the scan kept with the run (``scan_store``); a row as token ids (``encoding``); each epoch's order of
rows (``sampler``); the streaming path: shards read by Ray Data, its CPU stage, each worker's split, the
stream's state in checkpoints (``streaming``).

May import: job.
"""
