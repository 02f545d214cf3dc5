"""The chart's release rule, read from its files: `version` is SemVer, `appVersion` is the trainer's Ray pin.

The rule `gemma3-ray release` checks before it packages anything (charts/gemma3-ray/README.md, "Releases"):

- ``version`` is SemVer 2 (``MAJOR.MINOR.PATCH[-PRE][+BUILD]``, what Helm and OCI tags accept);
- ``appVersion`` equals the Ray version of the trainer the chart ships: the ``ray[...]==X`` pin of
  ``files/trainer/requirements.txt``, the one source of the images' tags and the RayCluster's ``rayVersion``
  (the trainer has no version string of its own; what it runs on is that pin);
- CHANGELOG.md has an entry for ``version`` whose recorded content digest is the chart's (``chart_digest``):
  templates, schema, values or trainer changed since that version was recorded means a new version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML

from gemma3_ray.config import chart_digest
from gemma3_ray.utils.errors import EXIT_USAGE, UserError
from gemma3_ray.utils.tokens import shown

SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")
REQUIREMENTS = Path("files") / "trainer" / "requirements.txt"
_RAY_PIN = re.compile(r"^ray(\[[^\]]*\])?==(\S+)\s*$", re.MULTILINE)


class ChartVersionError(UserError):
    """The chart's version fields break the release rule (found before anything is packaged)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class ChartMeta:
    name: str
    version: str
    app_version: str
    path: Path

    @property
    def package(self) -> str:
        """The file `helm package` writes: NAME-VERSION.tgz."""
        return f"{self.name}-{self.version}.tgz"


def read(chart: Path) -> ChartMeta:
    """Chart.yaml's name, version and appVersion (strings as Helm reads them)."""
    try:
        doc = YAML(typ="safe").load((chart / "Chart.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, ValueError) as exc:
        raise ChartVersionError(f"Cannot read {shown(chart / 'Chart.yaml')} ({exc}): pass --chart with the path of "
                                "charts/gemma3-ray.") from exc
    return ChartMeta(str(doc.get("name", "")), str(doc.get("version", "")), str(doc.get("appVersion", "")), chart)


def ray_pin(chart: Path) -> str:
    """The Ray version the shipped trainer pins (``ray[...]==X`` in files/trainer/requirements.txt)."""
    path = chart / REQUIREMENTS
    found = _RAY_PIN.findall(path.read_text(encoding="utf-8")) if path.is_file() else []
    if len(found) != 1:
        raise ChartVersionError(f"{shown(path)} has {'no' if not found else 'more than one'} `ray[...]==VERSION` "
                                "line: the chart's appVersion is that pin, so pin Ray there exactly once.")
    return str(found[0][1])


def check(chart: Path) -> ChartMeta:
    """The chart's version fields, or one sentence naming the field and the fix (nothing is read twice)."""
    meta = read(chart)
    if not SEMVER.fullmatch(meta.version):
        raise ChartVersionError(f"Chart.yaml version {meta.version!r} is not SemVer: set `version: MAJOR.MINOR.PATCH` "
                                "(e.g. 0.2.0) in Chart.yaml.")
    ray = ray_pin(chart)
    if meta.app_version != ray:
        raise ChartVersionError(f"Chart.yaml appVersion {meta.app_version!r} is not the Ray version the trainer pins "
                                f"({ray}, files/trainer/requirements.txt): set `appVersion: \"{ray}\"` in Chart.yaml.")
    check_recorded(chart, meta.version)
    return meta


def check_recorded(chart: Path, version: str) -> None:
    """CHANGELOG.md records this version's content digest, and it is the chart's; else one sentence."""
    record = chart_digest.recorded(chart)
    if version not in record:
        raise ChartVersionError(f"{chart_digest.CHANGELOG} has no entry for version {version}: add "
                                f"`## [{version}] - YYYY-MM-DD` saying what changed, then run `{chart_digest.WRITE}`.")
    if record[version] != chart_digest.content_digest(chart):
        what = "records no content digest" if record[version] is None else "was recorded with other contents"
        raise ChartVersionError(f"Chart version {version} {what} (the chart's templates, schema, values or trainer "
                                "changed): bump `version` in Chart.yaml, add a CHANGELOG.md entry for it and run "
                                f"`{chart_digest.WRITE}`.")
