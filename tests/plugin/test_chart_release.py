"""`gemma3-ray release` (#47 item 1): the chart's version rule, the plan (no helm run, nothing written, no
credentials), every bad input refused in one sentence naming the flag before anything is written, and `--apply`
against a real OCI registry (distribution, the e2e's part) with both Helm majors: packaged, signed with a
throwaway GnuPG key, pushed, the digest printed equal to the registry's own, and the chart pulled back by that
digest verified against its provenance (and refused against another key)."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from gemma3_ray import cli

from e2e.support.signing_key import Key, throwaway_key
from tests.oci_registry import running
from tests.plugin.conftest import ROOT

CHART = ROOT / "charts" / "gemma3-ray"
HELMS = {"helm4": ROOT / ".tools" / "bin" / "helm", "helm3": ROOT / ".tools" / "bin" / "helm3"}
VERSION = re.search(r"^version: (\S+)$", (CHART / "Chart.yaml").read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]


def _release(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(["release", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def no_helm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helm that cannot run: any call to it would fail the command (the plan must never need one)."""
    monkeypatch.setenv("HELM_BIN", "/nonexistent/helm")
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Key:
    if shutil.which("gpg") is None:
        pytest.skip("gpg is not installed: the signing test makes its throwaway key with it (apt-get install gnupg)")
    return throwaway_key(tmp_path_factory.mktemp("key"))


def test_the_plan_runs_no_helm_and_writes_nothing(no_helm: None, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    keyring = tmp_path / "secring.gpg"
    keyring.write_bytes(b"")  # only its existence is checked by the plan
    dest = tmp_path / "out"
    rc, out, err = _release(["--registry", "oci://registry.invalid:5000/team/charts", "--key", "Release Team",
                             "--keyring", str(keyring), "--destination", str(dest)], capsys)
    assert (rc, err) == (0, ""), err
    assert f"Release of chart gemma3-ray {VERSION} (appVersion " in out
    assert f"+ helm package: gemma3-ray-{VERSION}.tgz, signed with key 'Release Team'" in out
    assert f"+ helm push to oci://registry.invalid:5000/team/charts/gemma3-ray:{VERSION} with its provenance" in out
    assert out.rstrip().endswith("Apply with `gemma3-ray release --apply` (same flags).")
    assert "Dry run: nothing changed (2 change(s) planned)." in out
    assert not dest.exists()


def _chart_copy(tmp_path: Path, **fields: str) -> Path:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart, symlinks=False)
    text = (chart / "Chart.yaml").read_text()
    for field, value in fields.items():
        text, n = re.subn(rf"^{field}: .*$", f"{field}: {value}", text, flags=re.MULTILINE)
        assert n == 1
    (chart / "Chart.yaml").write_text(text)
    return chart


