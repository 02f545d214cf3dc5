"""Where the repository that holds the plugin is: the chart, the trainer's pins and the image sources beside it."""

from __future__ import annotations

from pathlib import Path

# plugin/gemma3_ray/utils/paths.py -> the repository root (the plugin runs from its checkout, or from the
# Helm plugin's link to it).
REPO_ROOT = Path(__file__).resolve().parents[3]
