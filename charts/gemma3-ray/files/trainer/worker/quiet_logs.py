"""Known-irrelevant library output: log lines dropped at their logger by exact message, progress bars off.

Standard library only. Each entry names the logger, the message's fixed start, and why it is irrelevant;
`install()` runs before the library is imported (the filter sits on the logger object the library's
``logging.getLogger(__name__)`` later returns).
"""

from __future__ import annotations

import logging
import os

# (logger name, start of the message template, why it does not matter)
IRRELEVANT: tuple[tuple[str, str, str], ...] = (
    (
        "bitsandbytes.backends.cpu.ops",
        "Failed to load CPU gemm_4bit_forward from kernels-community",
        "bitsandbytes probes an optional Hub kernel for 4-bit matmuls on CPU at import; the trainer never runs "
        "4-bit on CPU (quantization=4bit needs GPUs) and the pods have no Hub access for kernels",
    ),
)


# Progress bars (tqdm, redrawn with carriage returns) in a job's log are one line per redraw: the Hub's
# (which transformers' "Loading weights" follows) and datasets'. Set as defaults: an explicit value wins.
PROGRESS_BAR_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


class DropMessage(logging.Filter):
    """Drops records whose message template starts with `prefix`."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def install() -> None:
    """Add the filters and the progress-bar defaults (idempotent); before transformers/datasets are imported."""
    for name, value in PROGRESS_BAR_ENV.items():
        os.environ.setdefault(name, value)
    for name, prefix, _why in IRRELEVANT:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessage) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(DropMessage(prefix))
