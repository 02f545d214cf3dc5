"""`make demo`'s path, shortened: the chart's own RayJob on a private local Ray head.

The end-to-end test runs ``python -m demo`` exactly as ``make demo`` does (real helm, real Ray head on
127.0.0.1, real fake-gcs-server, the trainer bytes from the rendered ConfigMap) with fewer steps, then
checks what a user would look at: the summary's numbers, the checkpoints and adapter on disk, the loss
PNG, and that the files and command the job ran are the chart's.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from demo import __main__ as demo_main
from e2e.support.proc import run_child
from localkit.chart_job import as_kuberay_submits, local_entrypoint, parse_chart_job

ROOT = Path(__file__).resolve().parents[2]
HELM = os.environ.get("HELM") or str(ROOT / ".tools" / "bin" / "helm")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A loss curve with axes, two series and a legend is tens of KiB; an empty canvas is a few.
MIN_PNG_BYTES = 10_000
# The short run: 6 steps with an eval every 2 (three evals) and a checkpoint every 3, on 40 rows
# (36 train, 4 eval: the evals stay short). (It was 12 steps on 80 rows; every claim below holds on 6:
# the losses fall from the first step and eval on, three evals, two checkpoints.)
SHORT_STEPS = 6
EVAL_EVERY = 2
# The 4 eval rows get sample generations (base and fine-tuned) for samples.jsonl and report.html.
SHORT_SAMPLE_ROWS = 4
SHORT_SETS = [f"training.eval_steps={EVAL_EVERY}", f"training.save_steps={SHORT_STEPS // 2}",
              "training.logging_steps=1", f"training.sample_rows={SHORT_SAMPLE_ROWS}"]
SHORT_ROWS = 40
DEMO_TIMEOUT_S = 420


def _demo_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in demo_main.USER_CLUSTER_ENV:
        env.pop(name, None)  # the demo must start its own head
    env["PATH"] = f"{ROOT / '.tools' / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.setdefault("HELM", HELM)
    return env


def _run_demo(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "demo", f"--output-dir={out}", *extra]
    # A stop of the test run reaches the demo, which stops its Ray head (e2e.support.proc.run_child; subprocess.run
    # would SIGKILL it 0.25 s after the interrupt).
    return run_child(cmd, cwd=ROOT, env=_demo_env(), timeout=DEMO_TIMEOUT_S)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("demo")
    proc = _run_demo(out, f"--max_steps={SHORT_STEPS}", f"--rows={SHORT_ROWS}", *(f"--set={s}" for s in SHORT_SETS))
    assert proc.returncode == 0, f"demo failed\nSTDOUT tail:\n{proc.stdout[-4000:]}\nSTDERR tail:\n{proc.stderr[-4000:]}"
    (run_dir,) = [p for p in out.glob("run-*") if p.is_dir()]
    result = json.loads((run_dir / demo_main.RESULT_FILE).read_text())
    result["stdout"], result["stderr"] = proc.stdout, proc.stderr
    return result


@pytest.mark.slow
def test_summary_numbers(short_run: dict) -> None:
    s = short_run["summary"]
    assert short_run["job"]["status"] == "SUCCEEDED"
    assert s["global_step"] == SHORT_STEPS
    assert s["num_workers"] == 2  # workers.replicas of values/local.yaml, derived by the chart
    losses = [s["first_train_loss"], s["final_train_loss"], s["first_eval_loss"], s["final_eval_loss"]]
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in losses), losses
    assert s["final_train_loss"] < s["first_train_loss"]
    assert s["final_eval_loss"] < s["first_eval_loss"]
    assert s["samples_per_second"] > 0
    # The closing report prints those numbers.
    assert f"{s['first_eval_loss']:.4f} -> {s['final_eval_loss']:.4f}" in short_run["stdout"]
    assert "job wall time" in short_run["stdout"]
    assert f"fresh run {short_run['run_name']}" in short_run["stdout"]  # a demo run is always a new run


@pytest.mark.slow
def test_checkpoints_and_adapter_on_disk(short_run: dict) -> None:
    storage = Path(short_run["run_storage_dir"])  # <storage_path>/runs/<run_name> on disk
    assert storage.parent == Path(short_run["storage_dir"]) / "runs"
    s = short_run["summary"]
    assert s["run_name"] == short_run["run_name"] and s["completed"] is True
    assert s["final_adapter"] == short_run["run_uri"] + "/final"
    assert s["newest_checkpoint"].endswith(f"checkpoint-{SHORT_STEPS:06d}")
    newest = storage / s["newest_checkpoint"].removeprefix(short_run["run_uri"] + "/")
    for folder in (newest, storage / "final"):
        assert json.loads((folder / "adapter_config.json").read_text())["peft_type"] == "LORA", folder
        assert (folder / "adapter_model.safetensors").stat().st_size > 0, folder
    assert (newest / "trainer_state.json").is_file()
    records = [json.loads(ln) for ln in (storage / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("kind") == "eval"] == [2, 4, 6] == list(
        range(EVAL_EVERY, SHORT_STEPS + 1, EVAL_EVERY))


@pytest.mark.slow
def test_loss_png_is_a_real_image(short_run: dict) -> None:
    from PIL import Image

    png = Path(short_run["loss_png"])
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert png.stat().st_size > MIN_PNG_BYTES
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width > 400 and img.height > 300


@pytest.mark.slow
def test_job_ran_the_charts_files_and_entrypoint(short_run: dict) -> None:
    """The files the job ran are byte-for-byte the rendered ConfigMap's; its command is the RayJob's."""
    from ray._private.runtime_env.packaging import get_uri_for_directory

    rendered = (Path(short_run["run_dir"]) / "rendered.yaml").read_text()
    job = parse_chart_job(rendered)
    trainer_dir = Path(short_run["trainer_dir"])
    assert sorted(p.name for p in trainer_dir.iterdir() if not p.name.startswith("..")) == ["trainer"]
    assert (trainer_dir / "..data").is_symlink(), "the demo writes the kubelet's ConfigMap volume layout"
    assert (trainer_dir / "trainer").is_symlink() and (trainer_dir / "trainer" / "job" / "flags.py").is_file()
    for name, text in job.files.items():
        assert (trainer_dir / job.items[name]).read_bytes() == text.encode(), name
    # Ray packaged exactly the ConfigMap's files, once each, at their item paths: its content hash equals
    # that of a plain directory holding only them.
    plain = Path(short_run["run_dir"]) / "plain-trainer"
    for name, text in job.files.items():
        (plain / job.items[name]).parent.mkdir(parents=True, exist_ok=True)
        (plain / job.items[name]).write_bytes(text.encode())
    assert short_run["job_working_dir_uri"] == get_uri_for_directory(str(plain), include_gitignore=True)
    # The command: the rendered entry point, as KubeRay's submitter passes it, with --installer=none.
    assert short_run["rendered_entrypoint"] == job.entrypoint
    assert short_run["submitted_entrypoint"] == as_kuberay_submits(local_entrypoint(job))
    assert shlex.split(short_run["submitted_entrypoint"])[1:3] == ["-m", "trainer.vision_train"]
    words = shlex.split(local_entrypoint(job))[3:]
    assert shlex.split(short_run["submitted_entrypoint"])[3:] == words
    rendered = shlex.split(job.entrypoint)[3:]
    assert "--installer=uv" in rendered
    assert [w for w in rendered if not w.startswith(("--installer=", "--extra_pip="))] == [
        w for w in words if w != "--installer=none"]
    assert f"--max_steps={SHORT_STEPS}" in words
    # The run is the one the render named (one per Helm revision), and the demo read it from its directory.
    assert f"--run_name={short_run['run_name']}" in words
    assert short_run["run_uri"] == f"{short_run['storage_uri']}/runs/{short_run['run_name']}"
    # Ray ran that command (its own log line), with the ConfigMap's files as the working directory.
    log = Path(short_run["job_log"]).read_text()
    assert f"Running entrypoint for job {short_run['job']['submission_id']}: {short_run['submitted_entrypoint']}" in log
    # The runtime env: the chart's (no installer: only the Ray Train workers would install, and the demo
    # verified their list locally and submitted --installer=none).
    assert "--installer=none" in words
    env_vars = short_run["submitted_runtime_env"]["env_vars"]
    assert not {"pip", "uv"} & set(short_run["submitted_runtime_env"])
    assert env_vars["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:")


@pytest.mark.slow
def test_ray_head_was_stopped(short_run: dict) -> None:
    pid = short_run["ray_head_pid"]
    assert pid
    if psutil.pid_exists(pid):
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if short_run["ray_temp_dir"] in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
    assert "stopped the local Ray head by process id" in short_run["stdout"]


@pytest.mark.slow
def test_trainer_failure_shows_the_log_tail(tmp_path: Path) -> None:
    """A job that fails says so, with the trainer's own error from the log, and stops its Ray."""
    # Flags every check accepts, data the job itself refuses: every row is longer than 8 tokens and
    # bad_rows=fail stops at the first (only the job's scan of the rows can know).
    proc = _run_demo(tmp_path, "--set=training.bad_rows=fail", "--set=training.max_seq_length=8", "--rows=8")
    assert proc.returncode == 1
    assert "ended FAILED" in proc.stderr
    # The trainer's own error, with its fix.
    assert "max_seq_length" in proc.stderr and "bad_rows=skip" in proc.stderr
    assert "stopped the local Ray head by process id" in proc.stdout
    # The head's logs outlive its temp dir: kept in the run dir, and the output says where.
    kept = list(tmp_path.glob("run-*/ray-head-logs/job"))
    assert len(kept) == 1 and (kept[0] / "raylet.out").is_file() and (kept[0] / "ray-start.log").is_file()
    assert f"the Ray head's logs are kept in {kept[0]}" in proc.stdout


