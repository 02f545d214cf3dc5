"""The version of every real part the run used, for summary.json: read from what runs, never from our pins.

Kubelet, container runtime and kube-proxy from the node's own status; the API server from its /version;
KubeRay, Kueue and CoreDNS from their Deployment's image in the cluster, or, run on this host (the local
cluster), from the Go build info inside the running binary (/proc/PID/exe); Helm and ct from themselves.
A part that cannot be read is "unknown (why)".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

# part -> (a word in its Deployment's image, the host binary's name, its Go module)
OPERATORS = {
    "KubeRay": ("kuberay/operator", "ray-operator", "github.com/ray-project/kuberay/ray-operator"),
    "Kueue": ("kueue", "kueue", "sigs.k8s.io/kueue"),
    "CoreDNS": ("coredns", "coredns", "github.com/coredns/coredns"),
}
_MAGIC = b"\xff Go buildinf:"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def go_modules(binary: bytes) -> dict[str, str]:
    """The module versions a Go binary was built with (its build info, as `go version -m` prints them):
    path -> version, for the main module and every dependency (a replaced one: the replacement's version)."""
    at = binary.find(_MAGIC)
    if at < 0 or not binary[at + 15] & 0x2:  # flags bit 1: the strings follow inline (Go 1.18+)
        return {}
    i = at + 32
    n, i = _varint(binary, i)
    i += n  # the Go version
    n, i = _varint(binary, i)
    info = binary[i:i + n].decode(errors="replace")
    out: dict[str, str] = {}
    for line in info.splitlines():
        f = line.split("\t")
        if f[0] in ("mod", "dep") and len(f) >= 3:  # noqa: PLR2004 - kind, path, version[, sum]
            out[f[1]] = f[2]
        elif f[0] == "=>" and len(f) >= 3 and out:  # noqa: PLR2004 - the line before was replaced
            out[list(out)[-1]] = f[2]
    return out


def host_binary_version(name: str, module: str, proc: Path = Path("/proc")) -> str:
    """The module version of a binary called `name` running on this host ('' when none runs)."""
    for pid in proc.iterdir() if proc.is_dir() else []:
        if not pid.name.isdigit():
            continue
        try:
            exe = os.readlink(pid / "exe")
            if Path(exe.removesuffix(" (deleted)")).name != name:
                continue
            version = go_modules((pid / "exe").read_bytes()).get(module, "")
        except OSError:
            continue
        if version:
            return f"{version} (host process {pid.name}, Go build info)"
    return ""


def image_tag(deployments: list[dict[str, Any]], word: str) -> str:
    """The tag of the first container image of a Deployment whose image names `word` ('' when none)."""
    for d in deployments:
        for c in d["spec"]["template"]["spec"].get("containers", []):
            image = c.get("image", "")
            repo = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image.split("@")[0]
            if re.search(rf"(^|/){re.escape(word)}$", repo):
                tag = image.split("@")[0].split("/")[-1].partition(":")[2]
                ns = d["metadata"]["namespace"]
                return f"{tag or image} (Deployment {ns}/{d['metadata']['name']})"
    return ""


def _run(argv: list[str], env: dict[str, str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return proc.stdout.strip() if proc.returncode == 0 else f"unknown ({_last_line(proc.stderr or proc.stdout)})"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][-200:] if lines else "no output"


def part_versions(kube: Any, ct: str | None) -> dict[str, str]:
    """Every real part's version, each read from the running part (see the module's docstring)."""
    env = kube.environ()
    out: dict[str, str] = {}
    try:
        nodes = kube.items("nodes", None)
        info = [n["status"].get("nodeInfo", {}) for n in nodes]
        out["kubelet"] = ", ".join(sorted({i.get("kubeletVersion", "?") for i in info})) or "unknown (no node)"
        out["container runtime"] = ", ".join(sorted({i.get("containerRuntimeVersion", "?") for i in info}))
        out["kube-proxy"] = ", ".join(sorted({i.get("kubeProxyVersion", "?") for i in info if i.get("kubeProxyVersion")}))
    except Exception as e:  # noqa: BLE001 - a summary field, never a failed run
        out["kubelet"] = f"unknown ({_last_line(str(e))})"
    version = _run([kube.kubectl, "version", "-o", "json"], env)
    try:
        out["kube-apiserver"] = json.loads(version)["serverVersion"]["gitVersion"]
    except (ValueError, KeyError):
        out["kube-apiserver"] = version
    try:
        deployments = kube.items("deployments", None)
    except Exception:  # noqa: BLE001
        deployments = []
    for part, (word, binary, module) in OPERATORS.items():
        out[part] = (image_tag(deployments, word) or host_binary_version(binary, module)
                     or f"unknown (no Deployment image named {word} in the cluster, no {binary} process on this host)")
    out["Helm"] = _run([kube.helm, "version", "--template", "{{.Version}}"], env)
    if ct:
        got = _run([ct, "version"], env)
        m = re.search(r"Version:\s*(\S+)", got)
        out["ct"] = m.group(1) if m else got
    return out
