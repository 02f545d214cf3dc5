"""`make demo`: the chart's own RayJob, end to end, on a local Ray cluster.

1. ``helm template`` renders charts/gemma3-ray with values/local.yaml (the tiny model and sample
   data paths, and optionally ``--max_steps``/``--set``, are passed as overrides).
2. The trainer files come from the rendered trainer ConfigMap (written in the kubelet's volume
   layout, as the job submitter pod sees them), the entry point and runtime env from the rendered
   RayJob. The runtime env's working_dir (the submitter's mount of the ConfigMap) becomes that local
   copy, which Ray packages and uploads as the job's working directory, exactly as the submitter's
   `ray job submit` does. The pip pins are checked against this Python and left out of the
   submission (no installs on a local cluster).
3. A local Ray head on 127.0.0.1 (or the cluster in ``RAY_ADDRESS``) runs the job through the Ray
   Jobs API; the run's ``gs://`` storage is served by a local fake-gcs-server, on disk.
4. A summary, a loss-curve PNG and the timings close the run; the Ray head and the storage server
   the demo started are stopped by process id.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from demo.errors import DemoError
from demo.job_runner import require_success, run_job
from demo.preflight import RELEASE, preflight
from demo.report import copy_report, find_run, load_run, plot_losses, summary_lines
from demo.run_dirs import RESULT_FILE, new_run_dir
from localkit.chart_job import (
    as_kuberay_submits,
    local_entrypoint,
    local_runtime_env,
    parse_chart_job,
    render_chart,
    write_files,
)
from localkit.errors import LocalKitError
from localkit.fake_gcs import FakeGcs
from localkit.host import (
    describe_other_ray,
    other_ray_processes,
    require_jobs_api_packages,
    require_memory,
    require_port_free,
)
from localkit.local_cluster import ray_head
from localkit.processes import deferred_signals

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHART = ROOT / "charts" / "gemma3-ray"
DEFAULT_VALUES = ROOT / "values" / "local.yaml"
DEFAULT_OUTPUT = ROOT / "demo-output"
# A Ray head (~1 GiB) and two CPU training workers with the tiny model (~1.5 GiB each), plus headroom.
DEFAULT_MIN_FREE_GIB = 5.0
DEFAULT_ROWS = 240
USER_CLUSTER_ENV = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
# Flags the demo itself sets on the chart; --set cannot override them.
DEMO_SET = ("training.model_id", "training.dataset_name")
# --streaming: where the shards go in the local bucket, how big each is (the sample's 240 rows: ~8 shards), and the
# CPUs the local head offers beyond the training workers (Ray Data's CPU stage and its reads).
STREAM_PREFIX = "datasets/products"
STREAM_SHARD_SIZE = "64KB"
STREAM_EXTRA_CPUS = 2


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    p.add_argument("--chart", type=Path, default=DEFAULT_CHART, help="chart directory")
    p.add_argument("--values", type=Path, default=DEFAULT_VALUES, help="values file (default values/local.yaml)")
    p.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT, help="where runs are kept")
    p.add_argument("--max_steps", type=int, default=None,
                   help="override training.max_steps of the values file (rendered by the chart)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="extra `helm template --set` override, e.g. training.eval_steps=4 (repeatable)")
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="rows of the sample dataset")
    p.add_argument("--streaming", action="store_true",
                   help="shard the sample data into the local bucket with `gemma3-ray data shard` and train on it "
                   "streamed (training.streaming=true: Ray Data, no copy, no scan before step 1)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs the local Ray head offers (default: this machine's, at least the worker count)")
    p.add_argument("--ray-port", type=int, default=None, help="GCS port of the local head (default: a free one)")
    p.add_argument("--dashboard-port", type=int, default=None, help="dashboard/Jobs API port (default: a free one)")
    p.add_argument("--min-free-gib", type=float, default=DEFAULT_MIN_FREE_GIB,
                   help="refuse to start below this much available memory")
    args = p.parse_args(argv)
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max_steps must be a positive number of optimizer steps")
    if args.rows < 2:
        p.error("--rows must be at least 2 (a train and an eval row)")
    for item in args.sets:
        key = item.split("=", 1)[0]
        if "=" not in item or not key:
            p.error(f"--set {item!r}: use KEY=VALUE, e.g. --set training.eval_steps=4")
        if key in DEMO_SET:
            p.error(f"--set {key}: the demo sets it (the tiny model / sample data it builds)")
    return args


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _shown(path: Path) -> str:
    """A path relative to the working directory when it is under it (demo-output/...), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _user_cluster() -> str | None:
    for name in USER_CLUSTER_ENV:
        if os.environ.get(name):
            return f"{name}={os.environ[name]}"
    return None


