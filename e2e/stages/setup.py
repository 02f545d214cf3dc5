"""The setup stages of `make e2e`: the cluster (the local one started, or $KUBECONFIG's), the images, the
preflight of what the cluster offers, and the run's storage with the tiny Gemma 3 and the sample data."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from e2e.support.errors import StageError
from e2e.support.harness import DATA_KEY, MODEL_KEY, OUT, ROOT, Harness, Images, run_script
from e2e.support.kube import Kube
from e2e.support.preflight import preflight
from e2e.support.record import Record, say
from e2e.support.session import RUN_ID, Session
from e2e.support.storage import bucket as storage_bucket
from e2e.support.storage.bucket import BucketStorage
from e2e.support.storage.emulator import EmulatorStorage
from e2e.support.storage.run_storage import RunStorage

CLUSTER_SH = ROOT / "e2e" / "cluster" / "cluster.sh"
IMAGE_SH = ROOT / "e2e" / "build" / "image.sh"
STORAGE_NAMESPACE = "g3r-e2e-storage"  # + the run id


def any_cluster_config(bucket: tuple[str, str] | None = None) -> tuple[list[Path], Images, str]:
    """With KUBECONFIG: the values files, the images given as references, the storage emulator's image ('' with
    E2E_BUCKET, whose values files must set the Workload Identity annotation). A gap is one sentence, before
    anything touches the cluster."""
    files = [Path(f).expanduser().resolve() for f in os.environ.get("E2E_VALUES", "").split(",") if f.strip()]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise StageError(f"E2E_VALUES names {', '.join(missing)}, which is not a file: give chart values files, "
                         "comma-separated (e2e/build/image.sh push writes one)")
    import yaml

    given: dict = {}
    docs: list[dict] = []
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text()) or {}
        except yaml.YAMLError as e:
            raise StageError(f"E2E_VALUES {f}: not YAML ({str(e).splitlines()[0]})") from e
        if not isinstance(doc, dict):
            raise StageError(f"E2E_VALUES {f}: a values file is a mapping, this is {type(doc).__name__}")
        docs.append(doc)
        given.update({g: ((doc.get(g) or {}).get("image") or {}) for g in ("head", "workers") if doc.get(g)})
    imgs = Images(os.environ.get("E2E_HEAD_IMAGE") or None, os.environ.get("E2E_WORKER_IMAGE") or None)
    if not imgs.worker and not (given.get("workers") or {}).get("repository"):
        raise StageError("KUBECONFIG is set but no training image is named: set workers.image (and head.image) in a "
                         "values file given as E2E_VALUES=extra.yaml (e2e/build/image.sh push REGISTRY extra.yaml writes "
                         "one), or E2E_WORKER_IMAGE=registry/repo:tag, an image the cluster's nodes can pull")
    if bucket is not None:
        storage_bucket.require_gsa(docs)
        return files, imgs, ""
    storage = os.environ.get("E2E_STORAGE_IMAGE", "")
    if not storage:
        raise StageError("KUBECONFIG is set but E2E_STORAGE_IMAGE is not: name the fake-gcs-server image the "
                         "cluster's nodes pull (e2e/build/image.sh push prints E2E_STORAGE_IMAGE=...); it runs in the "
                         "cluster as the stand-in for Cloud Storage")
    return files, imgs, storage


def start_cluster(rec: Record, stack: list) -> tuple[Path, bool]:
    """The kubeconfig and whether the cluster is ours (local)."""
    if os.environ.get("KUBECONFIG"):
        rec.not_run("cluster start", "KUBECONFIG is set: its cluster is used")
        return Path(os.environ["KUBECONFIG"]), False
    if os.geteuid() != 0 or sys.platform != "linux":
        raise StageError("the local cluster needs root on Linux (containerd, the kubelet, iptables); "
                         "set KUBECONFIG to run against another cluster")
    with rec.stage("cluster start", "e2e/cluster/cluster.sh start: the local one-node cluster of real parts") as st:
        cdir = Path(tempfile.mkdtemp(prefix="gemma3-ray-e2e-cluster-"))
        stack.append(("cluster", cdir))
        out = run_script([str(CLUSTER_SH), "start", str(cdir)], OUT / "cluster.log", 600, "cluster start")
        kubeconfig = Path(out.strip().splitlines()[-1].split("=", 1)[1])
        st.detail = f"{cdir}"
    return kubeconfig, True


def local_images(rec: Record, kube: Kube) -> tuple[Images, str]:
    """The local cluster: the images built here, imported into its containerd (pulled never); the storage image."""
    with rec.stage("images", "e2e/build/image.sh: the base, images/trainer/Dockerfile and fake-gcs-server, imported") as st:
        run_script([str(IMAGE_SH), "build"], OUT / "image.log", 3600, "image build")
        sock = (kube.kubeconfig.parent / "containerd.sock")
        run_script([str(IMAGE_SH), "import", str(sock)], OUT / "image.log", 900, "image import")
        head, worker, storage = (run_script([str(IMAGE_SH), "name", n], OUT / "image.log", 60, "image name").strip()
                                 for n in ("base", "trainer", "storage"))
        st.detail = f"head {head}, workers {worker}, storage {storage}"
    return Images(head, worker, "Never"), storage


def rayjob_spec(kube: Kube, values: list[Path], imgs: Images) -> dict:
    """The RayJob spec the chart renders with these values (what the cluster's KubeRay must know)."""
    import yaml

    args = ["template", "preflight", str(ROOT / "charts" / "gemma3-ray")]
    for v in values:
        args += ["-f", str(v)]
    for k, v in imgs.sets().items():
        args += ["--set-string", f"{k}={v}"]
    out = kube.h(*args, timeout=120, what="helm template (the RayJob the chart renders)").stdout
    for doc in yaml.safe_load_all(out):
        if doc and doc.get("kind") == "RayJob":
            return doc["spec"]
    raise StageError("helm template of the chart with the e2e values rendered no RayJob")


def check_cluster(rec: Record, h: Harness, session: Session) -> None:
    with rec.stage("preflight", "the cluster has KubeRay (CRDs, version), Kueue, a worker node; a killed run's "
                                "leftovers removed") as st:
        facts = preflight(h.kube, rayjob_spec(h.kube, h.values_files(), h.images))
        h.cluster = facts
        rec.facts["cluster"] = facts.as_dict()
        if facts.kuberay_problem:
            raise StageError(facts.kuberay_problem)
        # the stage table's preconditions (`requires`): a stage needing what is missing is "not run" with why
        h.missing.update({k: v for k, v in (("kueue", facts.kueue_problem),
                                            ("cordonable node", facts.worker_problem)) if v})
        for gap in (facts.kueue_problem, facts.worker_problem):
            if gap:
                say(f"[e2e] preflight: {gap}")
        gone = session.leftovers_first()
        if gone:
            say(f"[e2e] preflight: {gone}")
        session.snapshot()
        st.detail = (f"server {facts.server}; KubeRay {facts.kuberay}; Kueue {facts.kueue or 'absent'}; worker node "
                     f"{facts.worker_node or 'none'}; run id {session.run_id}" + (f"; {gone}" if gone else ""))


def check_bucket(rec: Record, bucket: tuple[str, str], stack: list) -> BucketStorage:
    """E2E_BUCKET: this machine's credentials read, write and delete under the run's prefix, before anything is
    made in the cluster; from here on the clean-up deletes that prefix."""
    storage = BucketStorage(*bucket, RUN_ID, OUT / "gcs")
    shutil.rmtree(storage.mirror, ignore_errors=True)
    storage.ensure()
    stack.append(("storage", storage))
    rec.facts["storage"] = {"mode": storage.mode, "root": storage.root}
    return storage


def open_storage(h: Harness, session: Session, image: str, pull_policy: str, stack: list,
                 bucket: BucketStorage | None = None) -> RunStorage:
    """The run's storage, started: E2E_BUCKET's (checked already; nothing made in the cluster), else the
    emulator, a Deployment in a namespace of the run."""
    if bucket is not None:
        if ("storage", bucket) not in stack:
            stack.append(("storage", bucket))
        bucket.start()
        return bucket
    root = OUT / "gcs"
    shutil.rmtree(root, ignore_errors=True)
    ns = h.namespace(session.name(STORAGE_NAMESPACE))
    storage = EmulatorStorage(h.kube, ns, image, pull_policy, root, OUT / "gcs.log", session.labels)
    stack.append(("storage", storage))
    storage.start()
    storage.ensure()
    return storage


def inputs(rec: Record, h: Harness, session: Session, image: str, pull_policy: str, stack: list,
           bucket: BucketStorage | None = None) -> RunStorage:
    what = "the run's prefix of E2E_BUCKET" if bucket is not None else "fake-gcs-server in the cluster"
    with rec.stage("storage and inputs", f"{what}; the tiny Gemma 3 and sample data") as st:
        from localkit.sample_data import build_sample_dataset
        from localkit.tiny_model import build_tiny_gemma3

        storage = open_storage(h, session, image, pull_policy, stack, bucket)
        model = build_tiny_gemma3()
        data = build_sample_dataset(OUT / "inputs" / "data", n_rows=48, seed=0)
        n = storage.upload_tree(model, storage.uri(MODEL_KEY)) + storage.upload_tree(data, storage.uri(DATA_KEY))
        st.detail = f"{storage.describe()}, {n} objects uploaded"
    return storage

