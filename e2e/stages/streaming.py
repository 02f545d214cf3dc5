"""make e2e stage 'streaming' (#32): a dataset three times a worker pod's ephemeral-storage limit, sharded into the
bucket by the plugin's `data shard`, streamed by the trainer (training.streaming) to SUCCEEDED, every row once.

The rows carry 1024 x 1024 noise images (PNG cannot compress noise: ~3 MiB each), so the shards' bytes are what
a copy to the node would cost; the worker pods' ephemeral-storage limit is a third of them, so a copy (or a
spill of the whole dataset) would get the pod evicted by the kubelet. The summary's streaming.epochs shows
every row of the epoch trained once.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from e2e.support.errors import StageError
from e2e.support.harness import Harness
from e2e.support.session import run_name

NAMESPACE = run_name("g3r-e2e-stream")  # unique per run (e2e/support/session.py)
RELEASE = "e2e-stream"
ROWS = 256
SIDE = 1024
EPHEMERAL_LIMIT_MIB = 256
GLOBAL_BATCH = 8  # 2 workers x 1 x 4
DATA_KEY = "inputs/streamed-products"  # under the storage's root: the emulator's bucket or the run's prefix


def _noise_rows(out: Path) -> Path:
    """ROWS rows in the tutorial's schema whose images are SIDE x SIDE RGB noise (incompressible), as parquet."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(0)
    writer = None
    path = out / "noise-products.parquet"
    out.mkdir(parents=True, exist_ok=True)
    for start in range(0, ROWS, 16):
        rows = []
        for i in range(start, min(start + 16, ROWS)):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(buf, format="PNG")
            rows.append({"Product Name": f"Noise Print {i}", "Category": "Home & Kitchen | Wall Art",
                         "image": {"bytes": buf.getvalue(), "path": f"noise-{i:05d}.png"},
                         "description": f"A print of random noise, number {i}."})
        table = pa.Table.from_pylist(rows)
        writer = writer or pq.ParquetWriter(str(path), table.schema)
        writer.write_table(table)
    writer.close()
    return path


def _shard(h: Harness, source: Path) -> dict:
    from gemma3_ray import cli
    from gemma3_ray.config.clients import Clients

    client = h.storage.client()  # the emulator's (anonymous) or E2E_BUCKET's (Application Default Credentials)
    data_uri = h.storage.uri(DATA_KEY)
    argv = ["data", "shard", str(source), "--to", data_uri, "--shard-size", "64MiB", "--apply"]
    if cli.main(argv, Clients(project=client.project or "gemma3-ray-e2e", storage=client)) != 0:
        raise StageError(f"`gemma3-ray {' '.join(argv)}` failed")
    return json.loads(h.storage.path(f"{data_uri}/manifest.json").read_text())


def chart_sets(data_uri: str) -> dict[str, str | int | float | bool]:
    """The release's values over values/e2e.yaml: the stream of data_uri, one epoch, workers whose ephemeral
    storage is a third of the data (tests/e2e/test_e2e_stage_sets.py renders them through the chart's schema)."""
    steps = ROWS // GLOBAL_BATCH
    return {
        "training.streaming": True, "training.dataset_name": data_uri, "training.streaming_decoders": 1,
        "training.streaming_object_store_gib": 0.25, "training.eval_fraction": 0, "training.max_steps": steps,
        "training.global_batch_size": GLOBAL_BATCH, "training.per_device_train_batch_size": 1,
        "training.save_steps": steps, "training.eval_steps": steps, "training.sample_rows": 0,
        # the adapter alone: with values/e2e.yaml's trained embedding the end-of-run checkpoint (67 MB of weights,
        # 134 MB of Adam state) filled the workers' 256Mi of ephemeral storage beside the model, and the kubelet
        # evicted them after the last step (seen through KUBECONFIG); the stage is about the data, not that
        "training.train_embeddings": False,
        # the CPU stage runs only on the training workers' nodes (their image has the trainer's packages), and Ray
        # Train packs both training workers into one pod when it can: 2 CPUs for them and 1 for the CPU stage there.
        # Seen with 2: the stage's actor waited for a CPU on that pod forever (PENDING_NODE_ASSIGNMENT).
        "workers.resources.limits.cpu": 3,
        # that pod then holds both training workers (1.5 GB each on the tiny model), Ray Data's split coordinator
        # (1.2 GB) and the CPU stage (0.9 GB), RSS seen with ps; at values/e2e.yaml's 4Gi Ray's memory monitor
        # killed the shard reads over and over (seen: "10 Workers killed due to memory pressure" a minute)
        "workers.resources.limits.memory": "7Gi",
        "workers.resources.limits.ephemeral-storage": f"{EPHEMERAL_LIMIT_MIB}Mi",
        "workers.resources.requests.ephemeral-storage": f"{EPHEMERAL_LIMIT_MIB}Mi"}


def epoch_problem(summary: dict, steps: int) -> str | None:
    """Why the run's summary does not show every row of the epoch trained once, or None: the steps, the epoch
    whole (not cut short), every row trained, none twice, none left out (ROWS fill whole steps)."""
    epochs = (summary.get("streaming") or {}).get("epochs") or []
    seen = epochs[0] if epochs else {}
    if summary.get("global_step") != steps or len(epochs) != 1 or seen.get("cut_short_by_max_steps"):
        return (f"step {summary.get('global_step')} of {steps}, epochs {epochs or 'missing'}: not one whole epoch "
                f"of {steps} steps")
    if seen.get("rows_trained") != ROWS or seen.get("rows_trained_twice") or seen.get("rows_left_out") != 0:
        return (f"epoch 0 trained {seen.get('rows_trained')} rows of {ROWS}, {seen.get('rows_trained_twice')} twice, "
                f"{seen.get('rows_left_out')} left out (ids {seen.get('rows_left_out_ids')}): not every row once")
    return None


def streamed(h: Harness) -> str:
    manifest = _shard(h, _noise_rows(h.out_dir / "streaming-inputs"))
    data_bytes = sum(s["bytes"] for s in manifest["shards"])
    limit = EPHEMERAL_LIMIT_MIB * 2**20
    if data_bytes < 3 * limit:
        raise StageError(f"the shards hold {data_bytes} bytes, less than 3 x the {EPHEMERAL_LIMIT_MIB} MiB limit")
    ns = h.namespace(NAMESPACE)
    steps = ROWS // GLOBAL_BATCH
    run = h.helm_install(RELEASE, ns, sets=chart_sets(h.storage.uri(DATA_KEY)))
    h.wait_run(run, timeout=1500)
    summary = h.summary(run)
    stream = summary.get("streaming") or {}
    epochs = stream.get("epochs") or []
    h.record.facts["streaming"] = {"data_bytes": data_bytes, "ephemeral_limit": limit, "epochs": epochs,
                                   "data_wait_s": stream.get("data_wait_s")}
    problem = epoch_problem(summary, steps)
    if problem:
        raise StageError(f"{run.run_uri}: {problem}")
    wait = stream.get("data_wait_s") or {}
    return (f"{data_bytes / 2**20:.0f} MiB of shards ({len(manifest['shards'])}) streamed by workers limited to "
            f"{EPHEMERAL_LIMIT_MIB} MiB of ephemeral storage: SUCCEEDED at step {steps}, {ROWS} rows once each; data "
            f"wait {wait.get('first_step')} s at step 1, then {wait.get('steady_mean')} s per step")