def _new_run_dir(output_dir: Path) -> Path:
    return new_run_dir(output_dir, say)


def _user_client():
    """A Jobs API client for the user's own cluster (RAY_ADDRESS), checked before any work."""
    from ray.job_submission import JobSubmissionClient

    where = _user_cluster()
    try:
        return JobSubmissionClient()
    except Exception as e:  # noqa: BLE001 - every connection failure gets the same advice
        raise DemoError(
            f"cannot reach the Ray Jobs API of {where}: {e}\n"
            "Fix the address (http://<head>:<dashboard port>), or unset it and the demo starts its own local Ray."
        ) from e


def _values_bucket(values: Path, sets: dict[str, str]) -> str:
    """storage.bucket of the values file (or its --set): the bucket the local storage server serves."""
    import yaml

    bucket = sets.get("storage.bucket") or ((yaml.safe_load(values.read_text()) or {}).get("storage") or {}).get("bucket")
    if not bucket:
        raise DemoError(f"{values}: storage.bucket is empty; the demo serves that bucket locally")
    return bucket


def _shard_into(gcs: FakeGcs, data: Path, uri: str) -> None:
    """`gemma3-ray data shard DATA --to URI --apply`, the plugin's own command, against the local storage server."""
    from gemma3_ray import cli
    from gemma3_ray.config.clients import Clients
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="gemma3-ray-demo", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": gcs.url})
    t = time.monotonic()
    argv = ["data", "shard", str(data), "--to", uri, "--shard-size", STREAM_SHARD_SIZE, "--apply"]
    if cli.main(argv, Clients(project="gemma3-ray-demo", storage=client)) != 0:
        raise DemoError(f"`gemma3-ray {' '.join(argv)}` failed (above)")
    say(f"    streaming: gemma3-ray data shard <sample data> --to {uri} --shard-size {STREAM_SHARD_SIZE} --apply "
        f"[{time.monotonic() - t:.1f} s]")


