"""What the chart would run: the trainer files, entry point and runtime env of a rendered release.

``helm template`` renders the chart; this module takes the trainer files from the rendered trainer
ConfigMap, the entry point and runtime environment from the rendered RayJob, and the path where the
job submitter pod mounts that ConfigMap (the runtime env's working_dir, which ``ray job submit``
uploads) with the volume's items (each flat key's path in the package's folders) from the RayJob's
submitter pod template. Nothing here knows the chart's internals beyond the Kubernetes objects it renders.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from localkit.errors import LocalKitError

TRAINER_COMPONENT = "trainer-code"
ENTRY_MODULE = "trainer.vision_train"  # the entry point runs `python -m trainer.vision_train` in the working_dir
# Packages whose local build may differ from the pin: CPU machines use the local CPU torch wheel.
PIN_EXEMPT = {"torch": "the local CPU build; the pin is the GPU image's"}
# The trainer's flag naming what the Ray Train workers install (chart: dependencies and
# rayJob.runtimeEnv.installer), its value for "nothing", and the flag with the extra requirements.
INSTALLER_FLAG = "installer"
NO_INSTALLER = "none"
EXTRA_PIP_FLAG = "extra_pip"
WORKER_ENV_MODULE = "trainer.job.worker_runtime_env"  # the trainer's module that builds the workers' runtime env
# Run in the working directory (the ConfigMap's files as the kubelet writes them): that copy's own code.
WORKER_ENV_CALL = """
import json, sys
from trainer.job.worker_runtime_env import worker_runtime_env
print(json.dumps(worker_runtime_env(sys.argv[1], json.loads(sys.argv[2]))))
"""


# Helm's schema errors: Helm 4 ("- at '/a/b': why", nested) and Helm 3 ("- a.b: why").
_COMPOSITE = re.compile(r"'(anyOf|allOf|oneOf)' failed|Must validate (at least one|all the|one and only one) schema")
_HELM4 = re.compile(r"^- at '(?P<path>[^']*)': (?P<why>.*)$")
_HELM3 = re.compile(r"^- (?P<path>[A-Za-z0-9_.\-\[\]/]+): (?P<why>.*)$")
_EXTRA_KEY = re.compile(r"additional propert(?:y|ies) '?([A-Za-z0-9_.\-]+)'? (?:is )?not allowed", re.I)




@dataclass
class ChartJob:
    """The parts of a rendered release that a local run runs: its trainer files, entry point and runtime env."""

    rendered: str
    configmap_name: str
    files: dict[str, str]
    mount_path: str  # where the submitter pod mounts the ConfigMap: the runtime env's working_dir
    items: dict[str, str]  # ConfigMap key -> its path under mount_path (the volume's items)
    entrypoint: str
    runtime_env: dict[str, Any]
    flags: dict[str, str] = field(default_factory=dict)

    @property
    def num_workers(self) -> int:
        return int(self.flags.get("num_workers", "1"))

    @property
    def storage_path(self) -> str:
        return self.flags.get("storage_path", "")


def render_chart(helm: str, chart: Path, values: Path, set_string: dict[str, str] | None = None,
                 set_values: dict[str, str] | None = None, release: str = "local") -> str:
    """``helm template`` output for ``chart`` with ``values`` (plus ``--set-string``/``--set`` overrides)."""
    cmd = [helm, "template", release, str(chart), "-f", str(values)]
    for key, value in (set_string or {}).items():
        cmd += ["--set-string", f"{key}={value}"]
    for key, value in (set_values or {}).items():
        cmd += ["--set", f"{key}={value}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise LocalKitError(f"helm not found at {helm}: run `make setup` (it installs Helm into .tools/bin)") from e
    if proc.returncode != 0:
        given = "".join(f" --set {k}={v}" for k, v in (set_values or {}).items())
        raise LocalKitError(f"`helm template` failed for {values}{given}: {helm_refusal(proc.stderr, chart)}")
    return proc.stdout


def _schema_node(schema: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in [p for p in dotted.split(".") if p]:
        node = ((node or {}).get("properties") or {}).get(part)
        if node is None:
            return None
    return node


def _reason(schema: dict[str, Any], path: str, why: str) -> str:
    node = _schema_node(schema, path) or {}
    found = re.search(r"Range: ([^.]*(?:\.\d[^.]*)*)\.", node.get("description", ""))
    if found:
        return f"{path} must be {found.group(1)}"
    extra = _EXTRA_KEY.search(why)
    if extra:
        known = sorted(node.get("properties") or {})
        close = difflib.get_close_matches(extra.group(1), known, n=1)
        hint = f" (did you mean {path}.{close[0]}?)" if close else ""
        return f"{path}.{extra.group(1)} is not a key the chart knows{hint}"
    return f"{path or 'the values'}: {why}"


def helm_refusal(stderr: str, chart: Path) -> str:
    """Helm's refusal as one sentence: per field, its range (from the schema) or Helm's own reason."""
    text = stderr.strip()
    failed = re.search(r"execution error at \([^)]*\): (.*)", text)
    if failed:  # a fail of the chart's validate templates: already one sentence
        return failed.group(1).strip()
    if "don't meet the specifications of the schema" not in text:
        return (text.splitlines() or ["(no message)"])[0].removeprefix("Error: ")
    try:
        schema = json.loads((chart / "values.schema.json").read_text())
    except (OSError, ValueError):
        schema = {}
    reasons: dict[str, str] = {}
    for line in text.splitlines():
        m = _HELM4.match(line.strip()) or _HELM3.match(line.strip())
        if not m:
            continue
        path = m.group("path").strip("/").replace("/", ".")
        if _COMPOSITE.search(m.group("why")):
            reasons.setdefault(path, "")
        elif not reasons.get(path):
            reasons[path] = m.group("why")
    return "; ".join(_reason(schema, path, why) for path, why in reasons.items()) or text.splitlines()[0]


def _documents(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if isinstance(d, dict)]


def _one(docs: list[dict[str, Any]], what: str, pred) -> dict[str, Any]:
    found = [d for d in docs if pred(d)]
    if len(found) != 1:
        raise LocalKitError(f"the rendered chart has {len(found)} {what}; expected exactly one")
    return found[0]


def _items(rayjob: dict[str, Any], configmap_name: str, keys: list[str]) -> dict[str, str]:
    """Each ConfigMap key's path in the submitter's volume: its items, else the key itself (Kubernetes' default)."""
    pod = (rayjob["spec"].get("submitterPodTemplate") or {}).get("spec") or {}
    volumes = [v["configMap"] for v in pod.get("volumes") or [] if (v.get("configMap") or {}).get("name") == configmap_name]
    if len(volumes) != 1:
        raise LocalKitError(f"the rendered RayJob's submitter has {len(volumes)} volumes of ConfigMap {configmap_name}; "
                        "expected one")
    items = volumes[0].get("items")
    if items is None:
        return {key: key for key in keys}
    paths = {i["key"]: i["path"] for i in items}
    if set(paths) != set(keys):
        raise LocalKitError(f"the submitter's volume items name keys {sorted(set(paths) ^ set(keys))} that the "
                        "ConfigMap does not hold, or leave out some it does: every trainer file must be mounted")
    return paths


def _mount_path(rayjob: dict[str, Any], configmap_name: str, runtime_env: dict[str, Any]) -> str:
    """Where the submitter pod mounts the trainer ConfigMap; it must be the runtime env's working_dir."""
    pod = (rayjob["spec"].get("submitterPodTemplate") or {}).get("spec") or {}
    volumes = {v["name"] for v in pod.get("volumes") or [] if (v.get("configMap") or {}).get("name") == configmap_name}
    paths = {m["mountPath"].rstrip("/") for c in pod.get("containers") or [] for m in c.get("volumeMounts") or []
             if m["name"] in volumes}
    working_dir = str(runtime_env.get("working_dir") or "").rstrip("/")
    if len(paths) != 1 or paths != {working_dir}:
        raise LocalKitError(
            f"the rendered RayJob's submitter mounts ConfigMap {configmap_name} at {sorted(paths) or 'no path'} and its "
            f"runtime env's working_dir is {working_dir or 'unset'}; the job must carry the ConfigMap's files as its "
            "working_dir (one mount, the same path)"
        )
    return working_dir


def entry_module(entrypoint: str) -> str:
    """The module the entry point runs (``python -m <module> ...``)."""
    words = shlex.split(entrypoint)
    if words[:2] != ["python", "-m"] or len(words) < 3:
        raise LocalKitError(f"the rendered entry point {entrypoint[:80]!r} is not `python -m <module> ...`")
    return words[2]


def entry_args(entrypoint: str) -> list[str]:
    """The trainer's arguments: the entry point's words after ``python -m <module>``."""
    entry_module(entrypoint)
    return shlex.split(entrypoint)[3:]


def module_path(module: str) -> str:
    """``trainer.vision_train`` -> ``trainer/vision_train.py``: where its file sits under the working_dir."""
    return module.replace(".", "/") + ".py"


def parse_flags(entrypoint: str) -> dict[str, str]:
    """``--name=value`` words of the entry point (values unquoted as a shell would)."""
    flags: dict[str, str] = {}
    for word in shlex.split(entrypoint):
        if word.startswith("--") and "=" in word:
            name, value = word[2:].split("=", 1)
            flags[name] = value
    return flags


def parse_chart_job(rendered: str) -> ChartJob:
    """Pick the trainer ConfigMap and the RayJob out of ``helm template`` output."""
    docs = _documents(rendered)
    configmap = _one(
        docs,
        "trainer ConfigMaps (kind ConfigMap, label app.kubernetes.io/component=trainer-code)",
        lambda d: d.get("kind") == "ConfigMap"
        and (d.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/component") == TRAINER_COMPONENT,
    )
    rayjob = _one(docs, "RayJobs", lambda d: d.get("kind") == "RayJob")
    files = dict(configmap.get("data") or {})
    spec = rayjob["spec"]
    name = configmap["metadata"]["name"]
    items = _items(rayjob, name, list(files))
    entry = module_path(entry_module(spec["entrypoint"]))
    if entry not in items.values():
        raise LocalKitError(
            f"the trainer ConfigMap mounts no {entry}, which the entry point runs (it mounts {sorted(items.values())}): "
            "run `make sync-trainer` so the chart carries trainer/"
        )
    runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}
    return ChartJob(
        rendered=rendered,
        configmap_name=name,
        files=files,
        items=items,
        mount_path=_mount_path(rayjob, name, runtime_env),
        entrypoint=spec["entrypoint"],
        runtime_env=runtime_env,
        flags=parse_flags(spec["entrypoint"]),
    )


def write_files(job: ChartJob, dest: Path) -> list[Path]:
    """Write the ConfigMap's files to ``dest`` as the submitter pod sees them (the kubelet's layout).

    The kubelet writes a ConfigMap volume atomically: each key at its item path in a timestamped
    ``..<time>/`` directory, a ``..data`` link to it, and one link per item path's first part into
    ``..data/`` (here ``trainer -> ..data/trainer``). Returns the files' paths as the pod sees them.
    """
    dest.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    (dest / stamp).mkdir()
    out, tops = [], set()
    for key, text in sorted(job.files.items()):
        rel = job.items[key]
        parts = Path(rel).parts
        if "/" in key or key.startswith(".") or rel.startswith("/") or any(p.startswith(".") for p in parts):
            raise LocalKitError(f"unexpected file {key!r} (at {rel!r}) in the trainer ConfigMap")
        real = dest / stamp / rel
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_bytes(text.encode())
        real.chmod(0o444)
        out.append(dest / rel)
        tops.add(parts[0])
    (dest / "..data").symlink_to(stamp)
    for top in sorted(tops):
        (dest / top).symlink_to(f"..data/{top}")
    return out


def as_kuberay_submits(entrypoint: str) -> str:
    """The entry point as the job receives it from KubeRay's submitter.

    The submitter runs ``ray job submit ... -- <entrypoint>`` in bash (word splitting, quote removal);
    ``ray job submit`` joins the words again with ``subprocess.list2cmdline`` and the job runs that
    string with ``/bin/sh``. A local run submits the same string.
    """
    return subprocess.list2cmdline(shlex.split(entrypoint))


@dataclass
class PinCheck:
    requirement: str
    installed: str | None
    ok: bool
    note: str = ""


def check_pins(packages: list[str]) -> list[PinCheck]:
    """Check every pip requirement of the runtime env against this Python's installed packages."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    checks = []
    for line in packages:
        req = Requirement(line)
        try:
            have: str | None = version(req.name)
        except PackageNotFoundError:
            have = None
        if have is not None and req.name.lower() in PIN_EXEMPT:
            checks.append(PinCheck(line, have, True, PIN_EXEMPT[req.name.lower()]))
            continue
        ok = have is not None and req.specifier.contains(have, prereleases=True)
        checks.append(PinCheck(line, have, ok))
    return checks


def worker_packages(job: ChartJob, working_dir: Path) -> list[str]:
    """What the job's Ray Train workers would install: the trainer's own worker_runtime_env (the ConfigMap's
    copy, imported in ``working_dir`` as the job's driver imports it) for the rendered --installer and --extra_pip."""
    installer = job.flags.get(INSTALLER_FLAG, NO_INSTALLER)
    if installer == NO_INSTALLER:
        return []
    if module_path(WORKER_ENV_MODULE) not in job.items.values():
        raise LocalKitError(f"the trainer ConfigMap has no {module_path(WORKER_ENV_MODULE)}: run `make sync-trainer`")
    extra = job.flags.get(EXTRA_PIP_FLAG) or "[]"
    proc = subprocess.run([sys.executable, "-c", WORKER_ENV_CALL, installer, extra], cwd=working_dir,
                          capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LocalKitError(f"the chart's trainer could not build the workers' runtime env: {last}")
    return list(json.loads(proc.stdout)[installer]["packages"])


def local_entrypoint(job: ChartJob) -> str:
    """The rendered entry point with ``--installer=none`` and no ``--extra_pip``: the local Python has the
    pins already (local_runtime_env checks them), so the workers install nothing."""
    words = []
    for word in shlex.split(job.entrypoint):
        name = word[2:].split("=", 1)[0] if word.startswith("--") else None
        if name == EXTRA_PIP_FLAG:
            continue
        words.append(f"--{INSTALLER_FLAG}={NO_INSTALLER}" if name == INSTALLER_FLAG else word)
    return shlex.join(words)


def local_runtime_env(job: ChartJob, working_dir: Path, extra_env: dict[str, str]) -> tuple[dict[str, Any], list[PinCheck]]:
    """The runtime env to submit locally: the rendered one, with what the workers would install verified.

    Raises LocalKitError when the local Python does not satisfy a pin (installing packages into a local
    cluster's workers would take minutes and the network; ``make setup`` installs the pins); submit
    ``local_entrypoint(job)`` with it, so the workers install nothing.
    """
    env = dict(job.runtime_env)
    checks = check_pins(worker_packages(job, working_dir))
    bad = [c for c in checks if not c.ok]
    if bad:
        lines = "\n".join(f"  {c.requirement}: installed {c.installed or 'nothing'}" for c in bad)
        raise LocalKitError(
            "the chart's Ray Train workers would install packages this Python does not have:\n"
            f"{lines}\nrun `make setup` (it installs trainer/requirements.txt into .venv)"
        )
    unknown = set(env) - {"env_vars", "config", "working_dir", "excludes"}
    if unknown:
        raise LocalKitError(f"the rendered runtime env has fields the local kit does not reproduce: {sorted(unknown)}")
    env["working_dir"] = str(working_dir)  # the submitter's mount of the ConfigMap, here a local copy
    env["env_vars"] = {**(env.get("env_vars") or {}), **extra_env}
    return env, checks
