"""The chart as an OCI artifact: `helm package` (signed: Helm's provenance `.prov`), `helm push`, the digest.

Runs the helm binary itself (pyhelm3 has no package or push); every failure is one sentence and a run that
did not push never reports a digest.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gemma3_ray.utils.errors import EXIT_USAGE, UserError
from gemma3_ray.utils.tokens import shown

_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:]+\])"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"  # an OCI repository name's component
_REGISTRY = re.compile(rf"oci://({_HOST})(:\d{{1,5}})?((?:/{_PATH})*)/?")
_DIGEST = re.compile(r"^Digest:\s*(sha256:[0-9a-f]{64})\s*$", re.MULTILINE)
HELM_RUN_S = 300


class BadRegistry(UserError):
    exit_code = EXIT_USAGE


class ReleaseFailed(UserError):
    """helm package or helm push failed: nothing was pushed, or what was is named."""


@dataclass(frozen=True)
class Registry:
    """An OCI registry location ``oci://HOST[:PORT][/PATH]``; the chart lands at ``HOST[:PORT][/PATH]/NAME``."""

    url: str  # oci://HOST[:PORT][/PATH], no trailing slash

    def chart(self, name: str) -> str:
        return f"{self.url}/{name}"


@dataclass(frozen=True)
class Signing:
    key: str  # the key's name (uid) in the keyring, as `helm package --key` takes it
    keyring: Path  # a legacy GnuPG secret keyring (`gpg --export-secret-keys > secring.gpg`)


def registry(url: str | None) -> Registry:
    """``--registry``'s value checked: an ``oci://`` URL without credentials, else one sentence."""
    if not url:
        raise BadRegistry("--registry is missing: name the OCI registry to push the chart to, "
                          "--registry oci://HOST[:PORT]/PATH.")
    if "@" in url.split("//", 1)[-1].split("/", 1)[0]:
        raise BadRegistry("--registry holds credentials (the value is not shown): pass only oci://HOST[:PORT]/PATH and "
                          "log in with `helm registry login HOST` first.")
    if not url.startswith("oci://"):
        raise BadRegistry(f"--registry {shown(url)} is not an OCI registry URL: helm push pushes charts only to OCI "
                          "registries, give oci://HOST[:PORT]/PATH.")
    m = _REGISTRY.fullmatch(url)
    if not m:
        raise BadRegistry(f"--registry {shown(url)} is not oci://HOST[:PORT]/PATH with a path of lower-case letters, "
                          "digits and . _ - between slashes: fix the URL.")
    return Registry(f"oci://{m.group(1)}{m.group(2) or ''}{m.group(3)}")


def signing(key: str | None, keyring: str | None) -> Signing | None:
    """``--key`` and ``--keyring`` checked together (both or neither; the keyring a readable file), else one sentence."""
    if not key and not keyring:
        return None
    if not key:
        raise BadRegistry("--keyring needs --key NAME: the name (uid) of the signing key in that keyring.")
    if not keyring:
        raise BadRegistry("--key needs --keyring FILE: a GnuPG secret keyring in the legacy format Helm reads "
                          "(`gpg --export-secret-keys > secring.gpg`).")
    path = Path(keyring).expanduser()
    if not path.is_file():
        raise BadRegistry(f"--keyring {shown(keyring)} is not a file: export the secret key with "
                          "`gpg --export-secret-keys > secring.gpg` and pass that file.")
    return Signing(key, path)


def package_argv(helm: str, chart: Path, dest: Path, sign: Signing | None) -> list[str]:
    argv = [helm, "package", str(chart), "--destination", str(dest)]
    return argv + (["--sign", "--key", sign.key, "--keyring", str(sign.keyring)] if sign else [])


def push_argv(helm: str, tgz: Path, where: Registry, plain_http: bool) -> list[str]:
    return [helm, "push", str(tgz), where.url, *(["--plain-http"] if plain_http else [])]


def package(helm: str, chart: Path, dest: Path, file: str, sign: Signing | None) -> Path:
    """``helm package`` into ``dest``: the .tgz (and, signed, its .prov beside it)."""
    _run(package_argv(helm, chart, dest, sign), "helm package",
         "; nothing was pushed" + ("" if not sign else " (is the key's name in --keyring? a passphrase is read from "
                                   "$HELM_KEY_PASSPHRASE or the terminal)"))
    tgz = dest / file
    if not tgz.is_file() or (sign and not tgz.with_name(tgz.name + ".prov").is_file()):
        raise ReleaseFailed(f"helm package did not write {file}{' and its .prov' if sign else ''} in {shown(dest)}; "
                            "nothing was pushed.")
    return tgz


def push(helm: str, tgz: Path, where: Registry, plain_http: bool) -> str:
    """``helm push`` (the .prov beside the .tgz goes with it); the manifest digest helm reports."""
    out = _run(push_argv(helm, tgz, where, plain_http), "helm push",
               "; log in with `helm registry login HOST`, or pass --plain-http for a registry that speaks HTTP")
    m = _DIGEST.search(out)
    if not m:
        raise ReleaseFailed(f"helm push printed no digest (its output: {_helm_says(out)}): check the chart at "
                            f"{where.url} with `helm show chart {where.url}/NAME --version VERSION`.")
    return m.group(1)


def _run(argv: list[str], what: str, fix: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=HELM_RUN_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ReleaseFailed(f"{what} did not finish in {HELM_RUN_S} s{fix}.") from exc
    if done.returncode != 0:
        raise ReleaseFailed(f"{what} failed: {_helm_says(done.stderr or done.stdout)}{fix}.")
    return (done.stdout or "") + (done.stderr or "")


def _helm_says(text: str) -> str:
    """helm's own words: its last line (``Error: ...`` without the prefix)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "no output").removeprefix("Error: ").rstrip(".")
