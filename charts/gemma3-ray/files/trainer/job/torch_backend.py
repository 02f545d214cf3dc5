"""Ray Train's torch backend for the job, with a controller side that imports no torch.

Ray's own `TorchConfig`/`_TorchBackend` (ray/train/torch/config.py) import torch at module level, and
Ray Train's controller runs on the driver's node (the CPU head): it unpickles the backend config and
runs the backend's `on_start`/`on_shutdown` there. This backend makes the same calls as
`_TorchBackend` does for a Ray Train v2 worker group on CPUs or GPUs, and the functions the workers
run import Ray's worker-side code (and so torch) inside their bodies, on the workers only.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray._common.network_utils import build_address
from ray._private import ray_constants
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import (
    DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
    TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
)
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)

# torch.distributed's collective backends, as Ray's TorchTrainer chooses them.
GPU_BACKEND = "nccl"
CPU_BACKEND = "gloo"


class TrainFuncContext:
    """Ray's `TorchConfigContextManager` (each GPU worker's default CUDA device), entered on the worker."""

    def __enter__(self) -> Any:
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        return self._inner.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        return self._inner.__exit__(*exc)


@dataclass
class TorchBackendConfig(BackendConfig):
    """`ray.train.torch.TorchConfig`'s fields and defaults; `backend` None: nccl on GPU workers, else gloo."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return TorchBackend

    @property
    def train_func_context(self) -> type[TrainFuncContext]:
        return TrainFuncContext

    @property
    def framework(self) -> TrainingFramework:
        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}


# ---- run on the workers (torch is imported there only) ----

def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


def _set_distributed_env_vars() -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _setup_process_group(**kwargs: Any) -> None:
    import torch.distributed
    from ray.train.torch.config import _setup_torch_process_group

    if not torch.distributed.is_available():
        raise RuntimeError("Distributed torch is not available.")
    _setup_torch_process_group(**kwargs)


def _shutdown(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


class TorchBackend(Backend):
    """`_TorchBackend`'s start and shutdown for a v2 worker group, from the controller."""

    share_cuda_visible_devices: bool = True  # as _TorchBackend: GPU workers of a node see each other's GPUs

    def on_start(self, worker_group: Any, backend_config: TorchBackendConfig) -> None:
        backend = backend_config.backend
        if backend is None:
            backend = GPU_BACKEND if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else CPU_BACKEND
        master_addr, master_port = worker_group.execute_single(0, get_address_and_port)
        if backend_config.init_method == "env":
            worker_group.execute(_set_master, addr=master_addr, port=master_port)
            url = "env://"
        elif backend_config.init_method == "tcp":
            url = f"tcp://{build_address(master_addr, master_port)}"
        else:
            raise ValueError(f"The provided init_method ({backend_config.init_method}) is not supported. Must be "
                             "either 'env' or 'tcp'.")
        worker_group.execute(_set_distributed_env_vars)  # LOCAL_RANK etc., before init_process_group
        ray.get([
            worker_group.execute_single_async(i, _setup_process_group, backend=backend, world_rank=i,
                                              world_size=len(worker_group), init_method=url,
                                              timeout_s=backend_config.timeout_s)
            for i in range(len(worker_group))
        ])

    def on_shutdown(self, worker_group: Any, backend_config: TorchBackendConfig) -> None:
        futures = worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")
