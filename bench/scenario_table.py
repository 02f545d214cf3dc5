"""The scenario table: bench/scenarios.toml read into `Scenario` rows, each row checked, and a call's group chosen.

A bad row is refused in one sentence naming the scenario and the field (`ScenarioError`); bench/call.py runs
the rows, bench/report.py judges a call's results against them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "bench" / "scenarios.toml"
RUNS = ("row", "workload", "unsloth", "kernels", "job_start", "data")
TARGET_RE = re.compile(r"^(>=|<=)\s*([0-9.]+)$")


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class Scenario:
    name: str
    group: str
    run: str
    budget_s: int
    recipe: str = ""
    options: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    metric: str = ""
    expect: tuple[float, float] | None = None
    source: str = ""
    target: str = ""
    issue: str = ""
    fa4: bool = False  # FlashAttention 4's site on the path (carried): never for a row of what the image ships
    extra: dict[str, Any] = field(default_factory=dict)

    def target_parts(self) -> tuple[str, float] | None:
        if not self.target:
            return None
        m = TARGET_RE.match(self.target.strip())
        assert m is not None
        return m.group(1), float(m.group(2))


def load(path: Path = SCENARIOS) -> list[Scenario]:
    """Every scenario, checked: a bad row is refused in one sentence naming the scenario and the field."""
    data = tomllib.loads(path.read_text())
    out: list[Scenario] = []
    names: set[str] = set()
    known = {"name", "group", "run", "budget_s", "recipe", "options", "flags", "metric", "expect", "source",
             "target", "issue", "fa4"}
    for i, row in enumerate(data.get("scenario", [])):
        name = row.get("name") or f"#{i + 1}"
        where = f"{path.name}: scenario {name!r}"
        unknown = sorted(set(row) - known)
        if unknown:
            raise ScenarioError(f"{where}: unknown field(s) {', '.join(unknown)}; the fields are {', '.join(sorted(known))}")
        for req in ("name", "group", "run", "budget_s"):
            if req not in row:
                raise ScenarioError(f"{where}: `{req}` is missing")
        if name in names:
            raise ScenarioError(f"{where}: the name is used twice; give each scenario its own")
        names.add(name)
        if row["run"] not in RUNS:
            raise ScenarioError(f"{where}: run = {row['run']!r}; use one of {', '.join(RUNS)}")
        if row["run"] in ("row", "workload") and not row.get("recipe"):
            raise ScenarioError(f"{where}: run = {row['run']!r} needs a `recipe` (a bench.py recipe)")
        expect = row.get("expect")
        if expect is not None:
            if not (isinstance(expect, list) and len(expect) == 2 and all(isinstance(v, int | float) for v in expect)
                    and expect[0] <= expect[1]):
                raise ScenarioError(f"{where}: expect = {expect!r}; write [low, high] with low <= high")
            if not row.get("source"):
                raise ScenarioError(f"{where}: an expected range needs its `source` (the measurement it comes from)")
            if not row.get("metric"):
                raise ScenarioError(f"{where}: an expected range needs the `metric` it applies to")
        if row.get("target") and not TARGET_RE.match(str(row["target"]).strip()):
            raise ScenarioError(f"{where}: target = {row['target']!r}; write '>= 18.9' or '<= 75'")
        if row.get("target") and not row.get("issue"):
            raise ScenarioError(f"{where}: a target needs the `issue` it comes from")
        out.append(Scenario(
            name=name, group=row["group"], run=row["run"], budget_s=int(row["budget_s"]),
            recipe=row.get("recipe", ""), options=tuple(str(o) for o in row.get("options", [])),
            flags=tuple(str(f) for f in row.get("flags", [])), metric=row.get("metric", ""),
            expect=(float(expect[0]), float(expect[1])) if expect else None, source=row.get("source", ""),
            target=str(row.get("target", "")), issue=row.get("issue", ""), fa4=bool(row.get("fa4", False))))
    if not out:
        raise ScenarioError(f"{path.name}: no [[scenario]] rows")
    if SCENARIOS_RECIPES_CHECK:
        recipes = bench_recipes()
        for s in out:
            if s.recipe and s.recipe not in recipes:
                raise ScenarioError(f"{path.name}: scenario {s.name!r}: recipe {s.recipe!r} is not one of bench.py's "
                                    f"({', '.join(sorted(recipes))})")
    return out


SCENARIOS_RECIPES_CHECK = True


def bench_recipes() -> set[str]:
    """bench.py's RECIPES keys, read from its source (importing it would need the trainer's packages)."""
    import ast

    tree = ast.parse((ROOT / "bench" / "bench.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "RECIPES" for t in targets) and isinstance(node.value, ast.Dict):
                return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise ScenarioError("bench/bench.py has no RECIPES table")


def group(scenarios: list[Scenario], name: str, only: list[str] | None = None) -> list[Scenario]:
    groups = sorted({s.group for s in scenarios})
    if name not in groups:
        raise ScenarioError(f"group {name!r} is not in {SCENARIOS.name}; the groups are {', '.join(groups)}")
    chosen = [s for s in scenarios if s.group == name]
    if only:
        missing = sorted(set(only) - {s.name for s in chosen})
        if missing:
            raise ScenarioError(f"--only names {', '.join(missing)}, not in group {name!r} "
                                f"({', '.join(s.name for s in chosen)})")
        chosen = [s for s in chosen if s.name in only]
    return chosen
