"""The silenced library lines: exactly the known-irrelevant message, matched against the library's own text."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.worker import quiet_logs

ROOT = Path(__file__).resolve().parents[3]  # holds the trainer package


@pytest.mark.parametrize(("name", "prefix", "why"), quiet_logs.IRRELEVANT)
def test_the_message_is_the_librarys_own(name: str, prefix: str, why: str) -> None:
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)  # the installed pin's source, read without importing it
    assert spec is not None and spec.submodule_search_locations
    source = Path(spec.submodule_search_locations[0], *rest).with_suffix(".py")
    assert f'"{prefix}' in source.read_text() and why


def test_only_that_message_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    quiet_logs.install()
    quiet_logs.install()  # idempotent: one filter
    name, prefix, _ = quiet_logs.IRRELEVANT[0]
    logger = logging.getLogger(name)
    assert sum(isinstance(f, quiet_logs.DropMessage) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING):
        logger.warning(prefix + ": %s. Please make sure you already `pip install kernels`", "no network")
        logger.warning("Something else from bitsandbytes: %s", "kept")
    assert [r.getMessage() for r in caplog.records] == ["Something else from bitsandbytes: kept"]


@pytest.mark.slow
def test_progress_bars_are_off_unless_asked_for() -> None:
    """In a fresh process (both libraries read the variables at import): off by default, on when set."""
    code = ("from trainer.worker import quiet_logs; quiet_logs.install(); import transformers.utils.logging as tl; "
            "from datasets.utils import are_progress_bars_disabled as off; print(tl.is_progress_bar_enabled(), off())")
    env = {k: v for k, v in os.environ.items() if k not in quiet_logs.PROGRESS_BAR_ENV}
    env["PYTHONPATH"] = str(ROOT)
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert default.stdout.split() == ["False", "True"]
    env.update(HF_HUB_DISABLE_PROGRESS_BARS="0", HF_DATASETS_DISABLE_PROGRESS_BARS="0")
    asked = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert asked.stdout.split() == ["True", "False"]
