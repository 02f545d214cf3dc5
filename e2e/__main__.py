"""`make e2e`: the chart on a real Kubernetes with the real KubeRay operator and Kueue, stage by stage.

Against $KUBECONFIG when set (any cluster that already runs KubeRay, Kueue, and has the images and a
storage endpoint: E2E_STORAGE_HOST, E2E_HEAD_IMAGE, E2E_WORKER_IMAGE), else the local one-node cluster
of e2e/cluster.sh, started here and stopped on every exit path. Ends with a table of stages (time,
pass/fail) and writes it as JSON to e2e-output/summary.json. Exit 0 only when every stage passed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from e2e.harness import BUCKET, DATA_URI, MODEL_URI, ROOT, Harness, Images, run_script
from e2e.kube import Kube, StageError
from e2e.stage_table import DEFAULT_ONLY, SelectionError, deadline_from_env, finish, select, stop_reason
from e2e.stage_table import run as run_stages
from e2e.stages import Record
from e2e.storage import start_storage

OUT = ROOT / "e2e-output"
CLUSTER_SH = ROOT / "e2e" / "cluster.sh"
IMAGE_SH = ROOT / "e2e" / "image.sh"
LOCAL_BRIDGE = "10.244.0.1"  # the local cluster's cni0 address: pods reach the host here


def say(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make e2e", description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="leave the local cluster and the releases running")
    p.add_argument("--only", default=DEFAULT_ONLY, help="comma-separated groups or stages to run: first, ct, day2 "
                   "(default: first,ct; day2 needs first); `python -m e2e.stage_table` lists every stage")
    p.add_argument("--skip", default="", help="comma-separated stages or groups to leave out (each gets a row "
                   "'not run: skipped'; the stages that need one are 'not run: precondition unmet')")
    return p.parse_args(argv)


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def start_cluster(rec: Record, stack: list) -> tuple[Path, str, bool]:
    """The kubeconfig, the address pods reach this host on, and whether the cluster is ours (local)."""
    if os.environ.get("KUBECONFIG"):
        host = os.environ.get("E2E_STORAGE_HOST")
        if not host:
            raise StageError("KUBECONFIG is set but E2E_STORAGE_HOST is not: set it to an address of this machine "
                             "that the cluster's pods reach (the storage server listens there), or unset KUBECONFIG "
                             "to use the local cluster")
        rec.not_run("cluster start", "KUBECONFIG is set: its cluster is used")
        return Path(os.environ["KUBECONFIG"]), host, False
    if os.geteuid() != 0 or sys.platform != "linux":
        raise StageError("the local cluster needs root on Linux (containerd, the kubelet, iptables); "
                         "set KUBECONFIG to run against another cluster")
    with rec.stage("cluster start", "e2e/cluster.sh start: the local one-node cluster of real parts") as st:
        cdir = Path(tempfile.mkdtemp(prefix="gemma3-ray-e2e-cluster-"))
        stack.append(("cluster", cdir))
        out = run_script([str(CLUSTER_SH), "start", str(cdir)], OUT / "cluster.log", 600, "cluster start")
        kubeconfig = Path(out.strip().splitlines()[-1].split("=", 1)[1])
        st.detail = f"{cdir}"
    return kubeconfig, LOCAL_BRIDGE, True


def images(rec: Record, local: bool, kube: Kube) -> Images:
    if not local:
        head, worker = os.environ.get("E2E_HEAD_IMAGE"), os.environ.get("E2E_WORKER_IMAGE")
        if not (head and worker):
            raise StageError("set E2E_HEAD_IMAGE (Ray only) and E2E_WORKER_IMAGE (images/trainer/Dockerfile) "
                             "to images the cluster's nodes have")
        rec.not_run("images", "E2E_HEAD_IMAGE and E2E_WORKER_IMAGE name the images")
        return Images(head, worker)
    with rec.stage("images", "e2e/image.sh: the base and images/trainer/Dockerfile, no registry") as st:
        run_script([str(IMAGE_SH), "build"], OUT / "image.log", 3600, "image build")
        sock = (kube.kubeconfig.parent / "containerd.sock")
        run_script([str(IMAGE_SH), "import", str(sock)], OUT / "image.log", 900, "image import")
        head = run_script([str(IMAGE_SH), "name", "base"], OUT / "image.log", 60, "image name").strip()
        worker = run_script([str(IMAGE_SH), "name", "trainer"], OUT / "image.log", 60, "image name").strip()
        st.detail = f"head {head}, workers {worker}"
    return Images(head, worker)


def inputs(rec: Record, host: str, stack: list):
    with rec.stage("storage and inputs", "fake-gcs-server for the pods; the tiny Gemma 3 and sample data") as st:
        from demo.sample_data import build_sample_dataset
        from demo.tiny_model import build_tiny_gemma3

        root = OUT / "gcs"
        shutil.rmtree(root, ignore_errors=True)
        storage = start_storage(host, root, OUT / "gcs.log")
        stack.append(("storage", storage))
        storage.create_bucket(BUCKET)
        model = build_tiny_gemma3()
        data = build_sample_dataset(OUT / "inputs" / "data", n_rows=48, seed=0)
        n = storage.upload_tree(model, MODEL_URI) + storage.upload_tree(data, DATA_URI)
        st.detail = f"{storage.url}, {n} objects uploaded"
    return storage


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        reasons = select(args.only, args.skip)
        deadline = deadline_from_env(os.environ.get("E2E_DEADLINE"))
    except (SelectionError, StageError) as e:
        say(f"[e2e] {e}")
        return 2
    OUT.mkdir(exist_ok=True)
    (OUT / "e2e.log").write_text("")
    rec = Record(OUT, say)
    signal.signal(signal.SIGTERM, _sigterm)
    stack: list = []
    harness: Harness | None = None
    code = 1
    error = ""
    try:
        kubeconfig, host, local = start_cluster(rec, stack)
        kube = Kube(kubeconfig, OUT / "e2e.log", helm=os.environ.get("HELM", "helm"))
        imgs = images(rec, local, kube)
        storage = inputs(rec, host, stack)
        harness = Harness(kube, rec, storage, imgs, OUT)
        rec.facts["versions"] = _versions(kube)
        harness.missing.update(_kuberay_preflight(kube))
        run_stages(harness, rec, reasons, deadline=deadline)
        code = 0 if rec.ok else 1
    except StageError as e:
        error = str(e)
        say(f"[e2e] FAILED: {e}")
    except KeyboardInterrupt:
        say("[e2e] interrupted: cleaning up")
        code = 130
    finally:
        finish(rec, stop_reason(rec, code == 130, error), reasons=reasons)
        code = _cleanup(rec, harness, stack, args.keep, code)
    return code


def _kuberay_preflight(kube: Kube) -> dict[str, str]:
    from e2e.kuberay_stages import preflight

    return preflight(kube)


def _versions(kube: Kube) -> dict[str, str]:
    from e2e.chart_testing import ct_binary
    from e2e.versions import part_versions

    try:
        ct = ct_binary()
    except Exception:  # noqa: BLE001 - ct not built: its version is unknown, the run goes on
        ct = None
    return part_versions(kube, ct)


def _cleanup(rec: Record, harness: Harness | None, stack: list, keep: bool, code: int) -> int:
    problems: list[str] = []
    if harness is not None and not keep:
        try:
            problems += harness.cleanup()
        except (StageError, KeyboardInterrupt) as e:
            problems.append(f"cleanup of releases: {e}")
    for kind, obj in reversed(stack):
        if kind == "storage":
            obj.stop()
        elif kind == "cluster" and not keep:
            try:
                run_script([str(CLUSTER_SH), "stop", str(obj)], OUT / "cluster.log", 300, "cluster stop")
                shutil.rmtree(obj, ignore_errors=True)
            except StageError as e:
                problems.append(str(e))
        elif kind == "cluster":
            say(f"[e2e] --keep: the local cluster runs on; stop it with: e2e/cluster.sh stop {obj}")
    for p in problems:
        say(f"[e2e] cleanup: {p}")
    say("\n" + rec.table())
    say(f"[e2e] {rec.write().relative_to(ROOT)} (log: e2e-output/e2e.log)")
    return 1 if (code == 0 and problems) else code


if __name__ == "__main__":
    sys.exit(main())
