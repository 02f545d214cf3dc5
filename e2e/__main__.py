"""`make e2e` (`python -m e2e`): the runner's command line, e2e/runner/cli.py."""

import sys

from e2e.runner.cli import main

if __name__ == "__main__":
    sys.exit(main())
