"""The commands beyond `values`: prereqs, doctor, up, status, logs, down."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def register(sub: argparse._SubParsersAction, add_common: Callable[[argparse.ArgumentParser], None]) -> None:  # type: ignore[type-arg]
    del sub, add_common
