"""`gemma3-ray release` and a version the registry already holds (#47 item 3), against a real OCI registry
(distribution, the e2e's part; tests/oci_registry.py) with both Helm majors. A released version never changes:
the plan says whether the registry holds the version (read anonymously: no helm, no credentials) and refuses one it
holds with other contents; `--apply` checks again with `helm pull` and refuses, in one sentence and before anything
is packaged or pushed, the same version with other contents, or one it could not check. "Contents" is chart_digest's
rule applied to the registry's chart layer: the manifest digest differs for each `helm package` of the same chart.

Not tested here: a registry that hands out anonymous bearer tokens (Artifact Registry, ghcr.io): distribution needs
a token server for that; the plan's reader follows the standard challenge (chart_registry._bearer).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from gemma3_ray.config import chart_digest

from tests.oci_registry import free_port, running
from tests.plugin.test_chart_release import (  # the release command's test helpers
    CHART,
    HELMS,
    VERSION,
    _helm,
    _release,
)


def _manifest(host: str, repo: str, tag: str) -> str | None:
    req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return str(r.headers["Docker-Content-Digest"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _push_other_contents(helm: str, host: str, tmp_path: Path) -> str:
    """Someone released this version before with other contents: a template differs, the version is the same."""
    other = tmp_path / "other" / "gemma3-ray"
    shutil.copytree(CHART, other)
    (other / "templates" / "NOTES.txt").write_text((other / "templates" / "NOTES.txt").read_text() + "\nother\n")
    run = [helm, "package", str(other), "--destination", str(tmp_path / "other")]
    assert subprocess.run(run, capture_output=True, timeout=120).returncode == 0
    tgz = tmp_path / "other" / f"gemma3-ray-{VERSION}.tgz"
    pushed = subprocess.run([helm, "push", str(tgz), f"oci://{host}/team/charts", "--plain-http"], capture_output=True,
                            text=True, timeout=120)
    assert pushed.returncode == 0, pushed.stderr
    return chart_digest.archive_digest(tgz)


def test_the_plan_without_a_reachable_registry_says_it_could_not_check(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HELM_BIN", "/nonexistent/helm")  # the plan never runs helm
    rc, out, err = _release(["--registry", f"oci://127.0.0.1:{free_port()}/c", "--plain-http"], capsys)
    assert (rc, err) == (0, ""), err
    assert re.search(rf"^  \? oci://127\.0\.0\.1:\d+/c/gemma3-ray:{re.escape(VERSION)}: could not check whether the "
                     r"registry holds it \(the registry could not be reached: .*refused.*\); --apply checks with "
                     "helm's login before it pushes$", out, re.MULTILINE), out


@pytest.mark.parametrize("helm_name", list(HELMS))
def test_a_version_released_with_other_contents_is_refused_before_anything_is_pushed(
        helm_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    helm = _helm(monkeypatch, helm_name)
    repo, ours = "team/charts/gemma3-ray", chart_digest.content_digest(CHART)
    with running(tmp_path / "registry") as host:
        target = f"oci://{host}/{repo}:{VERSION}"
        rc, out, err = _release(["--registry", f"oci://{host}/team/charts", "--plain-http"], capsys)
        assert (rc, err) == (0, "") and f"  = {target} is not in the registry yet\n" in out, (out, err)

        theirs = _push_other_contents(helm, host, tmp_path)
        held = _manifest(host, repo, VERSION)
        said = (f"gemma3-ray: error: {target} is already released with other contents ({theirs}; this chart: {ours}): "
                "a released version never changes, so bump `version` in Chart.yaml and add its CHANGELOG.md entry; "
                "nothing was pushed.\n")
        for apply in ([], ["--apply"]):
            dest = tmp_path / f"dist{len(apply)}"
            rc, out, err = _release(["--registry", f"oci://{host}/team/charts", "--plain-http", "--destination",
                                     str(dest), *apply], capsys)
            assert (rc, err) == (1, said), (apply, out, err)
            assert "+ helm package" not in out and not dest.exists(), "refused before anything was packaged"
            assert _manifest(host, repo, VERSION) == held, "the registry's version is untouched"

        # The same contents under another path: pushed, then the plan says the registry holds them.
        rc, out, err = _release(["--registry", f"oci://{host}/mirror", "--plain-http", "--apply"], capsys)
        assert (rc, err) == (0, "") and f"  = oci://{host}/mirror/gemma3-ray:{VERSION} is not in the registry yet\n" in out
        assert re.search(r"^Digest: sha256:[0-9a-f]{64}$", out, re.MULTILINE), out
        rc, out, err = _release(["--registry", f"oci://{host}/mirror", "--plain-http"], capsys)
        assert (rc, err) == (0, "") and f"  = oci://{host}/mirror/gemma3-ray:{VERSION} is already in the registry " \
                                        "with these contents: pushing again only re-tags them\n" in out, out


def test_apply_refuses_a_version_it_could_not_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _helm(monkeypatch, "helm4")
    dest = tmp_path / "dist"
    rc, out, err = _release(["--registry", f"oci://127.0.0.1:{free_port()}/c", "--plain-http", "--destination",
                             str(dest), "--apply"], capsys)
    assert rc == 1 and "Digest:" not in out and not dest.exists(), out
    assert err.startswith("gemma3-ray: error: Could not check whether oci://127.0.0.1:") and \
        "is already released (helm pull failed: " in err and "connection refused" in err and \
        err.endswith("and run again; nothing was pushed.\n") and err.count("\n") == 1, err
