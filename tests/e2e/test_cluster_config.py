"""e2e/cluster/config.sh under cluster.sh's `set -euo pipefail`: the registry hosts are written with and without
E2E_REGISTRY (the local `make e2e` sets none: `E2E_REGISTRY: unbound variable` stopped its cluster start)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _write_hosts(tmp_path: Path, registry: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "E2E_REGISTRY"}
    if registry is not None:
        env["E2E_REGISTRY"] = registry
    script = f'set -euo pipefail; DIR={tmp_path}; source {ROOT}/e2e/cluster/config.sh; write_registry_hosts'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)


def test_no_registry_writes_no_hosts(tmp_path: Path) -> None:
    r = _write_hosts(tmp_path, None)
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "containerd" / "certs.d").iterdir()) == []


def test_each_registry_gets_its_plain_http_hosts_file(tmp_path: Path) -> None:
    r = _write_hosts(tmp_path, "127.0.0.1:5000,10.0.0.2:5001")
    assert r.returncode == 0, r.stderr
    hosts = (tmp_path / "containerd" / "certs.d" / "127.0.0.1:5000" / "hosts.toml").read_text()
    assert 'server = "http://127.0.0.1:5000"' in hosts and '[host."http://127.0.0.1:5000"]' in hosts
    assert (tmp_path / "containerd" / "certs.d" / "10.0.0.2:5001" / "hosts.toml").is_file()