# ------------------------------------------------------------------------------- fast checks


def test_port_in_use_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in demo_main.USER_CLUSTER_ENV:
        monkeypatch.delenv(name, raising=False)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = demo_main.main([f"--output-dir={tmp_path}", f"--dashboard-port={port}", "--min-free-gib=0"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"port {port} on 127.0.0.1 is in use" in err and "--dashboard-port" in err
    assert not list(tmp_path.glob("run-*")), "no work before the pre-flight checks pass"


def test_not_enough_memory_says_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for name in demo_main.USER_CLUSTER_ENV:
        monkeypatch.delenv(name, raising=False)
    rc = demo_main.main([f"--output-dir={tmp_path}", "--min-free-gib=100000"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "GiB of memory is available" in err and "close other programs" in err


def test_unreachable_ray_address_is_not_replaced_silently(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the socket closes
    monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{port}")
    rc = demo_main.main([f"--output-dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"RAY_ADDRESS=http://127.0.0.1:{port}" in err and "unset it" in err


@pytest.mark.slow
def test_demo_ends_with_the_report_path(short_run: dict) -> None:
    last = short_run["stdout"].rstrip("\n").splitlines()[-1]
    report = Path(short_run["report_html"])
    assert last == f"[demo] report: {report}"  # absolute: the test's output dir is not under the checkout
    assert report.parent == Path(short_run["run_dir"]) and report.is_file()
    assert short_run["summary"]["report"] == f"{short_run['run_uri']}/report.html"


@pytest.mark.slow
def test_demo_output_is_quiet(short_run: dict) -> None:
    """Ray's own lines are in job.log only; the trainer's lines reach the terminal under the gutter."""
    out, log = short_run["stdout"], Path(short_run["job_log"]).read_text()
    assert "Reporting training result" in log and "Reporting training result" not in out
    assert "Started training worker group" in log and "Started training worker group" not in out
    assert "  job | " in out and "[samples]" in out and "lines of Ray's own logging" in out
    assert "Loading weights" not in log and "Generating train split" not in log  # progress bars off at source
    # The demo's own process: no Ray INFO line (job submission: `Uploading package`, `WebSocket closed`).
    assert "\tINFO " not in out + short_run["stderr"] and "Uploading package" not in out + short_run["stderr"]
    assert "it/s]" not in out + short_run["stderr"]


@pytest.mark.slow
def test_report_in_a_browser(short_run: dict, tmp_path: Path) -> None:
    """The demo's report.html in headless chromium: one figure per sample with its image and the three
    texts, the loss chart, the eval table; and the page requests nothing."""
    from tests import browser

    report = Path(short_run["report_html"])
    samples = [json.loads(line) for line in (Path(short_run["run_storage_dir"]) / "samples.jsonl").read_text()
               .splitlines()]
    assert len(samples) == SHORT_SAMPLE_ROWS
    els = browser.parse(browser.dump_dom(report))
    figures = [e for e in els if e.tag == "figure" and browser.has_class(e, "sample")]
    assert len(figures) == len(samples)
    for fig, sample in zip(figures, samples, strict=True):
        inside = [e for e in els if e.inside(fig)]
        assert [e.attrs["src"][:23] for e in inside if e.tag == "img"] == ["data:image/jpeg;base64,"]
        texts = {c: " ".join(e.text.split()) for e in inside for c in ("reference", "base", "finetuned")
                 if browser.has_class(e, c)}
        for kind, key in (("reference", "reference"), ("base", "base_output"), ("finetuned", "finetuned_output")):
            assert " ".join(sample[key].split()) in texts[kind]
    chart = next(e for e in els if e.attrs.get("id") == "loss-chart")
    assert {e.attrs.get("class") for e in els if e.tag == "polyline" and e.inside(chart)} == {"train-loss", "eval-loss"}
    rows = [e for e in els if e.tag == "tr" and e.inside(next(e for e in els if e.attrs.get("id") == "eval-metrics"))]
    assert len(rows) == 1 + SHORT_STEPS // EVAL_EVERY  # header + the evals at steps 2, 4, 6
    assert browser.page_requests(report.as_uri(), tmp_path / "net.json") == []
    png = browser.screenshot(report, tmp_path / "report.png")
    assert png.stat().st_size > MIN_PNG_BYTES
