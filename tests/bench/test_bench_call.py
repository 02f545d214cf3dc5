"""bench/ as scenarios and expectations (issue #35 item 3): the scenario table is checked row by row, each call's
results are judged against it by bench/report.py, and one data-driven call runs a group."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import call, report, scenario_table

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT.parent / "shared" / "profiles" / "2026-12-02-b-h200" / "job-start-warm.txt"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "scenarios.toml"
    p.write_text(text)
    return p


GOOD = """
[[scenario]]
name = "default"
group = "headline"
run = "row"
recipe = "default"
budget_s = 100
metric = "samples_per_s"
expect = [15.0, 18.0]
source = "a call"
target = ">= 18.9"
issue = "#33"

[[scenario]]
name = "fv"
group = "workloads"
run = "workload"
recipe = "freeze_vision"
budget_s = 100
metric = "train_wall_s"
expect = [95.0, 115.0]
source = "another call"
target = "<= 75"
issue = "#33"

[[scenario]]
name = "kernels"
group = "headline"
run = "kernels"
budget_s = 100
"""


def test_the_repository_scenarios_load_and_every_range_names_its_source():
    rows = scenario_table.load()
    assert {"default", "unsloth", "plain_trl", "tutorial", "freeze_vision_3ep", "job_start"} <= {s.name for s in rows}
    assert all(s.source for s in rows if s.expect)
    headline = [s.name for s in scenario_table.group(rows, "headline")]
    assert headline.index("data") < headline.index("default") < headline.index("unsloth")


@pytest.mark.parametrize(("bad", "message"), [
    ('expect = [18.0, 15.0]\nsource = "x"', "low <= high"),
    ("expect = [15.0, 18.0]", "needs its `source`"),
    ('target = "about 19"\nissue = "#1"', "write '>= 18.9'"),
    ('target = ">= 19"', "needs the `issue`"),
    ('colour = "red"', "unknown field(s) colour"),
])
def test_a_bad_scenario_is_refused_in_one_sentence_naming_it(tmp_path, bad, message):
    text = f'[[scenario]]\nname = "x"\ngroup = "g"\nrun = "row"\nrecipe = "default"\nbudget_s = 10\nmetric = "m"\n{bad}\n'
    with pytest.raises(scenario_table.ScenarioError, match="scenario 'x'") as e:
        scenario_table.load(write(tmp_path, text))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_recipe_or_run_is_refused(tmp_path):
    with pytest.raises(scenario_table.ScenarioError, match="recipe 'fastest' is not one of bench.py's"):
        scenario_table.load(write(tmp_path, '[[scenario]]\nname = "x"\ngroup = "g"\nrun = "row"\nrecipe = "fastest"\nbudget_s = 1\n'))
    with pytest.raises(scenario_table.ScenarioError, match="use one of row, workload"):
        scenario_table.load(write(tmp_path, '[[scenario]]\nname = "x"\ngroup = "g"\nrun = "script"\nbudget_s = 1\n'))


def test_an_unknown_group_or_name_is_refused_with_the_known_ones(tmp_path):
    rows = scenario_table.load(write(tmp_path, GOOD))
    with pytest.raises(scenario_table.ScenarioError, match="the groups are headline, workloads"):
        scenario_table.group(rows, "all")
    with pytest.raises(scenario_table.ScenarioError, match="--only names nope"):
        scenario_table.group(rows, "headline", ["nope"])


def results(tmp_path: Path, rows: list[dict]) -> Path:
    p = tmp_path / "call.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_report_judges_each_result_against_its_range_and_target(tmp_path):
    scen = scenario_table.load(write(tmp_path, GOOD))
    path = results(tmp_path, [
        {"scenario": "default", "name": "default", "ok": True, "samples_per_s": 14.2},
        {"scenario": "fv", "name": "fv", "ok": True, "workload": {"train_wall_s": 80.0}},
        {"scenario": "kernels", "kind": "kernel_check", "check": "siglip_attention", "kernel": "fa4", "ok": False,
         "error": "ImportError: no flash_attn"},
    ])
    verdicts = {v["scenario"]: v for v in report.check(path, scen)}
    assert verdicts["default"]["status"] == "below the expected range"
    assert verdicts["default"]["target_status"].startswith("missed by 4.70 (25%)")
    assert verdicts["fv"]["status"] == "below the expected range"  # faster than expected is out of range too
    assert verdicts["fv"]["target_status"].startswith("missed by 5.00")
    assert verdicts["kernels"]["status"].startswith("failed: siglip_attention/fa4: ImportError")
    assert report.print_check(path, scen) is False


def test_report_passes_a_call_in_range_and_says_a_met_target(tmp_path, capsys):
    scen = scenario_table.load(write(tmp_path, GOOD))
    path = results(tmp_path, [{"scenario": "default", "name": "default", "ok": True, "samples_per_s": 17.0,
                               "flags": {"per_device_train_batch_size": 16, "global_batch_size": 64}}])
    assert report.print_check(path, scen) is True
    out = capsys.readouterr().out
    assert "[check] default: 17 expected 15–18: in range; target >= 18.9: missed by 1.90" in out


def test_a_failed_row_fails_the_check(tmp_path):
    scen = scenario_table.load(write(tmp_path, GOOD))
    path = results(tmp_path, [{"scenario": "default", "name": "default", "ok": False, "error": "CUDA out of memory"}])
    (v,) = report.check(path, scen)
    assert v["status"] == "failed: CUDA out of memory"
    assert report.print_check(path, scen) is False


def test_headline_names_every_ratio_from_one_call():
    rows = {n: {"name": n, "ok": True, "samples_per_s": v, "versions": {"unsloth": "2026.10.9"}}
            for n, v in (("tutorial", 0.8), ("plain_trl", 8.0), ("unsloth", 12.0), ("default", 18.0))}
    (line,) = report.headline(rows, "bench/results/x.jsonl")
    assert line == ("default: 18.00 samples/s, 22.5× the tutorial recipe, 2.25× plain TRL, 1.50× Unsloth 2026.10.9 "
                    "(12.00), one call: `bench/results/x.jsonl`")


def test_tag_names_the_scenario_and_a_silent_scenario_gets_a_failed_line(tmp_path):
    scen = scenario_table.load(write(tmp_path, GOOD))[0]
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"name": "old", "ok": True}) + "\n")
    call.tag(path, 1, scen, "c1", 124, 100.0, {"speed_path": "d"})
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0] == {"name": "old", "ok": True}
    assert lines[1]["scenario"] == "default" and lines[1]["call"] == "c1" and lines[1]["ok"] is False
    assert "rc 124" in lines[1]["error"] and lines[1]["speed_path"] == "d"  # what it measured (issue #45)


@pytest.mark.skipif(not PROFILE.exists(), reason="the shared profile is not beside this checkout")
def test_job_start_split_is_read_from_the_jobs_own_log():
    res = call.job_start_result("noise\n" + PROFILE.read_text())
    assert res["ok"] and res["job_start_s"] == 79.6
    assert res["split"]["first optimizer step (incl. first batch)"] == 15.0
    assert res["split"]["of which: Ray start, placement, worker spawn"] == 21.3
    assert call.job_start_result("no such line")["ok"] is False


def plan(group: str) -> subprocess.CompletedProcess:
    """`python3 -m bench.call GROUP --plan` as the GPU machine runs it: from the repository root, with the standard
    library only (-S: no site-packages, as a bare python3 before the carried bundle is unpacked)."""
    return subprocess.run([sys.executable, "-S", "-m", "bench.call", group, "--plan"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_plan_prints_each_command_without_a_gpu():
    proc = plan("headline")
    assert proc.returncode == 0, proc.stderr
    assert "unsloth (330s):" in proc.stdout and "-m bench.unsloth_row" in proc.stdout
    assert "-m bench.bench run --recipe default --name default" in proc.stdout
    bad = plan("everything")
    assert bad.returncode != 0 and "bench: group 'everything' is not in scenarios.toml" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_every_module_a_plan_runs_is_a_module_of_the_checkout():
    """Each `-m MODULE` and each script a call would run exists where the command names it (a moved module fails
    here, not on the GPU machine)."""
    named = set()
    for group in sorted({s.group for s in scenario_table.load()}):
        proc = plan(group)
        assert proc.returncode == 0, proc.stderr
        named |= set(re.findall(r" -m ([\w.]+)", proc.stdout))
        named |= {f"./{path}" for path in re.findall(r"bash (bench/\S+\.sh)", proc.stdout)}
    assert {"bench.bench", "bench.unsloth_row", "bench.kernels.attention_check", "./bench/e2e_ray.sh"} <= named
    missing = [m for m in sorted(named) if not (ROOT / (m[2:] if m.startswith("./") else m.replace(".", "/") + ".py")).is_file()]
    assert missing == []


@pytest.mark.skipif(not PROFILE.exists(), reason="the shared profile is not beside this checkout")
def test_job_start_split_is_read_through_rays_worker_prefix():
    """Issue #45 item 4: in the job's log Ray prefixes each worker line ("(RayTrainWorker pid=812) "), which left
    the results' split empty."""
    prefixed = "".join(f"(RayTrainWorker pid=812, ip=10.0.0.3) {line}\n" for line in PROFILE.read_text().splitlines())
    res = call.job_start_result("noise\n" + prefixed)
    assert res["ok"] and res["job_start_s"] == 79.6
    assert res["split"]["first optimizer step (incl. first batch)"] == 15.0
    assert len(res["split"]) >= 8


def test_job_start_split_is_read_from_a_real_ray_job_log():
    """The lines as a GPU call's Ray job printed them (bench/results/2026-12-04-1912-workloads.jsonl's job_start, whose
    split came back empty): Ray's prefix in colour before each worker line."""
    log = (Path(__file__).parent / "data" / "job-start-ray-prefixed.log").read_text()
    assert "\x1b[36m(RayTrainWorker" in log
    res = call.job_start_result(log)
    assert res["ok"] and res["job_start_s"] == 72.5
    assert res["split"]["first optimizer step (incl. first batch)"] == 15.0
    assert res["split"]["of which: Ray start, placement, worker spawn"] == 24.4
