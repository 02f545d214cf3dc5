"""`make e2e`: the chart on a real Kubernetes with the real KubeRay operator and Kueue, stage by stage.

Against $KUBECONFIG when set: any cluster that runs KubeRay (and Kueue for its stages), with the images
in a registry its nodes pull from, named by E2E_VALUES (chart values files, comma-separated; e2e/build/image.sh
push writes one) or E2E_HEAD_IMAGE/E2E_WORKER_IMAGE, and E2E_STORAGE_IMAGE (fake-gcs-server, run in the
cluster), or E2E_BUCKET=gs://NAME[/prefix] (a real bucket the pods reach through Workload Identity; the run
writes under its own prefix there and deletes it at the end). Else the local one-node cluster of
e2e/cluster/cluster.sh, started here and stopped on every exit path.
Ends with a table of stages (time, pass/fail), what is left on the cluster (nothing), and writes it as
JSON to e2e-output/summary.json (written after every stage). Its result and the exit code agree: 0 pass (every
selected stage passed, nothing left), 1 fail (a stage failed, an error, something left), 3 not run (a selected
stage did not run: E2E_DEADLINE, or the cluster lacks what it needs), 128 + N after signal N (a fail), 2 refused
before anything ran (a bad flag or variable, another run on this machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from e2e.runner.cleanup import cleanup
from e2e.runner.config import any_cluster_config, check_bucket
from e2e.runner.table import DEFAULT_ONLY, SelectionError, deadline_from_env, finish, select, stop_reason
from e2e.runner.table import run as run_stages
from e2e.support import proc
from e2e.support.deadline import CLEANUP_RESERVE_S
from e2e.support.errors import StageError
from e2e.support.harness import OUT, ROOT, Harness, Images, Setup
from e2e.support.record import EXIT, Record, say
from e2e.support.session import Busy, take_lock
from e2e.support.storage import bucket as storage_bucket


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make e2e", description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="leave the local cluster and the releases running")
    p.add_argument("--only", default=DEFAULT_ONLY, help="comma-separated groups or stages to run: first, ct, day2, release, fleet, "
                   "shared "
                   "(default: first,ct; day2 needs first); `python -m e2e.runner.table` lists every stage")
    p.add_argument("--skip", default="", help="comma-separated stages or groups to leave out (each gets a row "
                   "'not run: skipped'; the stages that need one are 'not run: precondition unmet')")
    return p.parse_args(argv)


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
    if deadline is not None:  # the stages' work stops CLEANUP_RESERVE_S before it (support/deadline.py)
        rec.facts["deadline"] = {"E2E_DEADLINE": deadline, "stages_stop": deadline - CLEANUP_RESERVE_S}
    proc.install()  # ^C, SIGTERM, SIGHUP: the clean-up runs to its end
    stack: list = []  # what the clean-up undoes, in order (the setup stages add to it)
    harness: Harness | None = None
    signum, error = 0, ""
    try:
        extra: list[Path] = []
        imgs, storage_image, bucket_storage = Images(), "", None
        if os.environ.get("KUBECONFIG"):
            extra, imgs, storage_image = any_cluster_config(bucket)
        if bucket is not None:  # credentials and the bucket checked before anything is made in the cluster
            bucket_storage = check_bucket(rec, bucket, stack)
        harness = Harness(None, rec, None, imgs, OUT, extra_values=extra,  # type: ignore[arg-type]
                          setup=Setup(stack, storage_image, bucket_storage))
        run_stages(harness, rec, reasons, deadline=deadline)  # the setup rows first: the cluster, images, storage
    except StageError as e:
        error = str(e)
        if not rec.failed:  # a stage's own failure is its row; anything else is the run's error
            rec.errors.append(f"error: {error.splitlines()[0][:300]}")
        say(f"[e2e] FAILED: {e}")
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        rec.errors.append(f"interrupted ({proc.signal.Signals(signum).name})")
        say(f"[e2e] interrupted ({proc.signal.Signals(signum).name}): cleaning up; it runs to its end")
    except Exception as e:  # noqa: BLE001 - a defect of the runner: one line here, its traceback in the log
        rec.log_traceback()
        error = f"{type(e).__name__}: {e}"
        rec.errors.append(f"unexpected error (a defect of the e2e harness; traceback in e2e.log): {error}")
        say(f"[e2e] FAILED: {error} (a defect of the e2e harness; traceback in {OUT / 'e2e.log'})")
    finally:
        with proc.shielded(say):
            finish(rec, stop_reason(rec, bool(signum), error), reasons=reasons)
            session = harness.session if harness is not None else None
            cleanup(rec, harness if session is not None else None, session, stack, args.keep)
        lock.close()
    result = rec.verdict()[0]
    return 128 + signum if signum else EXIT[result]
