"""data: the rows on the Ray Train workers.

Owns: loading a dataset and its images, the bad-row scan, the eval split and the collator (``dataset``);
the scan kept with the run (``scan_store``); a row as token ids (``encoding``); each epoch's order of
rows (``sampler``).

May import: job.
"""
