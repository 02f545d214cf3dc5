"""Where this machine gets its packages: Debian mirrors from apt's sources, pip's index from pip's configuration.

The e2e images are built from the same places the host's own `apt-get` and `pip` use, so a machine
behind a mirror builds them without an address written in the code. Used by e2e/build/image.sh:

    python3 e2e/build/host_config.py debian SUITE   # two lines: the mirror of SUITE, the mirror of SUITE-security
    python3 e2e/build/host_config.py pip            # pip.conf [global] lines: index-url, extra-index-url, trusted-host

A missing source is one sentence on stderr naming the file to look at and the variable that sets it, exit 1.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

APT_DIR = Path("/etc/apt")
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host")


@dataclass(frozen=True)
class Source:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    file: str


def _one_line(path: Path) -> list[Source]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        words = re.sub(r"\[[^\]]*\]", " ", line).split()  # drop [signed-by=... arch=...]
        if len(words) >= 3:
            out.append(Source(words[1].rstrip("/"), (words[2],), tuple(words[3:]), str(path)))
    return out


def _deb822(path: Path) -> list[Source]:
    out = []
    for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            out.append(Source(uri.rstrip("/"), tuple(fields.get("suites", "").split()),
                              tuple(fields.get("components", "").split()), str(path)))
    return out


def apt_sources(apt_dir: Path = APT_DIR) -> list[Source]:
    """Every enabled `deb` source of the host, in apt's order (sources.list, then sources.list.d/)."""
    files = [apt_dir / "sources.list"] + sorted((apt_dir / "sources.list.d").glob("*"))
    out: list[Source] = []
    for f in files:
        if f.is_file() and f.name.endswith(".list"):
            out += _one_line(f)
        elif f.is_file() and f.name.endswith(".sources"):
            out += _deb822(f)
    return out


def debian_mirrors(suite: str, apt_dir: Path = APT_DIR) -> tuple[str, str]:
    """The host's mirror for SUITE (main) and for SUITE-security.

    A source that serves SUITE itself wins; else one serving another Debian release with `main`
    (the host runs a different release from the same mirror): its URI is used for SUITE.
    """
    sources = [s for s in apt_sources(apt_dir) if "main" in s.components]

    def pick(want_security: bool) -> str:
        exact = [s for s in sources if any(x == (f"{suite}-security" if want_security else suite) for x in s.suites)]
        other = [s for s in sources if any(x.endswith("-security") == want_security and re.fullmatch(r"[a-z]+(-[a-z]+)?", x)
                                           for x in s.suites)]
        return (exact or other or [Source("", (), (), "")])[0].uri

    main, security = pick(False), pick(True)
    if not main or not security:
        which = "its release" if not main else "security updates"
        raise LookupError(f"the host's apt sources ({apt_dir}/sources.list, {apt_dir}/sources.list.d/) name no Debian "
                          f"mirror for {which} (a `deb` source with component main): add one there, or set "
                          f"GEMMA3_RAY_DEBIAN_MIRROR and GEMMA3_RAY_DEBIAN_SECURITY_MIRROR")
    return main, security


def parse_pip_config_list(text: str) -> dict[str, str]:
    """`pip config list` output -> the index settings, the last (most specific) value of each key winning."""
    got: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^[^.=]*\.([a-z-]+)=(.*)$", line.strip())
        if m and m.group(1) in PIP_KEYS:
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            got[m.group(1)] = value
    return got


def pip_index(pip: list[str] | None = None) -> dict[str, str]:
    """The host pip's index settings (empty: pip's own default index)."""
    argv = [*(pip or [sys.executable, "-m", "pip"]), "config", "list"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_pip_config_list(proc.stdout) if proc.returncode == 0 else {}


def pip_conf_lines(settings: dict[str, str]) -> str:
    return "".join(f"{k} = {settings[k]}\n" for k in PIP_KEYS if settings.get(k))


def main(argv: list[str]) -> int:
    if argv[:1] == ["debian"] and len(argv) == 2:
        try:
            print("\n".join(debian_mirrors(argv[1])))
        except LookupError as e:
            print(f"e2e/build/host_config.py: {e}", file=sys.stderr)
            return 1
        return 0
    if argv == ["pip"]:
        sys.stdout.write(pip_conf_lines(pip_index()))
        return 0
    print("usage: host_config.py debian SUITE | pip", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
