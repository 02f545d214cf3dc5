"""`make e2e`: the chart on a real Kubernetes with the real KubeRay operator and Kueue, stage by stage.

Against $KUBECONFIG when set: any cluster that runs KubeRay (and Kueue for its stages), with the images
in a registry its nodes pull from, named by E2E_VALUES (chart values files, comma-separated; e2e/image.sh
push writes one) or E2E_HEAD_IMAGE/E2E_WORKER_IMAGE, and E2E_STORAGE_IMAGE (fake-gcs-server, run in the
cluster), or E2E_BUCKET=gs://NAME[/prefix] (a real bucket the pods reach through Workload Identity; the run
writes under its own prefix there and deletes it at the end). Else the local one-node cluster of
e2e/cluster.sh, started here and stopped on every exit path.
Ends with a table of stages (time, pass/fail), what is left on the cluster (nothing), and writes it as
JSON to e2e-output/summary.json. Exit 0 only when every stage passed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from e2e import proc, storage_bucket
from e2e.harness import DATA_KEY, MODEL_KEY, ROOT, Harness, Images, run_script
from e2e.kube import Kube, StageError
from e2e.preflight import preflight
from e2e.session import RUN_ID, Busy, Session, take_lock
from e2e.stage_table import DEFAULT_ONLY, SelectionError, deadline_from_env, finish, select, stop_reason
from e2e.stage_table import run as run_stages
from e2e.stages import Record
from e2e.storage import RunStorage
from e2e.storage_bucket import BucketStorage
from e2e.storage_emulator import EmulatorStorage

OUT = Path(os.environ.get("E2E_OUTPUT") or ROOT / "e2e-output")  # summary.json, logs
CLUSTER_SH = ROOT / "e2e" / "cluster.sh"
IMAGE_SH = ROOT / "e2e" / "image.sh"
STORAGE_NAMESPACE = "g3r-e2e-storage"  # + the run id


def say(msg: str) -> None:
    with contextlib.suppress(OSError):  # the terminal went away (SIGHUP): the log and summary.json still say it
        print(msg, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make e2e", description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="leave the local cluster and the releases running")
    p.add_argument("--only", default=DEFAULT_ONLY, help="comma-separated groups or stages to run: first, ct, day2 "
                   "(default: first,ct; day2 needs first); `python -m e2e.stage_table` lists every stage")
    p.add_argument("--skip", default="", help="comma-separated stages or groups to leave out (each gets a row "
                   "'not run: skipped'; the stages that need one are 'not run: precondition unmet')")
    return p.parse_args(argv)


def any_cluster_config(bucket: tuple[str, str] | None = None) -> tuple[list[Path], Images, str]:
    """With KUBECONFIG: the values files, the images given as references, the storage emulator's image ('' with
    E2E_BUCKET, whose values files must set the Workload Identity annotation). A gap is one sentence, before
    anything touches the cluster."""
    files = [Path(f).expanduser().resolve() for f in os.environ.get("E2E_VALUES", "").split(",") if f.strip()]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise StageError(f"E2E_VALUES names {', '.join(missing)}, which is not a file: give chart values files, "
                         "comma-separated (e2e/image.sh push writes one)")
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
                         "values file given as E2E_VALUES=extra.yaml (e2e/image.sh push REGISTRY extra.yaml writes "
                         "one), or E2E_WORKER_IMAGE=registry/repo:tag, an image the cluster's nodes can pull")
    if bucket is not None:
        storage_bucket.require_gsa(docs)
        return files, imgs, ""
    storage = os.environ.get("E2E_STORAGE_IMAGE", "")
    if not storage:
        raise StageError("KUBECONFIG is set but E2E_STORAGE_IMAGE is not: name the fake-gcs-server image the "
                         "cluster's nodes pull (e2e/image.sh push prints E2E_STORAGE_IMAGE=...); it runs in the "
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
    with rec.stage("cluster start", "e2e/cluster.sh start: the local one-node cluster of real parts") as st:
        cdir = Path(tempfile.mkdtemp(prefix="gemma3-ray-e2e-cluster-"))
        stack.append(("cluster", cdir))
        out = run_script([str(CLUSTER_SH), "start", str(cdir)], OUT / "cluster.log", 600, "cluster start")
        kubeconfig = Path(out.strip().splitlines()[-1].split("=", 1)[1])
        st.detail = f"{cdir}"
    return kubeconfig, True


def local_images(rec: Record, kube: Kube) -> tuple[Images, str]:
    """The local cluster: the images built here, imported into its containerd (pulled never); the storage image."""
    with rec.stage("images", "e2e/image.sh: the base, images/trainer/Dockerfile and fake-gcs-server, imported") as st:
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


def tools_missing(environ: dict[str, str] | os._Environ) -> str:
    """One sentence naming a command-line tool the run needs and cannot find, else "" (helm: $HELM or PATH)."""
    helm = environ.get("HELM") or "helm"
    if not shutil.which(helm, path=environ.get("PATH")):
        if environ.get("HELM"):
            return f"HELM={helm} is not an executable: point HELM at a Helm 3 or 4 binary, or unset it and run make e2e"
        return ("helm is not on PATH: run make e2e (it installs Helm into .tools/bin and puts it first), or put "
                "Helm 3 or 4 on PATH / name it with HELM=")
    if not shutil.which("kubectl", path=environ.get("PATH")):
        return "kubectl is not on PATH: install kubectl (any version the cluster supports) and run make e2e again"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        reasons = select(args.only, args.skip)
        missing = tools_missing(os.environ)
        if missing:
            raise StageError(missing)
        deadline = deadline_from_env(os.environ.get("E2E_DEADLINE"))
        bucket = storage_bucket.bucket_from_env(os.environ)
    except (SelectionError, StageError) as e:
        say(f"[e2e] {e}")
        return 2
    try:  # before anything is written: a second run must not touch the first's log, storage or names
        lock = take_lock()
    except Busy as e:
        say(f"[e2e] refused: {e}")
        return 2
    # `gemma3-ray` as the stages run it is this checkout's plugin (the venv's editable install may be another's)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "plugin"), os.environ.get("PYTHONPATH")]))
    OUT.mkdir(exist_ok=True)
    (OUT / "e2e.log").write_text("")
    rec = Record(OUT, say)
    proc.install()  # ^C, SIGTERM, SIGHUP: the clean-up runs to its end
    stack: list = []
    harness: Harness | None = None
    session: Session | None = None
    code = 1
    error = ""
    try:
        extra: list[Path] = []
        bucket_storage: BucketStorage | None = None
        if os.environ.get("KUBECONFIG"):
            extra, imgs, storage_image = any_cluster_config(bucket)
        if bucket is not None:  # credentials and the bucket checked before anything is made in the cluster
            bucket_storage = check_bucket(rec, bucket, stack)
        kubeconfig, local = start_cluster(rec, stack)
        kube = Kube(kubeconfig, OUT / "e2e.log", helm=os.environ.get("HELM", "helm"))
        if local:
            imgs, storage_image = local_images(rec, kube)
            extra = [Path(f).resolve() for f in os.environ.get("E2E_VALUES", "").split(",") if f.strip()]
        else:
            rec.not_run("images", "KUBECONFIG is set: the cluster pulls the images E2E_VALUES / E2E_*_IMAGE name")
        session = Session(kube)
        rec.facts["run_id"] = session.run_id
        harness = Harness(kube, rec, None, imgs, OUT, extra_values=extra, session=session)
        check_cluster(rec, harness, session)
        harness.storage = inputs(rec, harness, session, storage_image, imgs.pull_policy or "IfNotPresent", stack,
                                 bucket_storage)
        rec.facts["versions"] = _versions(kube)
        harness.missing.update(_kuberay_preflight(kube))
        run_stages(harness, rec, reasons, deadline=deadline)
        code = 0 if rec.ok else 1
    except StageError as e:
        error = str(e)
        say(f"[e2e] FAILED: {e}")
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        say(f"[e2e] interrupted ({proc.signal.Signals(signum).name}): cleaning up; it runs to its end")
        code = 128 + signum
    finally:
        finish(rec, stop_reason(rec, code in (129, 130, 143), error), reasons=reasons)
        with proc.shielded(say):
            code = _cleanup(rec, harness, session, stack, args.keep, code)
        lock.close()
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


def _cleanup(rec: Record, harness: Harness | None, session: Session | None, stack: list, keep: bool,
             code: int) -> int:
    say = rec.say
    problems: list[str] = []
    objs: list = []
    stores: list[RunStorage] = [obj for kind, obj in stack if kind == "storage"]
    if harness is not None and session is not None and not keep and session.before:
        try:
            from e2e.shared_cluster import PRIORITY_CLASSES

            objs = session.cluster_objects(harness.namespaces, list(PRIORITY_CLASSES))
        except StageError as e:
            problems.append(f"listing the run's cluster-scoped objects: {e}")
    for obj in reversed(stores):
        obj.stop()  # the port-forward; the emulator's Deployment goes with its namespace
    if harness is not None and not keep:
        try:
            problems += harness.cleanup()
            if session is not None:
                problems += session.delete(objs, [])
        except StageError as e:
            problems.append(f"cleanup of releases: {e}")
    for obj in stores:  # E2E_BUCKET: the run's prefix, after the releases (no pod writes there any more)
        if keep and obj.mode == "bucket":
            say(f"[e2e] --keep: the run's objects stay in {obj.root}/; delete them with: gcloud storage rm -r "
                f"{obj.root}/")
        elif not keep:
            problems += [f"deleting {obj.root}/: {p}" for p in obj.cleanup()]
    if (session is not None or stores) and not keep:
        left: list[str] = []
        if session is not None:
            try:
                left = session.left()
            except StageError as e:
                left = [f"(could not ask the cluster: {e})"]
            say(f"[e2e] left on the cluster: {', '.join(left) if left else 'nothing'}")
        for obj in stores:
            if obj.mode == "bucket":
                in_bucket = obj.left()
                say(f"[e2e] left in the bucket: {', '.join(in_bucket) if in_bucket else 'nothing'}")
                left += in_bucket
        rec.facts["left"] = left
        if left:
            problems.append(f"left: {', '.join(left)}")
    for kind, obj in reversed(stack):
        if kind == "storage":
            continue
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
    say(f"[e2e] {rec.write()} (log: {OUT / 'e2e.log'})")
    return 1 if (code == 0 and problems) else code


if __name__ == "__main__":
    sys.exit(main())
