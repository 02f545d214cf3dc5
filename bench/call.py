"""One GPU call of the bench: the scenarios of a group (bench/scenarios.toml), each within its budget and what
is left of the call, into one results file; raw logs beside it, never in the tree (issue #35 item 3).

    python3 -m bench.call GROUP [--out DIR] [--budget 580] [--only NAME,...]   # on the GPU machine
    python3 -m bench.call GROUP --plan                                         # here: what would run

On the GPU machine it first unpacks what the device tool carried (`BENCH_CARRY`, default the repository root):
`.whl/site.tar.xz` (the Ray/TRL bundle, ../shared/device/make-bundle.sh), `.bench/assets.tar.xz`
(`bench.py prepare`, packed), and when present `.bench/unsloth-site.tar.xz` (Unsloth's wheels, for the
`unsloth` scenario only) and FlashAttention 4 (`.bench/fa4site.tar.xz`, or a copy an earlier call of the same
warm machine left in /tmp/fa4site). Results: DIR/results.jsonl (one line per scenario, `scenario` and `call`
set); logs: DIR/logs/<scenario>.log; the table and the expectation check print last (bench/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import report, speed_path
from bench.scenario_table import Scenario, ScenarioError, group, load

ROOT = Path(__file__).resolve().parents[1]
SITE, UNSLOTH_SITE, FA4_SITE = Path("/tmp/site"), Path("/tmp/unsloth-site"), Path("/tmp/fa4site")



def command(s: Scenario, results: Path, work: Path) -> list[str]:
    """The command line of one scenario (run from the repository root)."""
    py = sys.executable or "python3"
    if s.run in ("row", "workload"):
        return [py, "-m", "bench.bench", "run", "--recipe", s.recipe, "--name", s.name, "--out", str(results),
                *s.options, *(["--", *s.flags] if s.flags else [])]
    if s.run == "data":
        return [py, "-m", "bench.bench", "data", *s.options]
    if s.run == "unsloth":
        return [py, "-m", "bench.unsloth_row", "--name", s.name, "--out", str(results), *s.options]
    if s.run == "kernels":
        return [py, "-m", "bench.kernels.attention_check", "--out", str(results), *s.options]
    # job_start: the Ray Train job on one GPU, node caches wiped first (and the storage too with --cold)
    cold = "--cold" in s.options
    wipe = ["~/.triton", "~/.cache/huggingface/compile-cache", "/tmp/torchinductor_$(id -un)"]
    if cold:
        wipe.append("/tmp/e2e-1")
    flags = ["--per_device_train_batch_size=16", "--global_batch_size=64", "--sample_rows=0", *s.flags]
    return ["bash", "-c", f"rm -rf {' '.join(wipe)}; E2E_ROWS=700 E2E_STEPS=3 bash bench/e2e_ray.sh 1 "
            + " ".join(shlex.quote(f) for f in flags)]


JOB_START_RE = re.compile(r"gemma3-ray job start: ([0-9.]+) s from submission")
SPLIT_RE = re.compile(r"^\s{2,}(\S.*?)\s{2,}(-?[0-9.]+) s")
# Ray's prefix on a worker's or the driver's lines: "(RayTrainWorker pid=812) ", "(TrainController pid=9, ip=…) "
RAY_PREFIX_RE = re.compile(r"^\([A-Za-z_][\w.]* pid=\d+[^)]*\) ?")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its prefixes


def job_start_result(log: str) -> dict[str, Any]:
    """The job start split the job printed at its first optimizer step."""
    log = ANSI_RE.sub("", log)
    m = JOB_START_RE.search(log)
    if not m:
        return {"ok": False, "error": "no 'gemma3-ray job start' line in the job's log"}
    split: dict[str, float] = {}
    for line in log[m.end():].splitlines()[1:12]:
        sm = SPLIT_RE.match(RAY_PREFIX_RE.sub("", line))
        if not sm:
            break
        split[sm.group(1).strip()] = float(sm.group(2))
    return {"ok": True, "job_start_s": float(m.group(1)), "split": split}


def unpack(carry: Path, log) -> dict[str, Any]:
    """The carried bundles unpacked once per machine; what is there is reported."""
    have: dict[str, Any] = {}

    def untar(archive: Path, dest: Path, marker: str) -> bool:
        if (dest / marker).exists():
            return True
        if not archive.exists():
            return False
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        subprocess.run(["tar", "xJf", str(archive), "-C", str(dest)], check=True)
        return True

    have["site"] = untar(carry / ".whl" / "site.tar.xz", SITE, "ray")
    assets = ROOT / ".bench" / "assets"
    if not assets.exists() and (carry / ".bench" / "assets.tar.xz").exists():
        assets.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "xJf", str(carry / ".bench" / "assets.tar.xz"), "-C", str(assets.parent)], check=True)
    have["assets"] = assets.exists()
    have["unsloth"] = untar(carry / ".bench" / "unsloth-site.tar.xz", UNSLOTH_SITE, "unsloth")
    have["fa4"] = untar(carry / ".bench" / "fa4site.tar.xz", FA4_SITE, "flash_attn")
    print(f"[bench] carried: {have}", file=log, flush=True)
    return have


def environment(have: dict[str, Any], unsloth: bool = False, fa4: bool = False) -> dict[str, str]:
    """The scenario's environment: FlashAttention 4 only for a row that asks for it (`fa4 = true`): the training
    image (images/trainer) has none, so a row of the shipped default never finds it, carried or not."""
    env = dict(os.environ)
    paths = [str(ROOT)]
    if unsloth and have.get("unsloth"):
        paths.append(str(UNSLOTH_SITE))  # before the bundle: its TRL is the one Unsloth supports
    if fa4 and have.get("fa4") and not unsloth:
        paths += [str(FA4_SITE), str(FA4_SITE / "nvidia_cutlass_dsl" / "dsl_packages")]
    if have.get("site"):
        paths.append(str(SITE))
        env["PATH"] = f"{SITE / 'bin'}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = ":".join(paths + [p for p in env.get("PYTHONPATH", "").split(":") if p])
    env.update(RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               RAY_TRAIN_ENABLE_PRINT_PATCH="0", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="1")
    return env


def run_group(scenarios: list[Scenario], out: Path, budget: int, call_id: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    results = out / "results.jsonl"
    work = Path(os.environ.get("BENCH_WORK", "/tmp/gemma3-bench"))
    t0 = time.time()
    source = {**speed_path.stamp(), "commit": os.environ.get("BENCH_COMMIT", "")}  # what every line measured
    with open(logs / "call.log", "a") as log:
        have = unpack(Path(os.environ.get("BENCH_CARRY", ROOT)), log)
        for s in scenarios:
            left = budget - int(time.time() - t0)
            limit = min(s.budget_s, left)
            line = {"scenario": s.name, "call": call_id, "run": s.run, "name": s.name, **source}
            if s.fa4 and not have.get("fa4"):
                append(results, {**line, "ok": False, "error": "FlashAttention 4's site was not carried "
                                 "(.bench/fa4site.tar.xz): this row needs it"})
                continue
            if limit < 30:
                print(f"[bench] skip {s.name}: {left}s left of the call", flush=True)
                append(results, {**line, "ok": False, "error": f"skipped: {left}s left of the call's {budget}s"})
                continue
            before = count(results)
            cmd = command(s, results, work)
            print(f"[bench +{int(time.time() - t0)}s] {s.name} (budget {limit}s): {' '.join(cmd)}", flush=True)
            start = time.time()
            with open(logs / f"{s.name}.log", "w") as fh:
                try:
                    rc = subprocess.run(cmd, cwd=ROOT, env=environment(have, s.run == "unsloth", s.fa4), stdout=fh,
                                        stderr=subprocess.STDOUT, timeout=limit).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            took = round(time.time() - start, 1)
            print(f"[bench +{int(time.time() - t0)}s] {s.name}: rc {rc} in {took}s", flush=True)
            if s.run == "job_start":
                append(results, {**line, **job_start_result((logs / f"{s.name}.log").read_text(errors="replace")),
                                 "rc": rc, "wall_s": took})
            elif s.run == "data":
                append(results, {**line, "ok": rc == 0, "rc": rc, "wall_s": took})
            else:
                tag(results, before, s, call_id, rc, took, source)
    return results


def count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def append(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row, default=str) + "\n")


def tag(path: Path, before: int, s: Scenario, call_id: str, rc: int, took: float, source: dict[str, Any]) -> None:
    """Name the scenario and the call on the lines it wrote; a scenario that wrote none gets a failed line."""
    lines = path.read_text().splitlines() if path.exists() else []
    new = [json.loads(x) for x in lines[before:] if x.strip()]
    if not new:
        new = [{"name": s.name, "ok": False, "error": f"wrote no result (rc {rc}, {took}s; see logs/{s.name}.log)"}]
    for row in new:
        row.update(scenario=s.name, call=call_id, run=s.run, **source)
        row.setdefault("wall_s", took)
    path.write_text("".join(x + "\n" for x in lines[:before]) + "".join(json.dumps(r, default=str) + "\n" for r in new))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("group")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/bench-out")))
    parser.add_argument("--budget", type=int, default=int(os.environ.get("CALL_BUDGET", "580")),
                        help="seconds the whole call may take (the device allows 600 a command)")
    parser.add_argument("--only", default="", help="comma-separated scenario names of the group")
    parser.add_argument("--call", default=time.strftime("%Y-%m-%d-%H%M", time.gmtime()), help="this call's id")
    parser.add_argument("--plan", action="store_true", help="print the commands, run nothing")
    a = parser.parse_args()
    try:
        chosen = group(load(), a.group, [x for x in a.only.split(",") if x] or None)
    except ScenarioError as e:
        raise SystemExit(f"bench: {e}") from None
    if a.plan:
        for s in chosen:
            print(f"{s.name} ({s.budget_s}s): {shlex.join(command(s, a.out / 'results.jsonl', Path('/tmp/gemma3-bench')))}")
        return
    results = run_group(chosen, a.out, a.budget, a.call)
    report.print_check(results)


if __name__ == "__main__":
    main()
