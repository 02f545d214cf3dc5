"""An unexpected error: one sentence that says it is a bug, the traceback in a log file.

A programming error in the plugin: said to be a bug, its traceback written to a log file (the user
sends that file; the terminal gets one sentence, never the traceback)."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

from gemma3_ray import __version__
from gemma3_ray.utils import names, tokens


def log_dir() -> Path:
    """$XDG_STATE_HOME/gemma3-ray (default ~/.local/state/gemma3-ray)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / names.PRODUCT


def write(exc: BaseException, argv: list[str]) -> Path:
    """The traceback and the command (token-shaped values scrubbed) in a new log file; its path."""
    text = (f"{names.PRODUCT} {__version__}\ncommand: {tokens.scrub(' '.join(argv))}\n\n"
            + tokens.scrub("".join(traceback.format_exception(exc))))
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for folder in (log_dir(), Path(tempfile.gettempdir()) / names.PRODUCT):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    raise OSError("no writable folder for the crash log")


def sentence(exc: BaseException, path: Path | None) -> str:
    where = f"the traceback is in {path}" if path else "the traceback could not be written to a file"
    return (f"internal error ({type(exc).__name__}): this is a bug, please report it to the {names.PRODUCT} "
            f"maintainers with the log file ({where}).")
