"""worker: one Ray Train worker, the torch side (transformers, TRL, PEFT).

Owns: the worker's train loop (``worker``) and its scratch directory, removed on every exit (``scratch``); the model, LoRA and the SFTTrainer (``model``) and the
model's files on the node (``model_files``), its processor loaded once per node (``processor_cache``); metrics.jsonl, TensorBoard, checkpoints and summary.json
(``metrics``); the resume point (``resume``); report.html and samples.jsonl on rank 0 (``report_hook``,
``samples``); library noise off (``quiet_logs``); libraries the run does not use left out (``unused_libraries``).

May import: job, data, speed.
"""
