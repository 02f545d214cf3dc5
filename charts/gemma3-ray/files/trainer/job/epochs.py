"""Each epoch's rows: a permutation seeded by `seed` and the epoch, cut to whole global batches, so every row
is trained at most once per epoch and every optimizer step trains exactly `global_batch_size` rows.

The remainder (rows % global batch) is dropped from that epoch, not padded with repeated rows: the next
epoch's permutation leaves out other rows. Ray Train's workers each take their micro-batches of it in turn
(accelerate's `BatchSamplerShard`), so optimizer step k trains the permutation's rows k*B .. (k+1)*B-1 on
any number of workers. The counts and their checks live here (the head runs them); the order itself, which
needs torch, is trainer.data.sampler.
"""

from __future__ import annotations

import math

from trainer.job.elastic import worker_counts
from trainer.job.flags import TrainArguments, UsageError


def rows_per_epoch(rows: int, global_batch: int) -> dict[str, int]:
    """What one epoch trains: whole global batches of the training rows; the rest is left out of it."""
    steps = rows // global_batch
    return {"rows_per_epoch": steps * global_batch, "rows_left_out_per_epoch": rows - steps * global_batch,
            "steps_per_epoch": steps}


def check_rows(rows: int, global_batch: int, what: str, counts: list[int]) -> dict[str, int]:
    """`rows_per_epoch`, or UsageError when not one global batch fits in the training rows. The advice is itself
    accepted: the largest global batch the rows fill that every worker count in `counts` splits exactly."""
    if rows >= global_batch:
        return rows_per_epoch(rows, global_batch)
    step = math.lcm(*counts)
    who = f"{counts[0]} worker{'s' if counts[0] > 1 else ''}" if len(counts) == 1 else \
        f"every worker count {counts[0]}..{counts[-1]}"
    best = rows // step * step
    advice = (f"use --global_batch_size={best} (the most that {rows} rows fill and {who} split exactly), or add rows"
              if best else f"add rows ({who} split{'s' if len(counts) > 1 else ''} only a global batch of {step} or "
                           "more), or use fewer workers")
    raise UsageError(f"global_batch_size={global_batch} is more than the {rows} training rows ({what}): {advice}")


def no_usable_rows(dataset: str, skipped: dict[str, int]) -> UsageError:
    """The stop of a run none of whose rows is usable (every one skipped, by reason)."""
    return UsageError(f"no usable rows in {dataset} (skipped: {skipped})")


def check_usable(rows: int, global_batch: int, what: str, counts: list[int], dataset: str,
                 skipped: dict[str, int]) -> dict[str, int]:
    """The rule for the rows left after the bad ones, on either path (the file path's scan, a streamed epoch): none is
    `no usable rows`, fewer than one global batch is check_rows's stop; else `rows_per_epoch`."""
    if rows <= 0:
        raise no_usable_rows(dataset, skipped)
    return check_rows(rows, global_batch, what, counts)


def check_known_rows(rows: int | None, args: TrainArguments) -> None:
    """The driver's check, before any worker starts, of a row count known up front (parquet metadata): the scan can
    only remove rows, so the training rows are at most `rows` less the eval split."""
    if rows is None:
        return
    held = math.ceil(rows * args.eval_fraction) if args.eval_fraction > 0 else 0
    check_rows(rows - held, args.global_batch_size, f"of {rows} rows, {held} held out for eval",
               worker_counts(args.num_workers, args.min_workers))


def epoch_line(epoch: dict[str, int], global_batch: int) -> str:
    """One log line: how many rows each epoch trains and how many it leaves out."""
    line = (f"[data] each epoch trains {epoch['rows_per_epoch']} rows: {epoch['steps_per_epoch']} steps of global "
            f"batch {global_batch}, each row at most once")
    if epoch["rows_left_out_per_epoch"]:
        line += (f"; {epoch['rows_left_out_per_epoch']} rows are left out of each epoch (the remainder: other rows "
                 f"each epoch, as the order is reshuffled per epoch), never repeated")
    return line
