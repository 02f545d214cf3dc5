"""Bad values are rejected by `helm template` (Helm 4 and Helm 3) with a message naming the field."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CI_VALUES_DIR, Render, helm_template

CASES_FILE = Path(__file__).parent / "bad-values" / "cases.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CASES_FILE.read_text())
MIN_CASES = 15
PARALLEL_HELM = 4


@pytest.fixture(scope="module")
def rejected(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Render]:
    tmp = tmp_path_factory.mktemp("bad-values")
    jobs = []
    for case in CASES:
        path = tmp / f"{case['name']}.yaml"
        path.write_text(yaml.safe_dump(case["values"]))
        jobs += [(case["name"], helm, path) for helm in ("HELM", "HELM3")]
    with ThreadPoolExecutor(PARALLEL_HELM) as pool:
        results = list(pool.map(lambda j: helm_template([CI_VALUES_DIR / "default-values.yaml", j[2]], helm=j[1]), jobs))
    return {(name, helm): r for (name, helm, _), r in zip(jobs, results, strict=True)}


def test_enough_distinct_cases() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) >= MIN_CASES and len(set(names)) == len(names)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
def test_bad_values_are_rejected_naming_the_field(rejected: dict[tuple[str, str], Render], case: dict[str, Any], helm: str) -> None:
    r = rejected[(case["name"], helm)]
    assert r.returncode != 0, f"{case['name']} rendered without error"
    err = r.stderr
    field = case["field"]
    assert field in err or "/" + field.replace(".", "/") in err, err
    if "message" in case:
        assert case["message"] in err, err
