"""The setup stages of `make e2e`, the table's first four rows: the cluster (the local one started, or
$KUBECONFIG's), the images, the preflight of what the cluster offers, and the run's storage with the tiny
Gemma 3 and the sample data. Each fills in the Harness the later stages are given (h.kube, h.images,
h.session, h.storage); what the clean-up must undo goes on h.setup.stack."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from e2e.support.errors import NotRun, StageError
from e2e.support.harness import DATA_KEY, MODEL_KEY, OUT, ROOT, Harness, Images, run_script
from e2e.support.kube import Kube
from e2e.support.preflight import preflight
from e2e.support.record import say
from e2e.support.session import Session
from e2e.support.storage.bucket import BucketStorage
from e2e.support.storage.emulator import EmulatorStorage
from e2e.support.storage.run_storage import RunStorage

CLUSTER_SH = ROOT / "e2e" / "cluster" / "cluster.sh"
IMAGE_SH = ROOT / "e2e" / "build" / "image.sh"
STORAGE_NAMESPACE = "g3r-e2e-storage"  # + the run id


def _kube(h: Harness, kubeconfig: Path) -> Kube:
    return Kube(kubeconfig, h.out_dir / "e2e.log", helm=os.environ.get("HELM", "helm"))


def cluster_start(h: Harness) -> str:
    """The local one-node cluster, started (KUBECONFIG set: its cluster, and this row is not run); h.kube."""
    if os.environ.get("KUBECONFIG"):
        h.kube = _kube(h, Path(os.environ["KUBECONFIG"]))
        raise NotRun("KUBECONFIG is set: its cluster is used")
    if os.geteuid() != 0 or sys.platform != "linux":
        raise StageError("the local cluster needs root on Linux (containerd, the kubelet, iptables); "
                         "set KUBECONFIG to run against another cluster")
    cdir = Path(tempfile.mkdtemp(prefix="gemma3-ray-e2e-cluster-"))
    h.setup.stack.append(("cluster", cdir))
    out = run_script([str(CLUSTER_SH), "start", str(cdir)], OUT / "cluster.log", 600, "cluster start")
    h.kube = _kube(h, Path(out.strip().splitlines()[-1].split("=", 1)[1]))
    return f"{cdir}"


def images(h: Harness) -> str:
    """The local cluster: the images built here, imported into its containerd (pulled never), and the storage
    image; h.images. KUBECONFIG set: not run (the values name the images its nodes pull)."""
    if os.environ.get("KUBECONFIG"):
        raise NotRun("KUBECONFIG is set: the cluster pulls the images E2E_VALUES / E2E_*_IMAGE name")
    run_script([str(IMAGE_SH), "build"], OUT / "image.log", 3600, "image build")
    sock = (h.kube.kubeconfig.parent / "containerd.sock")
    run_script([str(IMAGE_SH), "import", str(sock)], OUT / "image.log", 900, "image import")
    head, worker, storage = (run_script([str(IMAGE_SH), "name", n], OUT / "image.log", 60, "image name").strip()
                             for n in ("base", "trainer", "storage"))
    h.images, h.setup.storage_image = Images(head, worker, "Never"), storage
    h.extra_values = [Path(f).resolve() for f in os.environ.get("E2E_VALUES", "").split(",") if f.strip()]
    return f"head {head}, workers {worker}, storage {storage}"


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


def check_cluster(h: Harness) -> str:
    """The run's session and its Lease; what the cluster has (KubeRay, Kueue, a worker node, the parts' versions),
    recorded for the stages' preconditions; what runs whose Lease expired left removed."""
    session = h.session = Session(h.kube)
    rec = h.record
    rec.facts["run_id"] = session.run_id
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
    session.start()  # the run's Lease, before it makes anything: it is alive for every other run
    gone = session.leftovers_first()
    if gone:
        say(f"[e2e] preflight: {gone}")
    session.snapshot()
    rec.facts["versions"] = _versions(h.kube)
    h.missing.update(_kuberay_preflight(h.kube))
    return (f"server {facts.server}; KubeRay {facts.kuberay}; Kueue {facts.kueue or 'absent'}; worker node "
            f"{facts.worker_node or 'none'}; run id {session.run_id}" + (f"; {gone}" if gone else ""))


def _kuberay_preflight(kube: Kube) -> dict[str, str]:
    from e2e.stages.kuberay import preflight

    return preflight(kube)


def _versions(kube: Kube) -> dict[str, str]:
    from e2e.stages.chart_testing import ct_binary
    from e2e.support.versions import part_versions

    try:
        ct = ct_binary()
    except Exception:  # noqa: BLE001 - ct not built: its version is unknown, the run goes on
        ct = None
    return part_versions(kube, ct)


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


def storage_and_inputs(h: Harness) -> str:
    """The run's storage (E2E_BUCKET's prefix, else the emulator in the cluster), the tiny Gemma 3 and the
    sample data uploaded to it; h.storage."""
    from localkit.sample_data import build_sample_dataset
    from localkit.tiny_model import build_tiny_gemma3

    s = h.setup
    storage = h.storage = open_storage(h, h.session, s.storage_image, h.images.pull_policy or "IfNotPresent",
                                       s.stack, s.bucket)
    model = build_tiny_gemma3()
    data = build_sample_dataset(OUT / "inputs" / "data", n_rows=48, seed=0)
    n = storage.upload_tree(model, storage.uri(MODEL_KEY)) + storage.upload_tree(data, storage.uri(DATA_KEY))
    return f"{storage.describe()}, {n} objects uploaded"
