"""The storage emulator's container runs its binary: the argv Kubernetes derives from the pod and the image.

Seen on main: the Deployment set only `args`, which replace the image's Cmd; e2e/image.sh's storage image
carries its binary as Cmd with no Entrypoint, so the container ran "-scheme" and crash-looped."""

import json
import re
from pathlib import Path

from e2e.storage_emulator import BINARY, manifest

ROOT = Path(__file__).resolve().parents[2]


def effective_argv(container: dict, entrypoint: list[str], cmd: list[str]) -> list[str]:
    """Kubernetes' rule: command replaces Entrypoint (and drops Cmd); args replace Cmd."""
    if "command" in container:
        return container["command"] + container.get("args", [])
    return entrypoint + container.get("args", cmd)


def storage_image_config() -> tuple[list[str], list[str]]:
    """(Entrypoint, Cmd) of the storage image as e2e/image.sh writes it (docker_archive sets only Cmd)."""
    text = (ROOT / "e2e" / "image.sh").read_text()
    cmd = re.search(r'docker_archive "\$\{ref#docker\.io/\}" "\$TMP/root" "\$TMP/image\.tar" \'(\[.*?\])\'', text)
    assert cmd, "e2e/image.sh no longer writes the storage image with docker_archive ... CMD_JSON"
    images = (ROOT / "e2e" / "cluster" / "images.sh").read_text()
    assert '"Entrypoint"' not in images  # docker_archive's config has Cmd only
    return [], json.loads(cmd.group(1))


def container() -> dict:
    dep = manifest("ns", "reg/fake-gcs:1", "IfNotPresent", {})
    dep = dep["items"][0] if "items" in dep else dep
    docs = dep if isinstance(dep, list) else [dep]
    for d in docs:
        if d.get("kind") == "Deployment":
            return d["spec"]["template"]["spec"]["containers"][0]
    raise AssertionError(f"no Deployment in {docs}")


def test_our_image_runs_the_binary_with_the_flags() -> None:
    entry, cmd = storage_image_config()
    argv = effective_argv(container(), entry, cmd)
    assert argv[0] == BINARY == cmd[0] and "-scheme" in argv[1:], argv


def test_fake_gcs_servers_own_image_runs_it_too() -> None:
    """Its image: ENTRYPOINT ["/bin/fake-gcs-server"], no Cmd (what E2E_STORAGE_IMAGE may name on any cluster)."""
    argv = effective_argv(container(), [BINARY], [])
    assert argv[0] == BINARY and argv.count(BINARY) == 1, argv


def test_no_service_link_names_the_servers_own_variables() -> None:
    """Kubernetes' service links put <SERVICE>_PORT=tcp://IP:PORT in the pod; for the Service `fake-gcs` that is
    FAKE_GCS_PORT, which fake-gcs-server reads as its port (seen: 'invalid value for environment variable
    FAKE_GCS_PORT="tcp://10.96.44.8:4443"', CrashLoopBackOff). The pod must not get them."""
    dep = manifest("ns", "reg/fake-gcs:1", "IfNotPresent", {})
    docs = dep.get("items", [dep]) if isinstance(dep, dict) else dep
    pod = next(d for d in docs if d.get("kind") == "Deployment")["spec"]["template"]["spec"]
    assert pod.get("enableServiceLinks") is False
