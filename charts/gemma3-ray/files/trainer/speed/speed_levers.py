"""The speed levers a worker applies to its model after PEFT: the rows of ``trainer/job/lever_table.py``, in order.

Each row names a module of this folder with two functions: ``on(args)`` (does the lever apply to this run) and
``lever(run)`` (apply it; what it returns is the lever's entry in the run's levers, and the row's log line). The
order of the rows is the order of application, which matters: Triton's compile cache before the first Triton
compile, the fused LoRA layers, SigLIP's attention, the frozen LayerNorms (in a Trainer at train begin, after its
Liger patch), the language model's attention, the lean step, the image-feature cache (bench/RESULTS.md measures
each). torch is imported only by the modules the rows name, inside worker code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from trainer.job.lever_table import LEVERS, Lever


@dataclass
class Run:
    """What a lever is applied to: the flags, the (PEFT) model, its Trainer (None outside one) and the device's plan
    of kernels (capability.plan())."""

    args: Any
    model: Any
    trainer: Any
    plan: dict[str, Any]

    @cached_property
    def core(self):
        """The Gemma3Model inside the model (vision_tower, language_model)."""
        from trainer.speed import feature_cache

        return feature_cache.core_model(self.model)


def module_of(lever: Lever):
    """The lever's module, trainer/speed/<lever.module>.py."""
    return importlib.import_module(f"trainer.speed.{lever.module}")


def apply(args, model, trainer=None, levers: tuple[Lever, ...] = LEVERS) -> dict[str, Any]:
    """Every lever whose module's `on(args)` holds, in table order; returns the run's levers (the device's kernel
    plan under "kernels", then each applied lever's report under its name)."""
    from trainer.speed import capability

    plan = capability.plan()
    report: dict[str, Any] = {"kernels": {p: c.kernel for p, c in plan.items()}}
    print(f"[trainer] kernels for {capability.arch(capability.device_capability())}: "
          + ", ".join(f"{p} {c.kernel} ({c.reason})" for p, c in plan.items()), flush=True)
    run = Run(args, model, trainer, plan)
    for lever in levers:
        module = module_of(lever)
        if not module.on(args):
            continue
        report[lever.name] = module.lever(run)
        if lever.says:
            print(f"[trainer] {lever.says}: {report[lever.name]}", flush=True)
    return report
