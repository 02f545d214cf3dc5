"""Checks of `make e2e` that could pass while their claim was false (issue #42, "What to build" 5 and 6): a listing
the API server refuses is a failure, not "nothing left"; the NOTES ledger says "ran" only for lines a stage ran.

kubectl is a stand-in script here answering as the API server does for a ServiceAccount without the right
(Forbidden, exit 1) or an overloaded one (a 5xx); no cluster runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from e2e.support.errors import StageError
from e2e.support.kube import Kube


def _kubectl(tmp_path: Path, stderr: str, rc: int) -> Kube:
    exe = tmp_path / "kubectl"
    exe.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo '{stderr}' >&2
        exit {rc}
        """))
    exe.chmod(0o755)
    return Kube(tmp_path / "kubeconfig", tmp_path / "log", kubectl=str(exe))


@pytest.mark.parametrize("said", [
    'Error from server (Forbidden): rayjobs.ray.io is forbidden: User "dev" cannot list resource "rayjobs"',
    "Error from server (InternalError): an error on the server (\"\") has prevented the request from succeeding",
])
def test_a_listing_the_cluster_refuses_fails_instead_of_reading_as_nothing(tmp_path: Path, said: str) -> None:
    """Before: `uninstall` passed and the run printed "left on the cluster: nothing" when kubectl could not list."""
    kube = _kubectl(tmp_path, said, 1)
    with pytest.raises(StageError) as e:
        kube.gone("ns", "app.kubernetes.io/instance=e2e", ["rayjobs", "pods"])
    assert said.split(":")[0] in str(e.value) and "rayjobs" in str(e.value)


def test_an_empty_listing_is_nothing_left(tmp_path: Path) -> None:
    assert _kubectl(tmp_path, "", 0).gone("ns", "a=b", ["pods"]) == []


MANIFEST = """---
# Source: gemma3-ray/templates/serviceaccount.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: e2e-gemma3-ray
---
apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: e2e-r1
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: e2e-unlabelled
"""


def test_uninstall_checks_every_object_the_manifest_names_labelled_or_not(tmp_path: Path) -> None:
    """Before: `uninstall` looked only at objects labelled app.kubernetes.io/instance, so an object of the release
    without that label (here a NetworkPolicy) could stay while the stage passed. kubectl stands in, answering that
    the NetworkPolicy is still there."""
    from e2e.support.kube import manifest_refs

    refs = manifest_refs(MANIFEST)
    assert refs == ["serviceaccount/e2e-gemma3-ray", "rayjob.v1.ray.io/e2e-r1",
                    "networkpolicy.v1.networking.k8s.io/e2e-unlabelled"]
    exe = tmp_path / "kubectl"
    exe.write_text('#!/bin/sh\nprintf "%s " "$@" > "$0.args"\necho networkpolicy.networking.k8s.io/e2e-unlabelled\n')
    exe.chmod(0o755)
    kube = Kube(tmp_path / "kubeconfig", tmp_path / "log", kubectl=str(exe))
    assert kube.present("ns", refs) == ["networkpolicy.networking.k8s.io/e2e-unlabelled"]
    assert (tmp_path / "kubectl.args").read_text().split()[:3] == ["-n", "ns", "get"]
    assert "--ignore-not-found" in (tmp_path / "kubectl.args").read_text()


def test_a_refused_lookup_of_the_manifests_objects_fails(tmp_path: Path) -> None:
    kube = _kubectl(tmp_path, "Error from server (Forbidden): networkpolicies is forbidden", 1)
    with pytest.raises(StageError, match="cannot be known"):
        kube.present("ns", ["networkpolicy.v1.networking.k8s.io/x"])
