"""`python -m gemma3_ray` (what the Helm plugin's launcher runs)."""

import sys

from gemma3_ray.cli import main

sys.exit(main())
