"""Names the plugin derives for objects the chart makes are the names the chart renders."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from gemma3_ray.utils import names

from tests.plugin.test_values import CHART, HELMS

# Release names around the chart's 40-character full name: short, containing the chart's name (used as is),
# a full name of exactly 40 and of 41, two sharing their first 40 characters, a cut that ends in '-' (at 40,
# where the old truncation cut, and at 34, where the hashed form cuts), and the longest release Helm takes.
RELEASES = [
    "r1",
    "gemma3-ray",
    "team-a-gemma3-ray-nightly",
    "a" * 29,                                   # a-...-gemma3-ray: 40
    "a" * 30,                                   # 41
    "gemma3-ray-experiment-long-name-run-0001",  # these two share their first 40 characters
    "gemma3-ray-experiment-long-name-run-0002",
    "b" * 39 + "-cd",                           # the 40th character is '-'
    "c" * 33 + "-d",                            # the 34th character is '-'
    "e" * 32 + "--f",                           # the 33rd and 34th are '-'
    "x" * 53,
]


def rendered_service_account(helm: str, release: str) -> str:
    out = subprocess.run([helm, "template", release, str(CHART), "-n", "ml", "--set-string", "storage.bucket=acme-bucket",
                          "--show-only", "templates/serviceaccount.yaml"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["metadata"]["name"]


@pytest.mark.parametrize("major", list(HELMS))
def test_chart_fullname_is_the_name_the_chart_renders(major: str) -> None:
    rendered = {release: rendered_service_account(HELMS[major], release) for release in RELEASES}
    assert {release: names.chart_fullname(release) for release in RELEASES} == rendered
    assert len(set(rendered.values())) == len(RELEASES)  # no two releases share a ServiceAccount
    assert all(len(name) <= names.CHART_FULLNAME_MAX for name in rendered.values())
