"""Test-only: the CPU head of a `dependencies=runtimeEnv` cluster on one machine (standard library only).

Installed as `sitecustomize` through PYTHONPATH, in every process of a Ray job: the worker packages
(torch, transformers, …) cannot be imported except in Ray Train's worker actors, which on GKE are the
only processes that get them (the chart gives the packages to the workers' runtime env only). The
driver installs it with `install()`. It holds the house's one list of what the head may import
(`HEAD_PACKAGES`) and may not (`WORKER_PACKAGES`, `WORKER_FOLDERS`): tests/trainer/test_layering.py and
tests/trainer/test_light_driver.py read them from here (this file stays standard library only: it is
copied alone into a job's site as `sitecustomize.py`). Every attempt is appended to the file named by
$IMPORT_BLOCKER_LOG as `<role> <package> allowed|refused`, the role being the Ray actor class of the
process ("driver" for a process that is no Ray worker, "task" for a task worker).
"""

from __future__ import annotations

import os
import sys

# What the Ray head (the driver's process, and every process of the job but Ray Train's workers) may import
# beyond the standard library: Ray, and pyarrow (Ray Train requires it); of the trainer, job/ and its entry.
HEAD_PACKAGES = ("ray", "pyarrow")
# The workers' packages: never imported on the head (the stock Ray head has none of them).
WORKER_PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "PIL", "accelerate", "bitsandbytes",
                   "liger_kernel", "safetensors", "huggingface_hub", "triton", "tensorboardX")
# The trainer's worker side: never loaded on the head.
WORKER_FOLDERS = ("trainer.data", "trainer.speed", "trainer.worker")
ALLOWED_ROLE = "RayTrainWorker"  # ray/train/v2/_internal/execution/worker_group/worker.py
LOG_ENV = "IMPORT_BLOCKER_LOG"


def role() -> str:
    """The Ray actor class hosted by this process, "task" in a task worker, "driver" elsewhere."""
    worker_mod = sys.modules.get("ray._private.worker")
    worker = getattr(worker_mod, "global_worker", None)
    if worker is None or getattr(worker, "mode", None) != 1:  # ray.WORKER_MODE: a worker process
        return "driver"
    actor_id = worker.actor_id
    if actor_id.is_nil():
        return "task"
    handle = worker.core_worker.get_actor_handle(actor_id)
    return handle._ray_actor_creation_function_descriptor.class_name


class Refuse:
    """A meta-path finder that refuses the blocked packages outside Ray Train's workers."""

    def find_spec(self, name: str, path=None, target=None):  # noqa: ANN001 - the finder protocol
        top = name.partition(".")[0]
        if top not in WORKER_PACKAGES or name != top:
            return None
        who = role()
        allowed = who == ALLOWED_ROLE
        with open(os.environ[LOG_ENV], "a") as log:
            log.write(f"{who} {top} {'allowed' if allowed else 'refused'}\n")
        if allowed:
            return None
        raise ModuleNotFoundError(f"{name} is not installed on the head in this test", name=name)


def install() -> None:
    if not any(isinstance(f, Refuse) for f in sys.meta_path):
        sys.meta_path.insert(0, Refuse())


if os.environ.get(LOG_ENV):
    install()
