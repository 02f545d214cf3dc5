"""Command-line entry point (`gemma3-ray`, also `helm gemma3-ray`)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gemma3-ray")
    parser.parse_args(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
