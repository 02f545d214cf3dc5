"""The Helm release, driven through pyhelm3 (which runs the helm binary): install/upgrade, uninstall."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path
from typing import Any

from gemma3_ray.utils.errors import (
    EXIT_USAGE,
    ClusterError,
    MissingBinary,
    NotFound,
    UserError,
    kube_unreachable,
)
from gemma3_ray.utils.paths import REPO_ROOT
from gemma3_ray.utils.tokens import shown

# The chart beside the plugin in this repository (plugin/ and charts/ are siblings).
DEFAULT_CHART = REPO_ROOT / "charts" / "gemma3-ray"
HELM_TIMEOUT = "10m"


def helm_executable() -> str:
    """The helm that runs us as a plugin ($HELM_BIN), else $HELM, else helm on PATH (checked before use)."""
    exe = os.environ.get("HELM_BIN") or os.environ.get("HELM") or "helm"
    found = shutil.which(exe)
    if found is None:
        raise MissingBinary(f"helm is not on PATH{f' (looked for {shown(exe)})' if exe != 'helm' else ''}: install Helm "
                            "3.8 or newer (https://helm.sh/docs/intro/install/), or set $HELM_BIN to its path; "
                            "nothing was changed.")
    return found


def client(kubeconfig: str | None, context: str | None) -> Any:
    from pyhelm3 import Client

    return Client(executable=helm_executable(), kubeconfig=Path(kubeconfig) if kubeconfig else None,
                  kubecontext=context, default_timeout=HELM_TIMEOUT)


def chart_path(chart: str | None) -> Path:
    path = Path(chart) if chart else DEFAULT_CHART
    if not (path / "Chart.yaml").is_file():
        raise NotFound(f"No chart at {shown(path)}: pass --chart with the path of charts/gemma3-ray.")
    return path


def _one(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The layers merged as Helm merges its -f files (a later list or scalar replaces, maps merge key by
    key), as one: pyhelm3 would merge several itself and concatenate their lists (a values file's
    capacity.fallback or workers.tolerations would add to the chart's instead of replacing them)."""
    from gemma3_ray.config.render import merged

    return [merged(values)] if values else []


async def _upgrade(helm: Any, release: str, chart: Path, values: list[dict[str, Any]], namespace: str) -> Any:
    loaded = await helm.get_chart(chart)
    return await helm.install_or_upgrade_release(release, loaded, *_one(values), namespace=namespace,
                                                 create_namespace=False, wait=False)


async def _template(helm: Any, release: str, chart: Path, values: list[dict[str, Any]], namespace: str) -> list[Any]:
    loaded = await helm.get_chart(chart)
    return list(await helm.template_resources(loaded, release, *_one(values), namespace=namespace))


def upgrade_install(helm: Any, release: str, chart: Path, values: list[dict[str, Any]], namespace: str) -> Any:
    try:
        return asyncio.run(_upgrade(helm, release, chart, values, namespace))
    except Exception as exc:
        raise _failed(f"helm upgrade --install {release}", exc) from exc


def template(helm: Any, release: str, chart: Path, values: list[dict[str, Any]], namespace: str) -> list[Any]:
    """What `up` would install, rendered by helm without a cluster (the chart's schema and templates)."""
    try:
        return asyncio.run(_template(helm, release, chart, values, namespace))
    except Exception as exc:
        raise InvalidValues(f"The chart rejects these values ({chart_complaint(exc)}): fix that value (in the values "
                            "file or a -f file) and run again; nothing was changed.") from exc


class InvalidValues(UserError):
    """The chart's schema or templates refuse the values (found before any change)."""

    exit_code = EXIT_USAGE


def chart_complaint(exc: Exception) -> str:
    """Helm's reason, in one line: the schema's complaints, or a template's `fail` message."""
    text = getattr(exc, "stderr", b"") or b""
    text = (text.decode(errors="replace") if isinstance(text, bytes) else str(text)) or str(exc)
    schema = [ln.strip()[2:] for ln in text.splitlines() if ln.strip().startswith("- ")]
    if schema:
        return "; ".join(schema)
    m = re.search(r"execution error at \([^)]*\): (.*)", text)
    return (m.group(1) if m else _first_line(exc)).strip().rstrip(".")


def exists(helm: Any, release: str, namespace: str) -> bool:
    """Whether the release is installed in the namespace (any status)."""
    from pyhelm3.errors import ReleaseNotFoundError

    try:
        asyncio.run(helm.get_current_revision(release, namespace=namespace))
    except ReleaseNotFoundError:
        return False
    except Exception as exc:
        raise _failed(f"helm status {release}", exc, "; check the kube context (`kubectl config current-context`)") from exc
    return True


def uninstall(helm: Any, release: str, namespace: str) -> None:
    """``helm uninstall`` (without waiting); an error is raised, never swallowed."""
    try:
        asyncio.run(helm.uninstall_release(release, namespace=namespace, wait=False))
    except Exception as exc:
        raise _failed(f"helm uninstall {release} -n {namespace}", exc) from exc


_UNREACHABLE_RE = re.compile(r'cluster unreachable: Get "https?://([^/"]+)[^"]*": (?:.*: )?([^:]+)$')


def _failed(what: str, exc: Exception, fix: str = "") -> UserError:
    """helm's failure as one sentence: an API server it cannot reach reads as everywhere else."""
    line = _first_line(exc)
    m = _UNREACHABLE_RE.search(line)
    if m:
        return kube_unreachable(m.group(1), m.group(2).strip())
    return ClusterError(f"{what} failed: {line}{fix}.")


def _first_line(exc: Exception) -> str:
    text = (getattr(exc, "stderr", b"") or b"")
    text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    return (text.strip() or str(exc)).splitlines()[0].removeprefix("Error: ").rstrip(".")
