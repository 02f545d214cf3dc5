"""KubeRay's K8sJobMode submitter command for a rendered RayJob, replayed in a real bash.

KubeRay (ray-operator/controllers/ray/common/job.go, BuildJobSubmitCommand in v1.7.0,
GetK8sJobCommand in v1.4.2) joins the words below with spaces and runs them as
`/bin/bash -ce "<command>"` (utils.GetContainerCommand): the runtime env JSON is one word quoted with
Go's strconv.Quote, the entrypoint is appended raw. Here `ray` is a shell function that prints the
words it receives, so the replay shows what `ray job submit` would get, and whether bash expanded
anything on the way.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import yaml

_GO_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
               "\t": "\\t", "\v": "\\v"}
_PRINT_ARGS = "import json, sys; print(json.dumps(sys.argv[1:]))"


def go_quote(text: str) -> str:
    """Go's strconv.Quote: a double-quoted string, printable characters verbatim."""
    out = []
    for ch in text:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) > 0xFF else f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def submit_command(rayjob: dict[str, Any], job_id: str = "rayjob-abc12", address: str = "http://head:8265") -> str:
    """The `ray job submit` part of KubeRay's K8sJobMode submitter command for this RayJob."""
    spec = rayjob["spec"]
    words = ["ray", "job", "submit", "--address", address, "--no-wait"]
    runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "")
    if runtime_env:
        words += ["--runtime-env-json", go_quote(json.dumps(runtime_env, separators=(",", ":"), ensure_ascii=False))]
    words += ["--submission-id", job_id, "--", spec["entrypoint"].strip(), ";"]
    return " ".join(words)


def replay(rayjob: dict[str, Any]) -> list[str]:
    """The argv `ray` receives when bash runs the submitter command (`ray` itself is not run)."""
    script = f'ray() {{ python3 -c {_shell_single(_PRINT_ARGS)} "$@"; }}\n{submit_command(rayjob)}'
    proc = subprocess.run(["/bin/bash", "-ce", script], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/")
    return json.loads(proc.stdout.splitlines()[-1])


def replayed_runtime_env(rayjob: dict[str, Any]) -> dict[str, Any]:
    argv = replay(rayjob)
    return json.loads(argv[argv.index("--runtime-env-json") + 1])


def _shell_single(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
