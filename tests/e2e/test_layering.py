"""The e2e package's own layers (the house-wide rules — each folder's "May import", no cycle — are
tests/test_layering.py's, read by the one import reader of tests/layering.py): the runner walks the stages, the
stages use the support, the local cluster and the builds import nothing of e2e, and ``e2e/__main__.py`` hands
over to the runner alone."""

from __future__ import annotations

from pathlib import Path

from tests.layering import Package

ROOT = Path(__file__).resolve().parents[2]
E2E = Package(ROOT / "e2e", "e2e")
LAYERS = {"runner": {"stages", "support", "cluster", "build"}, "stages": {"support", "cluster", "build"},
          "support": {"cluster", "build"}, "cluster": set(), "build": set()}


def test_the_folders_are_the_rooms_and_their_rules_go_one_way() -> None:
    assert set(E2E.folders()) == set(LAYERS)
    for folder, allowed in E2E.may_import().items():
        assert allowed <= LAYERS[folder], f"e2e/{folder}/ may import {sorted(allowed - LAYERS[folder])}: up a layer"


def test_main_hands_over_to_the_runner_alone() -> None:
    deps = E2E.graph()["__main__"]
    assert deps and {E2E.folder_of(d) for d in deps} == {"runner"}, deps


def test_a_planted_upward_import_is_reported() -> None:
    g = {**E2E.graph(), "support.kube": {"runner.cli"}}
    assert any("support.kube imports e2e.runner.cli" in v for v in E2E.layer_violations(g, E2E.may_import()))
