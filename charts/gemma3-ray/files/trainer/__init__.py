"""trainer: the Gemma 3 vision fine-tune as a Ray Train job (README.md).

`vision_train` is the driver's entry (`python -m trainer.vision_train`, run where this package's folder
is); `job/` is all the Ray head imports, `data/`, `speed/` and `worker/` the Ray Train workers' (torch).
Every package `__init__` stays empty of imports: importing a folder imports nothing else.
"""
