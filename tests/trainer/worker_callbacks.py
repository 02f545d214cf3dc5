"""The worker side of the test-only callback factories (tests/trainer/faults.py, drill_callbacks.py, probes.py):
the transformers TrainerCallback classes a factory builds inside a Ray Train worker.

Apart from the factories on purpose: a factory is pickled with the job's config and unpickled in the worker
before the trainer's entry runs, so the factory modules import no transformers (which would import peft, and
peft bitsandbytes, before trainer/worker/unused_libraries.py can leave it out); a factory imports this
module when the worker calls it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tests.trainer.faults import marker as fault_marker

HOLD_POLL_S = 0.2
# How long a fault waits for Ray Train to register the run's written checkpoints (its controller collects a
# worker's report on its next poll, every 2 s by default) before it fires regardless, saying so.
REGISTERED_WAIT_S = 120


def newest_save(args, state) -> int:
    """The step of the newest checkpoint the run has saved by now (0: none), from its save settings."""
    strategy = getattr(args.save_strategy, "value", args.save_strategy)
    if strategy != "steps" or not args.save_steps:
        return 0
    every = int(args.save_steps)
    return state.global_step - state.global_step % every


def wait_until_registered(storage, step: int) -> None:
    """Until Ray Train has registered the run's checkpoint of `step` (or a newer one); at once for step 0. A fault
    fired sooner can beat the controller (it collects a worker's report on its next poll) to a checkpoint reported a
    moment before, which a restart then rightly ignores (trainer/job/runs.py: a directory Ray Train never registered
    is not a checkpoint): the drill would resume from an older one, or from nothing, depending on how fast a step
    is. By the registry, not by listing the checkpoint directories: on gs:// they are prefixes, which a listing of
    `checkpoints/` does not show."""
    from trainer.job.runs import registered_checkpoints

    deadline = time.monotonic() + REGISTERED_WAIT_S
    while step > 0:
        if any(registered >= step for registered, _ in registered_checkpoints(storage)):
            return
        if time.monotonic() > deadline:
            print(f"[fault injection] the step-{step} checkpoint not registered by Ray Train after "
                  f"{REGISTERED_WAIT_S} s: firing anyway", flush=True)
            return
        time.sleep(HOLD_POLL_S)


class KillOnce(TrainerCallback):
    def __init__(self, step: int, storage) -> None:
        self.step, self.storage = step, storage

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and self.storage.read_bytes(fault_marker(self.step)) is None:
            wait_until_registered(self.storage, newest_save(args, state))
            self.storage.write_bytes(fault_marker(self.step), str(os.getpid()).encode())
            print(f"[fault injection] killing worker pid {os.getpid()} after step {state.global_step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class RemoveOnTrainBegin(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        Path(self.path).unlink(missing_ok=True)


class SampleRecorder(TrainerCallback):
    """Appends one JSON line per training micro-batch: attempt, world size, rank, step, epoch, sample ids.

    The ids are read back from the token ids the model is given (a forward pre-hook), so they are what
    was trained on, not what a sampler promised. `id_pattern` finds one id per decoded row.
    """

    def __init__(self, out_dir: str, id_pattern: str):
        self.out_dir, self.id_pattern = out_dir, id_pattern

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        import ray.train
        from ray.train.collective import broadcast_from_rank_zero

        ctx = ray.train.get_context()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        # One id per worker-group attempt, the same on every rank (a resize starts a new attempt).
        attempt = broadcast_from_rank_zero(time.time_ns())
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        pattern = re.compile(self.id_pattern)
        path = Path(self.out_dir) / f"samples-{attempt}-rank{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)

        def record(module, _args, kwargs: dict[str, Any]) -> None:
            if not module.training:
                return  # evaluation
            texts = tokenizer.batch_decode(kwargs["input_ids"])
            ids = [m.group(1) for t in texts if (m := pattern.search(t))]
            rec = {"attempt": attempt, "world": world, "rank": rank, "step": state.global_step + 1,
                   "epoch": int(state.epoch or 0), "ids": ids, "pid": os.getpid()}
            with open(path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")

        model.register_forward_pre_hook(record, with_kwargs=True)


class HoldAfterStep(TrainerCallback):
    """On the node `node_id` only, once (while `marker` does not exist): after optimizer step `at_step`,
    write `marker` (once Ray Train registered the run's checkpoints) and wait, until the drill's change of the cluster ends this process (the node's
    removal, or the restart of the worker group that a resize makes)."""

    def __init__(self, node_id: str, at_step: int, marker: str, storage):
        self.node_id, self.at_step, self.marker, self.storage = node_id, at_step, marker, storage

    def on_step_end(self, args, state, control, **kwargs):
        import ray

        if state.global_step != self.at_step or ray.get_runtime_context().get_node_id() != self.node_id:
            return
        if Path(self.marker).exists():
            return  # held once already: the recomputation of this step after the resize runs through
        wait_until_registered(self.storage, newest_save(args, state))
        Path(self.marker).write_text(str(os.getpid()))
        while True:
            time.sleep(HOLD_POLL_S)


class ModulesAtTrainBegin(TrainerCallback):
    def __init__(self, out_dir: str, rank: int, names: tuple[str, ...]) -> None:
        self.out_dir, self.rank, self.names = out_dir, rank, names

    def on_train_begin(self, args, state, control, **kwargs):
        # sys.modules[name] is None for a module marked not importable: not loaded.
        loaded = {name: sys.modules.get(name) is not None for name in self.names}
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(self.out_dir) / f"rank-{self.rank}-pid-{os.getpid()}.json"
        path.write_text(json.dumps({"rank": self.rank, "loaded": loaded}))