BAD = {
    "no registry": ([], "--registry is missing"),
    "https": (["--registry", "https://registry.invalid/charts"], "--registry 'https://registry.invalid/charts' is not "
              "an OCI registry URL"),
    "bare host": (["--registry", "registry.invalid/charts"], "give oci://HOST[:PORT]/PATH"),
    "credentials": (["--registry", "oci://me:s3cr3tpass@registry.invalid/charts"], "--registry holds credentials "
                    "(the value is not shown)"),
    "upper-case path": (["--registry", "oci://registry.invalid/Charts"], "with a path of lower-case letters"),
    "key alone": (["--registry", "oci://registry.invalid/c", "--key", "k"], "--key needs --keyring FILE"),
    "keyring alone": (["--registry", "oci://registry.invalid/c", "--keyring", "/etc/hostname"], "--keyring needs --key"),
    "missing keyring": (["--registry", "oci://registry.invalid/c", "--key", "k", "--keyring", "/nonexistent/secring.gpg"],
                        "--keyring '/nonexistent/secring.gpg' is not a file: export the secret key with"),
    "appVersion": (["--registry", "oci://registry.invalid/c"], "Chart.yaml appVersion '2.1.0' is not the Ray version "
                   "the trainer pins"),
    "version": (["--registry", "oci://registry.invalid/c"], "Chart.yaml version '1.0' is not SemVer"),
    "unbumped": (["--registry", "oci://registry.invalid/c"], "was recorded with other contents (the chart's templates, "
                 "schema, values or trainer changed): bump `version` in Chart.yaml"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_one_sentence_before_anything_is_written(case: str, no_helm: None, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv, said = BAD[case]
    fields = {"appVersion": '"2.1.0"'} if case == "appVersion" else {"version": "1.0"} if case == "version" else {}
    chart = _chart_copy(tmp_path, **fields) if fields or case == "unbumped" else CHART
    if case == "unbumped":  # a template changed, the version not bumped
        (chart / "templates" / "NOTES.txt").write_text((chart / "templates" / "NOTES.txt").read_text() + "\nplanted\n")
    dest = tmp_path / "out"
    rc, out, err = _release([*argv, "--chart", str(chart), "--destination", str(dest), "--apply"], capsys)
    assert rc == 2 and out == "", (out, err)
    assert said in err and err.count("\n") == 1 and err.startswith("gemma3-ray: error: "), err
    assert "s3cr3tpass" not in err and "Traceback" not in err
    assert not dest.exists()
    if case == "appVersion":
        ray = re.search(r"^ray\[[^\]]*\]==(\S+)$", (CHART / "files/trainer/requirements.txt").read_text(), re.MULTILINE)
        assert f'set `appVersion: "{ray.group(1)}"` in Chart.yaml' in err  # type: ignore[union-attr]


def _helm(monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    helm = HELMS[name]
    if not helm.exists():
        pytest.skip(f"{helm} is not installed: `make tools`")
    monkeypatch.setenv("HELM_BIN", str(helm))
    return str(helm)


def _manifest_digest(host: str, repo: str, tag: str) -> str:
    req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(r.headers["Docker-Content-Digest"])


@pytest.mark.parametrize("helm_name", list(HELMS))
def test_apply_signs_pushes_and_prints_a_digest_that_verifies(helm_name: str, key: Key, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    helm = _helm(monkeypatch, helm_name)
    with running(tmp_path / "registry") as host:
        dest = tmp_path / "dist"
        rc, out, err = _release(["--registry", f"oci://{host}/team/charts", "--key", key.name, "--keyring",
                                 str(key.secring), "--plain-http", "--destination", str(dest), "--apply"], capsys)
        assert (rc, err) == (0, ""), err
        digest = re.search(r"^Digest: (sha256:[0-9a-f]{64})$", out, re.MULTILINE).group(1)  # type: ignore[union-attr]
        assert digest == _manifest_digest(host, "team/charts/gemma3-ray", VERSION)
        ref = f"oci://{host}/team/charts/gemma3-ray@{digest}"
        assert f"  helm install gemma3-ray {ref} --plain-http\n" in out
        chart = f"oci://{host}/team/charts/gemma3-ray"
        assert f"  helm pull {chart} --version {VERSION} --plain-http --verify --keyring PUBRING.gpg\n" in out
        tgz = dest / f"gemma3-ray-{VERSION}.tgz"
        verified = subprocess.run([helm, "verify", str(tgz), "--keyring", str(key.pubring)], capture_output=True,
                                  text=True, timeout=60)
        assert verified.returncode == 0 and f"Signed by: {key.name}" in verified.stdout, verified.stderr
        # What a consuming team runs, as printed: the provenance checked by version, its Digest the pinned one ...
        (tmp_path / "pulled").mkdir()
        pull = ["pull", chart, "--version", VERSION, "--plain-http", "--verify", "-d", str(tmp_path / "pulled")]
        pulled = subprocess.run([helm, *pull, "--keyring", str(key.pubring)], capture_output=True, text=True, timeout=120)
        assert pulled.returncode == 0 and f"Digest: {digest}" in pulled.stdout + pulled.stderr, pulled.stderr
        assert (tmp_path / "pulled" / tgz.name).read_bytes() == tgz.read_bytes()
        # ... refused against a key that did not sign it (the verification can fail) ...
        other = throwaway_key(tmp_path / "other", "someone else")
        refused = subprocess.run([helm, *pull, "--keyring", str(other.pubring)], capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode != 0, refused.stdout
        # ... and the digest reference that `helm install` takes names that same chart.
        shown = subprocess.run([helm, "show", "chart", ref, "--plain-http"], capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0 and f"version: {VERSION}" in shown.stdout, shown.stderr


def test_a_failed_push_reports_no_digest(key: Key, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Partial failure never reports success: checked, packaged and signed, the push to a registry that serves
    pulls but refuses pushes (distribution's read-only mode) fails in one sentence."""
    _helm(monkeypatch, "helm4")
    with running(tmp_path / "registry", readonly=True) as host:
        rc, out, err = _release(["--registry", f"oci://{host}/c", "--key", key.name, "--keyring",
                                 str(key.secring), "--plain-http", "--apply"], capsys)
    assert rc == 1 and "Digest:" not in out and "helm install" not in out and "packaged gemma3-ray-" in out, out
    assert err.startswith("gemma3-ray: error: helm push failed: ") and err.count("\n") == 1, err
