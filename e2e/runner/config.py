"""What the environment asks of a run, checked before anything touches the cluster: with KUBECONFIG, the
values files and images given (E2E_VALUES, E2E_*_IMAGE, E2E_STORAGE_IMAGE); with E2E_BUCKET, this machine's
access to the bucket. A gap is one sentence."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from e2e.support.errors import StageError
from e2e.support.harness import OUT, Images
from e2e.support.record import Record
from e2e.support.session import RUN_ID
from e2e.support.storage import bucket as storage_bucket
from e2e.support.storage.bucket import BucketStorage


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


def check_bucket(rec: Record, bucket: tuple[str, str], stack: list) -> BucketStorage:
    """E2E_BUCKET: this machine's credentials read, write and delete under the run's prefix, before anything is
    made in the cluster; from here on the clean-up deletes that prefix."""
    storage = BucketStorage(*bucket, RUN_ID, OUT / "gcs")
    shutil.rmtree(storage.mirror, ignore_errors=True)
    storage.ensure()
    stack.append(("storage", storage))
    rec.facts["storage"] = {"mode": storage.mode, "root": storage.root}
    return storage
