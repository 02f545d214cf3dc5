"""bench: the training speed on one GPU as scenarios and expectations, and CPU benchmarks (README.md).

Run from the repository root, as modules (``python3 -m bench.call GROUP``, which ``make bench GROUP=...`` runs);
only the shell scripts (``e2e_ray.sh``, ``e2e_ray_streaming.sh``, ``device_env.sh``) run bare on the GPU machine.
At the top, the GPU call: the scenario table read and checked (``scenario_table``), one call of a group
(``call``), its results judged and RESULTS.md written (``report``); what a scenario runs: the trainer's own
path (``bench``, with its per-step timer ``step_timer`` and profiled step ``profile_step``) and Unsloth's
(``unsloth_row``). Below them ``kernels/`` (kernel checks and the FP8 experiment, on the GPU) and ``cpu/``
(benchmarks on this machine's CPU). Every package ``__init__`` stays empty of imports.
"""
