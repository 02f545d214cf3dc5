"""Libraries a run does not use, kept out of the worker process.

peft imports bitsandbytes whenever it is installed (``peft.helpers``, at ``import peft``, which
``transformers.trainer_utils`` does), and bitsandbytes imports ``torch._inductor``: 1.4 s of an idle
worker's start, 2.5-3 s on a loaded node (measured with ``python -X importtime``), paid by every Ray Train
worker of every attempt. Only ``--quantization=4bit`` uses it.

A ``None`` entry in ``sys.modules`` is Python's own "not importable" mark: ``importlib.util.find_spec``
answers None (peft's ``is_bnb_available()`` and transformers' ``is_bitsandbytes_available()`` then say
False, the answer they give on a machine without the package) and ``import bitsandbytes`` raises
ImportError. Standard library only: runs before transformers, peft and TRL are imported.
"""

from __future__ import annotations

import sys

QUANTIZED = "4bit"  # the one --quantization value that loads the model through bitsandbytes
# (module, the flag value that needs it)
ONLY_FOR: tuple[tuple[str, str], ...] = (("bitsandbytes", QUANTIZED),)


def leave_out(quantization: str) -> list[str]:
    """Mark the libraries this run's `--quantization` does not need as not importable; return their names.

    A library already imported in this process is left alone (something here uses it)."""
    left_out = []
    for module, needed_for in ONLY_FOR:
        if quantization != needed_for and module not in sys.modules:
            sys.modules[module] = None  # type: ignore[assignment]
            left_out.append(module)
    return left_out
