"""A throwaway GnuPG signing key, exported as the keyrings Helm reads: what signs a chart in a test or an e2e run."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Key:
    name: str
    secring: Path  # legacy secret keyring (what `helm package --sign --keyring` reads)
    pubring: Path  # the public key (what `helm verify --keyring` / `helm install --verify --keyring` read)


def throwaway_key(folder: Path, name: str = "gemma3-ray release test") -> Key:
    """A fresh RSA key without passphrase in its own GNUPGHOME under ``folder``; gpg-agent stopped after."""
    home = folder / "gnupg"
    home.mkdir(mode=0o700, parents=True)
    env = {**os.environ, "GNUPGHOME": str(home)}
    params = (f"%no-protection\nKey-Type: RSA\nKey-Length: 2048\nName-Real: {name}\n"
              "Name-Email: release-test@example.invalid\nExpire-Date: 0\n%commit\n")
    try:
        subprocess.run(["gpg", "--batch", "--gen-key"], input=params, text=True, env=env, check=True,
                       capture_output=True, timeout=120)
        key = Key(name, folder / "secring.gpg", folder / "pubring.gpg")
        for flag, path in (("--export-secret-keys", key.secring), ("--export", key.pubring)):
            path.write_bytes(subprocess.run(["gpg", "--batch", flag], env=env, check=True, capture_output=True,
                                            timeout=60).stdout)
    finally:  # gpg-agent was started for this GNUPGHOME: stop it (a process this started)
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, capture_output=True, timeout=30, check=False)
    return key
