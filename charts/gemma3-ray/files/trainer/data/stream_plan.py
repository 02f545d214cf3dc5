"""What a streamed run reads and where it is: the plan (the checked shards, the rows held out, the epochs) and
the stream's state a checkpoint keeps (the epoch and its trained rows as a bitmap), with the shuffle and resume
rules the run's summary states. The streaming path as a whole: ``trainer.data.streaming``.
"""

from __future__ import annotations

import base64
import json
import math
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field

from trainer.job.flags import TrainArguments, UsageError
from trainer.job.shard_manifest import ShardSet

STATE_FILE = "stream_state.json"  # in each checkpoint: the epoch and the rows it has trained
SHUFFLE_RULE = ("each epoch: the shards in an order seeded by seed and the epoch, then each worker's rows through "
                "a shuffle window of {window} rows seeded by seed, the epoch and the rank")
NO_SHUFFLE_RULE = "none (streaming_shuffle_window=0): the manifest's order of shards and rows"
RESUME_RULE = ("a restart resumes the newest checkpoint's epoch without the rows that epoch had trained "
               "(stream_state.json in the checkpoint): no row is trained twice or left out by the restart; the "
               "order of the rest differs from an uninterrupted run")


# ----------------------------------------------------------------------------------------------
# What a run streams: the checked shards, which rows are held out, how many epochs.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamPlan:
    shards: ShardSet
    eval_rows: int  # the last eval_rows rows of the manifest's order are the eval split
    global_batch: int
    seed: int
    window: int
    epochs: int | None  # how many epochs the stream holds; None: as many as max_steps takes (the Trainer stops)

    @property
    def first_eval_row(self) -> int:
        return self.shards.rows - self.eval_rows

    @property
    def train_rows(self) -> int:
        return self.first_eval_row

    def train_shards(self) -> list:
        return [s for s in self.shards.shards if s.first_row < self.first_eval_row]

    def eval_shards(self) -> list:
        return [s for s in self.shards.shards if s.first_row + s.rows > self.first_eval_row]

    def steps_per_epoch(self) -> int:
        """Steps an epoch of good rows trains (fewer when rows turn out bad or a worker's remainder is left out)."""
        return self.train_rows // self.global_batch

    def shard_order(self, epoch: int) -> list:
        shards = self.train_shards()
        if self.window:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(shards)
        return shards

    def shuffle_rule(self) -> str:
        return SHUFFLE_RULE.format(window=self.window) if self.window else NO_SHUFFLE_RULE


def plan_stream(args: TrainArguments, shards: ShardSet) -> StreamPlan:
    eval_rows = math.ceil(shards.rows * args.eval_fraction) if args.eval_fraction > 0 else 0
    # max_steps: epochs until the Trainer stops, however many rows turn out bad (the file path's epochs of its good
    # rows); else the epochs asked for (fewer steps than the manifest's rows plan when rows turn out bad).
    epochs = None if args.max_steps > 0 else math.ceil(args.num_train_epochs)
    return StreamPlan(shards, eval_rows, args.global_batch_size, args.seed, args.streaming_shuffle_window, epochs)


def max_steps(args: TrainArguments, plan: StreamPlan) -> int:
    """The Trainer's max_steps: the flag's, else the epochs' steps as the manifest's rows give them."""
    return args.max_steps if args.max_steps > 0 else max(1, math.ceil(args.num_train_epochs * plan.steps_per_epoch()))


# ----------------------------------------------------------------------------------------------
# Row ids as a compact bitmap (what a checkpoint keeps of the epoch's trained rows).
# ----------------------------------------------------------------------------------------------
def pack_rows(rows: set[int], total: int) -> str:
    bits = bytearray((total + 7) // 8)
    for r in rows:
        bits[r >> 3] |= 1 << (r & 7)
    return base64.b64encode(zlib.compress(bytes(bits), 6)).decode()


def unpack_rows(packed: str) -> set[int]:
    bits = zlib.decompress(base64.b64decode(packed))
    return {i * 8 + b for i, byte in enumerate(bits) if byte for b in range(8) if byte >> b & 1}


@dataclass
class StreamState:
    """Where the stream is: the epoch, the step it began at, and what the checkpoint it resumed from had trained in
    it (every rank's rows, those trained more than once with their extra count, the steps)."""

    epoch: int = 0
    epoch_start_step: int = 0
    rows: set[int] = field(default_factory=set)  # every rank's rows of the epoch the checkpoint had trained
    resumed_rows: int = 0
    twice: Counter = field(default_factory=Counter)  # {row: times trained beyond once} before the checkpoint
    resumed_steps: int = 0

    def to_json(self, all_rows: set[int], total: int, step: int, twice: Counter | None = None) -> bytes:
        return json.dumps({"format": 1, "epoch": self.epoch, "epoch_start_step": self.epoch_start_step,
                           "step": step, "rows_trained": len(all_rows), "rows": pack_rows(all_rows, total),
                           "twice": {str(r): n for r, n in sorted((twice or {}).items())}}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> StreamState | None:
        if not raw:
            return None
        try:
            obj = json.loads(raw)
            rows = unpack_rows(obj["rows"])
            twice = Counter({int(r): int(n) for r, n in (obj.get("twice") or {}).items()})
            start = int(obj["epoch_start_step"])
            return cls(int(obj["epoch"]), start, rows, len(rows), twice, int(obj.get("step", start)) - start)
        except (ValueError, KeyError, TypeError, AttributeError, zlib.error):
            return None


def resume_state(raw: bytes | None, checkpoint: str) -> StreamState:
    """The stream state of the checkpoint a run resumes from (`raw`: its STATE_FILE's bytes, None when absent), or one
    sentence: without it the epoch's trained rows are unknown, and starting the stream again at epoch 0 under a
    model trained to the checkpoint's step would train rows twice while the summary states the no-twice rule."""
    state = StreamState.from_json(raw)
    if state is not None:
        return state
    why = "it has none" if raw is None else "it is torn or not one"
    raise UsageError(f"checkpoint {checkpoint} cannot resume the stream: {STATE_FILE} ({why}) holds the epoch's "
                     "trained rows; start a new run (another --run_name), or delete that checkpoint to resume from "
                     "the one before it")