def run(args: argparse.Namespace) -> dict[str, Any]:
    started_wall = time.time()
    make_start = os.environ.get("DEMO_START")

    # Pre-flight: fail before any work on what the user must fix.
    user_cluster = _user_cluster()
    client = _user_client() if user_cluster else None
    if not user_cluster:
        require_memory(args.min_free_gib)
        require_jobs_api_packages()
        if args.ray_port:
            require_port_free(args.ray_port, "--ray-port")
        if args.dashboard_port:
            require_port_free(args.dashboard_port, "--dashboard-port")
    helm = os.environ.get("HELM") or str(ROOT / ".tools" / "bin" / "helm")
    sets = dict(item.split("=", 1) for item in args.sets)
    if args.max_steps is not None:
        sets["training.max_steps"] = str(args.max_steps)
    if args.streaming:
        sets["training.streaming"] = "true"
        sets.setdefault("training.streaming_decoders", "1")  # one CPU stage actor: the head offers 2 spare CPUs
    preflight(helm, args.chart, args.values, sets)  # the values, every --set, the trainer's own flag checks
    run_dir = _new_run_dir(args.output_dir)
    say(f"run directory: {run_dir}")

    # The tiny model and the sample data (offline; the model is cached after the first run).
    from localkit.sample_data import build_sample_dataset
    from localkit.tiny_model import build_tiny_gemma3

    t = time.monotonic()
    model_dir = build_tiny_gemma3()
    data = build_sample_dataset(run_dir / "data", n_rows=args.rows, seed=0)
    say(f"tiny Gemma 3: {model_dir}; sample data: {data} ({args.rows} rows) [{time.monotonic() - t:.1f} s]")

    # 1. Render the chart.
    stream_uri = f"gs://{_values_bucket(args.values, sets)}/{STREAM_PREFIX}" if args.streaming else None
    paths = {"training.model_id": str(model_dir), "training.dataset_name": stream_uri or str(data)}
    rendered = render_chart(helm, args.chart, args.values, paths, sets, release=RELEASE)
    (run_dir / "rendered.yaml").write_text(rendered)
    shown = " ".join([*(f"--set-string {k}=<built>" for k in paths), *(f"--set {k}={v}" for k, v in sets.items())])
    say(f"1/4 helm template {args.chart.name} -f {args.values.name} {shown} -> {run_dir / 'rendered.yaml'}")

    # 2. The trainer files, entry point and runtime env the chart would run.
    job = parse_chart_job(rendered)
    trainer_dir = run_dir / "working_dir"  # the submitter's mount of the ConfigMap: it holds the package trainer/
    written = write_files(job, trainer_dir)
    entrypoint = as_kuberay_submits(local_entrypoint(job))
    folders = sorted({str(p.parent.relative_to(trainer_dir)) for p in written})
    say(f"2/4 ConfigMap {job.configmap_name}: {len(written)} files in {', '.join(folders)} -> {trainer_dir} "
        "(the volume's items, in the kubelet's ..data layout)")
    say(f"    RayJob entry point, as KubeRay's submitter passes it, with --installer=none (see the runtime env "
        f"below) (run in the job's working directory: the "
        f"ConfigMap's files, mounted at {job.mount_path} in the submitter pod):")
    print(f"      {entrypoint}", flush=True)
    storage = job.storage_path
    if not storage.startswith("gs://"):
        raise DemoError(f"the rendered --storage_path is {storage!r}; the demo serves a gs:// bucket locally")
    bucket = storage[len("gs://") :].split("/", 1)[0]

    # Every server the demo starts is described first and started inside the try: whatever an interrupt
    # or a failure cuts short, the finally stops by process id (localkit/processes.py).
    gcs = FakeGcs(run_dir / "gcs", run_dir / "fake-gcs-server.log")
    head = None
    failed = True  # until the job succeeded: the head's logs are kept on every other exit
    try:
        gcs.start()
        gcs.create_bucket(bucket)
        if stream_uri:
            _shard_into(gcs, data, stream_uri)
        extra_env = {
            # The trainer's gs:// storage goes to the local fake-gcs-server (objects as files on disk).
            "STORAGE_EMULATOR_HOST": gcs.url,
            # The pods keep HF_HOME on their scratch volume; here a scratch dir of the run.
            "HF_HOME": str(run_dir / "scratch" / "huggingface"),
        }
        runtime_env, pins = local_runtime_env(job, trainer_dir, extra_env)
        exempt = [f"{c.requirement} (have {c.installed}: {c.note})" for c in pins if c.note]
        say(
            f"    runtime env: all {len(pins)} pins are satisfied by this Python"
            + (f" except {'; '.join(exempt)}" if exempt else "")
            + f" -> submitted with --installer=none instead of --installer={job.flags.get('installer', 'none')} "
            "(the local workers install nothing; on GKE only the Ray Train workers would)"
        )
        say(f"    runtime env: working_dir {job.mount_path} -> {trainer_dir} (excludes {runtime_env.get('excludes')}: the "
            f"kubelet's ..data entries); + env STORAGE_EMULATOR_HOST={gcs.url}, "
            f"HF_HOME={extra_env['HF_HOME']}")
        say(f"    storage {storage} -> the local fake-gcs-server, on disk under {gcs.root}")

        # 3. Ray.
        if client is not None:
            say(f"3/4 using your Ray cluster from {user_cluster} (it must share this machine's files)")
        else:
            others = other_ray_processes()
            if others:
                say("note: " + describe_other_ray(others))
            num_cpus = args.num_cpus or max(os.cpu_count() or 1,
                                             job.num_workers + (STREAM_EXTRA_CPUS if args.streaming else 0))
            t = time.monotonic()
            head = ray_head(num_cpus, run_dir / "ray-head.log", args.ray_port, args.dashboard_port)
            head.note = say
            head.start()
            say(
                f"3/4 local Ray head (pid {head.process.pid}) on 127.0.0.1: GCS :{head.gcs_port}, Jobs API "
                f"{head.dashboard_url}, {num_cpus} CPUs, token authentication on (a fresh token for this run) "
                f"[{time.monotonic() - t:.1f} s]"
            )
            # Ray Train's helper actors look a cluster up by address; with other Ray clusters on the
            # machine an unset address is ambiguous, so the job's processes get this one.
            runtime_env["env_vars"]["RAY_ADDRESS"] = head.gcs_address
            say(f"    runtime env: + env RAY_ADDRESS={head.gcs_address} (this head)")
            from ray.job_submission import JobSubmissionClient

            client = JobSubmissionClient(head.dashboard_url, headers=head.headers)
        storage_dir = gcs.local_path(storage)
        run_name = job.flags.get("run_name")  # the chart's run of this revision; else the trainer names one
        outcome = run_job(
            client, entrypoint, runtime_env, run_dir / "job.log",
            metrics_path=lambda: (find_run(storage_dir, run_name) or storage_dir) / "metrics.jsonl",
            max_steps=int(job.flags["max_steps"]) if job.flags.get("max_steps") else None,
            on_tick=head.remember_pids if head else None,
            metadata={"source": "make demo", "configmap": job.configmap_name},
            head_logs=str(head.logs_copy / "job") if head else f"the logs of your Ray cluster ({user_cluster})",
        )
        require_success(outcome)
        failed = False
    finally:
        with deferred_signals(say):  # a second Ctrl-C waits until everything is stopped
            if head is not None and failed and head.stopped is None:
                kept = head.keep_logs("job")  # its temp dir goes with it: what a failure needs is kept
                if kept:
                    say(f"the Ray head's logs are kept in {kept}")
            if head is not None:
                say(head.stop_sentence())
            say(gcs.stop_sentence())

    # 4. Report.
    run_storage = find_run(storage_dir, run_name)
    if run_storage is None:
        raise DemoError(f"the job finished but wrote no run under {storage_dir / 'runs'}: see the job log above")
    summary, records = load_run(run_storage)
    png = plot_losses(records, run_dir / "loss.png", f"make demo: tiny Gemma 3, {summary.get('global_step')} steps")
    total_s = time.time() - float(make_start) if make_start else time.time() - started_wall
    label = "make demo total" if make_start else "demo total"
    report = copy_report(summary, run_storage, run_dir)
    for line in summary_lines(summary, gcs.local_path, png, outcome.wall_s, total_s, label):
        print(line, flush=True)
    if report is not None:
        say(f"report: {_shown(report)}")
    result = {
        "run_dir": str(run_dir),
        "summary": summary,
        "job": {"submission_id": outcome.submission_id, "status": outcome.status, "wall_s": outcome.wall_s},
        "total_s": total_s,
        "total_includes_setup": bool(make_start),
        "ray_head_pid": head.process.pid if head else None,
        "ray_temp_dir": str(head.temp_dir) if head else None,
        "loss_png": str(png),
        "report_html": str(report) if report else None,
        "job_log": str(outcome.log_path),
        "storage_uri": storage,
        "storage_dir": str(storage_dir),
        "run_name": run_storage.name,
        "run_uri": f"{storage}/runs/{run_storage.name}",
        "run_storage_dir": str(run_storage),
        "configmap": job.configmap_name,
        "mount_path": job.mount_path,
        "job_working_dir_uri": outcome.working_dir_uri,
        "rendered_entrypoint": job.entrypoint,
        "submitted_entrypoint": entrypoint,
        "submitted_runtime_env": {k: v for k, v in runtime_env.items() if k != "working_dir"},
        "trainer_dir": str(trainer_dir),
        "trainer_files_sha256": {p.name: _sha256(p.read_bytes()) for p in written},
    }
    (run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2))
    return result


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # run the clean-up (stop the Ray head and storage server by pid)


def _quiet() -> None:
    """The demo process's own noise, off at the source, before the libraries load: every Hugging Face
    progress bar (hub, transformers: the tiny model's `Writing model shards`; datasets: the sample
    data), and Ray's INFO lines (the Jobs API client's `Uploading package`, `WebSocket closed`): Ray's
    loggers set their own levels when imported, so the level is set on the handler all of them write
    through ("ray", which does not propagate). Ray's warnings and errors still show."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import ray  # noqa: F401 - configures the "ray" logger and its handler

    for handler in logging.getLogger("ray").handlers:
        handler.setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    _quiet()
    try:
        run(args)
    except LocalKitError as e:  # the kit's and the demo's own (DemoError)
        print(f"\n[demo] FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        # What was stopped is said above, by the clean-up that did it.
        print("\n[demo] interrupted", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
