"""A usage error on the Ray Train workers stops the whole run once: no retry, no traceback, the driver's one sentence."""

# A rank that finds a usage error (bad_rows=fail, too few rows, no loadable checkpoint) writes it to the run's
# usage_error.txt and raises StopAllRanks, so that Ray Train ends the worker group (a rank that only returned
# would leave the others waiting for it in a collective). Ray Train 2.60 would log that exception with its
# traceback on the worker and in its failure policy's decision, and retry the group up to max_failures times;
# here the rank's own log record of it is dropped and the run's failure policy raises at once, without a retry.
# The driver then prints the sentence and exits 2. Imported by the driver, Ray Train's controller (which
# unpickles the workers' errors and the policy) and the workers: Ray and the standard library only.

from __future__ import annotations

import logging
from typing import NoReturn

from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

# Ray Train's worker logs each exception of the training function with its traceback, under this logger and
# message (ray/train/v2/_internal/util.py, construct_user_exception_with_traceback).
RAY_TRAIN_FN_LOGGER = "ray.train.v2._internal.util"
RAY_TRAIN_FN_ERROR = "Error in training function"


class StopAllRanks(RuntimeError):
    """A usage error on one rank, raised so that Ray Train ends the whole worker group; its message is the
    sentence (the driver prints it from usage_error.txt)."""


class _DropStopRecord(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not (text.startswith(RAY_TRAIN_FN_ERROR) and StopAllRanks.__name__ in text)


def stop_all_ranks(sentence: str) -> NoReturn:
    """Raise StopAllRanks, with Ray Train's log record of it on this worker dropped (it is no failure to debug)."""
    logger = logging.getLogger(RAY_TRAIN_FN_LOGGER)
    if not any(isinstance(f, _DropStopRecord) for f in logger.filters):
        logger.addFilter(_DropStopRecord())
    raise StopAllRanks(sentence)


def is_usage_stop(error: BaseException) -> bool:
    """Whether a rank of the failed worker group stopped on a usage error (Ray Train wraps each worker's
    exception in a UserExceptionWithTraceback; its `_base_exc` is the worker's own)."""
    failures = getattr(error, "worker_failures", None) or {}
    return any(isinstance(getattr(f, "_base_exc", f), StopAllRanks) for f in failures.values())


class UsageStopPolicy(DefaultFailurePolicy):
    """Ray Train's default failure policy, except that a usage stop ends the run at once (no retry: the next
    attempt would fail the same way) and unlogged (the driver says it in one sentence)."""

    def make_decision(self, training_failed_error):
        if is_usage_stop(training_failed_error):
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


class UsageStopTrainer(DataParallelTrainer):
    """DataParallelTrainer (TorchTrainer's base: no torch on the driver) run with UsageStopPolicy. Ray Train 2.60
    has no public option for a failure policy; fit() builds the default one and hands it to the controller here."""

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        controller_init_kwargs["failure_policy"] = UsageStopPolicy(self.run_config.failure_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)
