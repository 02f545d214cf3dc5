"""gcsFuse: GKE's Cloud Storage FUSE CSI ephemeral volume in every Ray pod, with the sidecar annotation, the
training mount options and the release's service account; nothing of it when off."""

from __future__ import annotations

from collections.abc import Callable

from helm_render import CHART, Render, pod_templates

CI = CHART / "ci"


def _pods(r: Render):
    assert r.returncode == 0, r.stderr
    return pod_templates(r.one("RayJob"))


def test_off_by_default_nothing_of_it_is_rendered(render: Callable[..., Render]) -> None:
    for _, pod in _pods(render(CI / "default-values.yaml")):
        assert "gke-gcsfuse/volumes" not in (pod["metadata"].get("annotations") or {})
        assert all("csi" not in v for v in pod["spec"]["volumes"])


def test_every_ray_pod_mounts_the_bucket_as_gke_documents(render: Callable[..., Render]) -> None:
    r = render(CI / "default-values.yaml", sets={"gcsFuse.enabled": True, "gcsFuse.onlyDir": "datasets/products",
                                                  "head.podAnnotations.team": "vision"})
    pods = _pods(r)
    assert [role for role, _ in pods] == ["head", "worker:gpu-workers"]
    sa = r.one("ServiceAccount")["metadata"]["name"]
    for role, pod in pods:
        assert pod["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true", role
        assert pod["spec"]["serviceAccountName"] == sa  # Workload Identity: the sidecar acts as this KSA
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "gcs-fuse"]
        csi = volume["csi"]
        assert csi["driver"] == "gcsfuse.csi.storage.gke.io" and csi["readOnly"] is True
        attrs = csi["volumeAttributes"]
        options = attrs["mountOptions"].split(",")
        assert "metadata-cache:ttl-secs:-1" in options and "file-cache:max-size-mb:-1" in options
        assert options[-1] == "only-dir=datasets/products" and attrs["gcsfuseMetadataPrefetchOnMount"] == "true"
        assert attrs["bucketName"]
        mounts = [m for c in pod["spec"]["containers"] for m in c.get("volumeMounts", []) if m["name"] == "gcs-fuse"]
        assert mounts and all(m["mountPath"] == "/mnt/gcs" and m["readOnly"] is True for m in mounts)
    assert pods[0][1]["metadata"]["annotations"]["team"] == "vision"  # the pod's own annotations stay


def test_a_bad_folder_or_option_is_refused_at_install(render: Callable[..., Render]) -> None:
    r = render(CI / "default-values.yaml", sets={"gcsFuse.enabled": True, "gcsFuse.onlyDir": "a\\,b"})
    assert r.returncode != 0 and "gcsFuse/onlyDir" in r.stderr
    r = render(CI / "default-values.yaml", sets={"gcsFuse.mountOptions[0]": "implicit-dirs\\,rw"})
    assert r.returncode != 0 and "gcsFuse/mountOptions" in r.stderr
