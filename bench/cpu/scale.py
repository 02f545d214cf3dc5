"""Scale benchmark (CPU): the trainer's data start-up on many rows with gs:// images on fake-gcs-server.

What runs is the trainer's own data path inside Ray Train workers (``trainer.data.dataset.prepare_data``: the rows from
gs://, the bad-row scan kept with the run, the node cache of images), without a model. Two starts of the
same run on the same node:

1. first start: the workers split the scan of every row between them (each image fetched into the node
   cache once) and store the result with the run;
2. a restart (what a lost worker or a resize does): the workers read the scan back.

For each start and each worker it records the wall time of the data preparation, the peak resident
memory of the worker process (``ru_maxrss``) and its resident memory before, and the downloads the fake
server served (every image should be fetched once per node, over both starts).

    python3 -m bench.cpu.scale --rows 100000 --workers 2 --out bench/results/scale-100k.json

Run it under the machine's lock (``heavy``): it starts Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.cpu.scale_data import FakeGcs, write_dataset

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "gemma3-ray-bench"
KIB = 1024


def worker_prepare(config: dict[str, Any]) -> None:
    """Ray Train worker: the trainer's data preparation, timed; one JSON line per worker into `out`."""
    import ray.train
    from transformers import AutoProcessor

    from trainer.data.dataset import prepare_data
    from trainer.data.scan_store import ScanGroup
    from trainer.job.arguments import parse_args
    from trainer.job.storage import Storage

    ctx = ray.train.get_context()
    rss_before = _rss_kib()
    args = parse_args(config["flags"])
    processor = AutoProcessor.from_pretrained(config["model"])
    run = Storage(root=config["run_root"], emulator_host=config["emulator"])
    started = time.perf_counter()
    train, evaluation, _, stats = prepare_data(args, processor, config["emulator"],
                                               scan_group=ScanGroup.of_ray_worker(run))
    elapsed = time.perf_counter() - started
    rec = {"start": config["start"], "rank": ctx.get_world_rank(), "world_size": ctx.get_world_size(),
           "prepare_s": elapsed, "rows": stats["rows"], "train_rows": len(train),
           "scan_reused": stats.get("scan_reused"), "rss_before_mib": rss_before / KIB,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB}
    with open(config["out"], "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def _rss_kib() -> float:
    with open("/proc/self/status") as fh:
        return next(float(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray is imported
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a throw-away cluster of this process only
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from localkit.tiny_model import build_tiny_gemma3

    work = Path(tempfile.mkdtemp(prefix="g3r-scale-", dir="/tmp"))
    try:
        server = FakeGcs(work / "gcs")
        try:
            t0 = time.perf_counter()
            data_uri = write_dataset(server, BUCKET, "data", opts.rows)
            write_s = time.perf_counter() - t0
            model = build_tiny_gemma3()
            results = run_starts(opts, server.url, data_uri, model, work)
            images = Counter(server.downloads("data%2Fimages%2F"))
            data_files = Counter(server.downloads("data%2Ftrain.parquet"))
        finally:
            server.stop()
        report = {"rows": opts.rows, "workers": opts.workers, "write_s": write_s,
                  "starts": results, "image_downloads": sum(images.values()), "distinct_images_downloaded": len(images),
                  "images_downloaded_more_than_once": sum(1 for n in images.values() if n > 1),
                  "data_file_downloads": sum(data_files.values()), "cpus": os.cpu_count(),
                  "load_avg_1m": os.getloadavg()[0]}
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(report, indent=1))
        print("RESULT " + json.dumps(report))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_starts(opts, emulator: str, data_uri: str, model: Path, work: Path) -> list[dict[str, Any]]:
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    ray_tmp = tempfile.mkdtemp(prefix="g3r-sc-", dir="/tmp")
    ray.init(address="local", num_cpus=opts.workers, include_dashboard=False, _node_ip_address="127.0.0.1",
             _temp_dir=ray_tmp, log_to_driver=True,
             # every Ray process of the job (Ray Train's sync actor unpickles the trainer's objects too)
             # imports the trainer from the checkout, as the chart's working_dir gives the real job
             runtime_env={"env_vars": {"STORAGE_EMULATOR_HOST": emulator,
                                       "PYTHONPATH": str(ROOT)}})
    out = work / "workers.jsonl"
    run_root = f"gs://{BUCKET}/runs/bench"
    flags = [f"--model_id={model}", f"--dataset_name={data_uri}", f"--cache_dir={work / 'node-cache'}",
             "--use_gpu=false", "--quantization=none", "--eval_fraction=0.05", f"--storage_path=gs://{BUCKET}"]
    try:
        for start in ("first", "restart"):
            trainer = TorchTrainer(
                worker_prepare,
                train_loop_config={"flags": flags, "model": str(model), "out": str(out),
                                   "run_root": run_root, "emulator": emulator, "start": start},
                scaling_config=ray.train.ScalingConfig(num_workers=opts.workers, resources_per_worker={"CPU": 1}),
                run_config=ray.train.RunConfig(name=f"scale-{start}", storage_path=str(work / "ray-results")),
            )
            trainer.fit()
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return [json.loads(line) for line in out.read_text().splitlines()]


if __name__ == "__main__":
    main()
