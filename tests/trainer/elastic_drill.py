"""The elastic drill's driver, run by tests/trainer/test_elastic.py in a process of its own: a local Ray
cluster (``ray.cluster_utils.Cluster`` on 127.0.0.1, one training-worker CPU per node: a head and at most
one more node), jobs run through ``vision_train.main`` with the drill's callbacks, and for each job a
JSON result: finished or not within its deadline, the summary, times. A job may lose the second node
(removed, not replaced, while its rank holds after a step) or gain it (added while the head's rank holds).

    python -m tests.trainer.elastic_drill --spec spec.json --out result.json

A process of its own because a pytest process holds at most one Ray connection (the session's
cluster), and because a job that waits forever must be abandoned: the drill then shuts its cluster
down by its own nodes' process ids and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # holds the trainer package (run as `python -m tests.trainer.elastic_drill`)
NODE_CPUS = 1  # one training worker per node; Ray Train's controller actors take no CPU
OBJECT_STORE_BYTES = 100 * 1024**2
POLL_S = 0.5
# How long a worker group may wait for its placement group before the controller re-plans (Ray's
# default is 60 s; the drill's cluster never gets the resources back, so a short wait suffices: the wait
# is for a placement group only, which a node with free CPUs grants in well under a second).
WORKER_GROUP_START_TIMEOUT_S = "10"
# How often a running elastic group looks for more capacity (Ray's default: 60 s).
RESIZE_CHECK_S = 5.0
# How often Ray's AutoscalingCoordinator (the actor that tells an elastic group how many workers fit)
# re-reads the cluster's nodes (Ray's default: 20 s). Ray Train asks it without a refresh, so for up to a
# tick after a node is lost it still counts that node: the restart asks for 2 workers and waits out
# WORKER_GROUP_START_TIMEOUT_S; a returned node goes unseen as long. Same decisions, sooner.
COORDINATOR_TICK_S = 1.0


def _environment() -> None:
    """Before `ray` is imported and the nodes start (they inherit it): loopback only, no auth, the checkout."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a throw-away cluster of this process only
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S"] = "600"
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = WORKER_GROUP_START_TIMEOUT_S
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def quick_resize_checks() -> None:
    """Test-only: elastic groups look for returned capacity every RESIZE_CHECK_S (the driver builds its
    ScalingConfig from `ray.train` at call time). Called once per process."""
    import dataclasses

    import ray.train

    @dataclasses.dataclass
    class ScalingConfig(ray.train.ScalingConfig):
        elastic_resize_monitor_interval_s: float = RESIZE_CHECK_S

    ray.train.ScalingConfig = ScalingConfig


def quick_coordinator_ticks() -> None:
    """Test-only, the job's worker_process_setup_hook (every worker process of the drill's jobs runs it before
    any task): Ray's AutoscalingCoordinator ticks every COORDINATOR_TICK_S. Its tick thread reads the class
    attribute at each sleep, and the actor is made from this class in one of these processes."""
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as coordinator

    coordinator._AutoscalingCoordinatorActor.TICK_INTERVAL_S = COORDINATOR_TICK_S


def run_job(cluster, job: dict[str, Any], spec: dict[str, Any], node_args: dict[str, Any]) -> dict[str, Any]:
    """One job on the cluster; removes the worker node after step `remove_node_after_step`, or adds one
    after step `add_node_after_step`."""
    from tests.trainer.drill_callbacks import HoldOnNode, RecordSamples
    from trainer import vision_train as vt

    records = Path(spec["records_dir"]) / job["name"]
    callbacks: list = [RecordSamples(str(records), spec["id_pattern"])]
    remove_at, add_at = job.get("remove_node_after_step"), job.get("add_node_after_step")
    marker = records / "held"
    worker_node = next(iter(cluster.worker_nodes), None)
    if remove_at:
        callbacks.append(HoldOnNode(worker_node.node_id, remove_at, str(marker)))
    if add_at:
        callbacks.append(HoldOnNode(cluster.head_node.node_id, add_at, str(marker)))
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["summary"] = vt.main(job["flags"], callbacks=callbacks)
        except BaseException as e:  # noqa: BLE001 - reported to the test, which decides
            outcome["error"] = "".join(traceback.format_exception(e))[-4000:]

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    result: dict[str, Any] = {"name": job["name"]}
    deadline = started + job["deadline_s"]
    if remove_at or add_at:
        while not marker.exists() and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if marker.exists() and remove_at:
            cluster.remove_node(worker_node)
            result["node_removed_after_s"] = time.monotonic() - started
        elif marker.exists():
            cluster.add_node(**node_args)
            result["node_added_after_s"] = time.monotonic() - started
    thread.join(timeout=max(0.0, deadline - time.monotonic()))
    result.update(finished=not thread.is_alive(), elapsed_s=time.monotonic() - started, **outcome)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args()
    spec = json.loads(opts.spec.read_text())
    temp_dir = tempfile.mkdtemp(prefix="g3r-drill-", dir="/tmp")  # short: socket paths are length-limited
    (Path(temp_dir) / "ray").mkdir()
    # Ray writes the "current cluster" address file under RAY_TMPDIR: keep it in this drill's own dir.
    os.environ["RAY_TMPDIR"] = temp_dir
    _environment()
    import ray
    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": NODE_CPUS, "node_ip_address": "127.0.0.1", "object_store_memory": OBJECT_STORE_BYTES}
    head_args = {**node_args, "temp_dir": str(Path(temp_dir) / "ray"), "include_dashboard": False}
    results: list[dict[str, Any]] = []
    quick_resize_checks()
    try:
        for job in spec["jobs"]:
            # A cluster of its own per job: Ray Train's autoscaling coordinator (a cluster-wide actor)
            # keeps a finished job's resource request until it expires (180 s) when its cancel times
            # out, and an elastic job sizes itself to what is left (seen on a loaded 2-core CI).
            cluster = Cluster(initialize_head=True, head_node_args=head_args)
            try:
                for _ in range(job.get("nodes", 2) - 1):
                    cluster.add_node(**node_args)
                cluster.wait_for_nodes()
                ray.init(address=cluster.address,
                         runtime_env={"worker_process_setup_hook": f"{__spec__.name}.quick_coordinator_ticks"})
                results.append(run_job(cluster, job, spec, node_args))
                opts.out.write_text(json.dumps({"jobs": results}, indent=1))
            finally:
                ray.shutdown()
                cluster.shutdown()
            if not results or not results[-1]["finished"]:
                break  # an abandoned job's thread still runs: nothing else can use this process's Ray
    finally:
        opts.out.write_text(json.dumps({"jobs": results}, indent=1))
        shutil.rmtree(temp_dir, ignore_errors=True)
    sys.stdout.flush()
    os._exit(0)  # an abandoned job's thread would keep the interpreter alive


if __name__ == "__main__":
    main()
