"""The storage emulator's container runs its binary: the argv Kubernetes derives from the pod and the image.

Seen on main: the Deployment set only `args`, which replace the image's Cmd; e2e/build/image.sh's storage image
carries its binary as Cmd with no Entrypoint, so the container ran "-scheme" and crash-looped."""

import json
import re
from pathlib import Path

from e2e.support.storage.emulator import BINARY, manifest

ROOT = Path(__file__).resolve().parents[2]


def effective_argv(container: dict, entrypoint: list[str], cmd: list[str]) -> list[str]:
    """Kubernetes' rule: command replaces Entrypoint (and drops Cmd); args replace Cmd."""
    if "command" in container:
        return container["command"] + container.get("args", [])
    return entrypoint + container.get("args", cmd)


def storage_image_config() -> tuple[list[str], list[str]]:
    """(Entrypoint, Cmd) of the storage image as e2e/build/image.sh writes it (docker_archive sets only Cmd)."""
    text = (ROOT / "e2e" / "build" / "image.sh").read_text()
    cmd = re.search(r'docker_archive "\$\{ref#docker\.io/\}" "\$TMP/root" "\$TMP/image\.tar" \'(\[.*?\])\'', text)
    assert cmd, "e2e/build/image.sh no longer writes the storage image with docker_archive ... CMD_JSON"
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


def test_the_memory_limit_holds_two_checkpoint_uploads_at_once() -> None:
    """fake-gcs-server keeps a resumable upload in memory until its last chunk, in a Go slice that doubles as it
    grows. Seen: at 512Mi the emulator was OOMKilled while the e2e's two workers uploaded checkpoint-000004, and
    the restarted server answered the trainer's next chunk 404 ("UploadChunk ... Not Found"): RayJob FAILED.
    The largest object is optimizer.pt: Adam's two fp32 moments of the tiny model's trained embedding."""
    from e2e.support.storage.emulator import MEMORY_LIMIT
    from localkit.tiny_model import GEMMA3_VISION_VOCAB_SIZE, TINY_TEXT

    optimizer_bytes = GEMMA3_VISION_VOCAB_SIZE * TINY_TEXT["hidden_size"] * 4 * 2
    import yaml

    # values/e2e.yaml's workers, each uploading its checkpoint at the same moment
    workers = yaml.safe_load((ROOT / "values" / "e2e.yaml").read_text())["workers"]["replicas"]
    units = {"Mi": 2**20, "Gi": 2**30}
    limit = int(MEMORY_LIMIT[:-2]) * units[MEMORY_LIMIT[-2:]]
    assert limit >= workers * 2 * optimizer_bytes * 1.5, (MEMORY_LIMIT, optimizer_bytes)
    res = container()["resources"]["limits"]
    assert res["memory"] == MEMORY_LIMIT


def test_a_restarted_emulator_is_named_in_the_failure() -> None:
    """The trainer's error ('UploadChunk 404') hid the cause; the run's failure must lead with the emulator's end."""
    from e2e.support.storage.emulator import restarts_sentence

    pod = {"metadata": {"name": "fake-gcs-5d58b7cf6b-lvsqx"},
           "status": {"containerStatuses": [{"name": "fake-gcs", "restartCount": 2,
                                             "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}
    said = restarts_sentence([pod], "g3r-e2e-storage-1")
    assert "restarted 2 time(s)" in said and "OOMKilled (exit 137)" in said and "MEMORY_LIMIT" in said, said
    fine = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"name": "fake-gcs", "restartCount": 0}]}}
    assert restarts_sentence([fine], "ns") == ""
