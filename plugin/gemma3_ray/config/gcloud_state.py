"""The gcloud configuration, read directly from its files (no gcloud process, works offline).

gcloud keeps its state under ``$CLOUDSDK_CONFIG`` (default ``~/.config/gcloud``): the file
``active_config`` names the active configuration (``default`` when absent), and
``configurations/config_<name>`` is an INI file of ``[section] property = value``. The environment
overrides both: ``CLOUDSDK_ACTIVE_CONFIG_NAME`` picks the configuration and
``CLOUDSDK_<SECTION>_<PROPERTY>`` (e.g. ``CLOUDSDK_CORE_PROJECT``) overrides a property — the same
precedence gcloud itself applies. Without ``active_config`` (gcloud never ran), gcloud's first run
rebuilds ``config_default`` from the legacy ``properties`` file, so that file is what is read then. Installation-wide properties (``<sdk>/properties``) are not read:
they never hold the project, account, region, zone or cluster.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gemma3_ray.utils.errors import ConfigError

DEFAULT_CONFIGURATION = "default"
_CONFIG_NAME_RE = re.compile(r"^[a-z][-a-z0-9]*$")


@dataclass(frozen=True)
class GcloudState:
    """The properties of the active gcloud configuration this plugin uses (None = unset)."""

    config_dir: Path
    configuration: str
    project: str | None
    account: str | None
    region: str | None
    zone: str | None
    cluster: str | None


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("CLOUDSDK_CONFIG"):
        return Path(env["CLOUDSDK_CONFIG"]).expanduser()
    if os.name == "nt" and env.get("APPDATA"):
        return Path(env["APPDATA"]) / "gcloud"
    return Path(env.get("HOME", str(Path.home()))) / ".config" / "gcloud"


def active_configuration(directory: Path, env: Mapping[str, str]) -> str:
    name = env.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    source = "CLOUDSDK_ACTIVE_CONFIG_NAME"
    if not name:
        path = directory / "active_config"
        try:
            name = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return DEFAULT_CONFIGURATION
        except OSError as exc:
            raise ConfigError(f"Cannot read {path}: {exc.strerror}; fix its permissions.") from exc
        source = str(path)
        if not name:
            return DEFAULT_CONFIGURATION
    if not _CONFIG_NAME_RE.fullmatch(name):
        # gcloud itself does not strip the name: with a stray newline every property reads as unset.
        raise ConfigError(
            f"The gcloud configuration name {name!r} in {source} is not valid; run "
            f"`gcloud config configurations activate {name.strip() or DEFAULT_CONFIGURATION}` to fix it."
        )
    return name


def read_properties(directory: Path, configuration: str, legacy: bool = False) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    path = directory / "properties" if legacy else directory / "configurations" / f"config_{configuration}"
    try:
        with path.open(encoding="utf-8") as fh:
            parser.read_file(fh)
    except FileNotFoundError:
        pass
    except (OSError, configparser.Error) as exc:
        raise ConfigError(f"Cannot parse the gcloud configuration {path}: {exc}; fix or recreate it with "
                          "`gcloud config set`.") from exc
    return parser


def get_property(parser: configparser.ConfigParser, env: Mapping[str, str], section: str, name: str) -> str | None:
    """A property with gcloud's precedence: ``CLOUDSDK_SECTION_NAME`` over the configuration file."""
    override = env.get(f"CLOUDSDK_{section.upper()}_{name.upper()}")
    if override:
        return override
    value = parser.get(section, name, fallback=None)
    return value.strip() if value and value.strip() else None


def read_gcloud_state(env: Mapping[str, str] | None = None, configuration: str | None = None) -> GcloudState:
    """The active (or the named) gcloud configuration's project, account, region, zone and cluster."""
    env = os.environ if env is None else env
    directory = config_dir(env)
    name = configuration or active_configuration(directory, env)
    if configuration and not (directory / "configurations" / f"config_{configuration}").is_file():
        from gemma3_ray.utils.tokens import shown

        raise ConfigError(
            f"There is no gcloud configuration named {shown(configuration)} in {directory}; list them with "
            "`gcloud config configurations list`."
        )
    if configuration is None and not env.get("CLOUDSDK_ACTIVE_CONFIG_NAME") and not (directory / "active_config").exists():
        # gcloud's first run: it (re)creates config_default from the legacy `properties` file, so that is
        # what its properties are.
        parser = read_properties(directory, "", legacy=True)
    else:
        parser = read_properties(directory, name)
    return GcloudState(
        config_dir=directory,
        configuration=name,
        project=get_property(parser, env, "core", "project"),
        account=get_property(parser, env, "core", "account"),
        region=get_property(parser, env, "compute", "region"),
        zone=get_property(parser, env, "compute", "zone"),
        cluster=get_property(parser, env, "container", "cluster"),
    )
