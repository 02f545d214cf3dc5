"""cpu: benchmarks on this machine's CPU, never on the GPU machine (run them under the machine's lock).

Owns: the trainer's data start-up on many gs:// rows in Ray Train workers (``scale``), its synthetic rows on
fake-gcs-server (``scale_data``), and Ray's pip and uv runtime envs installing the trainer's packages
(``runtime_env_install``).

May import: nothing (of bench; the trainer and the local kit are what they run).
"""
