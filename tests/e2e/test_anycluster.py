"""make e2e on any cluster (#31 items 3-6): image references, registries from the machine's configuration,
the Go check, one run per machine, and signals that reach the scripts, which finish their clean-up."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from e2e.build import host_config
from e2e.support.harness import Images, parse_ref
from e2e.support.preflight import unknown_fields, worker_node

ROOT = Path(__file__).resolve().parents[2]
HELM = os.environ.get("HELM") or str(ROOT / ".tools" / "bin" / "helm")
DIGEST = "sha256:" + "ab" * 32


# ---------------------------------------------------------------- image references
@pytest.mark.parametrize(("ref", "want"), [
    ("127.0.0.1:5000/gemma3-ray-base:4e4e", ("127.0.0.1:5000", "gemma3-ray-base", "4e4e", "")),
    ("127.0.0.1:5000/team/trainer@" + DIGEST, ("127.0.0.1:5000", "team/trainer", "", DIGEST)),
    ("registry.example.com/a/b:1.0@" + DIGEST, ("registry.example.com", "a/b", "1.0", DIGEST)),
    ("localhost/trainer:x", ("localhost", "trainer", "x", "")),
    ("local/gemma3-ray-base:4e4e", ("", "local/gemma3-ray-base", "4e4e", "")),
    ("rayproject/ray", ("", "rayproject/ray", "", "")),
])
def test_a_reference_is_read_as_docker_reads_it(ref: str, want: tuple[str, str, str, str]) -> None:
    assert parse_ref(ref) == want


def _rendered_images(sets: dict[str, str]) -> dict[str, str]:
    """The head and worker images of the chart's RayJob, rendered by the real helm with values/e2e.yaml."""
    args = [HELM, "template", "r", str(ROOT / "charts" / "gemma3-ray"), "-f", str(ROOT / "values" / "e2e.yaml")]
    for k, v in sets.items():
        args += ["--set-string", f"{k}={v}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    job = next(d for d in yaml.safe_load_all(out.stdout) if d and d.get("kind") == "RayJob")
    spec = job["spec"]["rayClusterSpec"]
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    return {"head": head["image"], "worker": worker["image"], "policy": worker.get("imagePullPolicy", "")}


@pytest.mark.parametrize(("head", "worker"), [
    ("127.0.0.1:5000/gemma3-ray-base:4e4e", "127.0.0.1:5000/gemma3-ray-trainer:3777"),
    ("127.0.0.1:5000/gemma3-ray-base@" + DIGEST, "127.0.0.1:5000/gemma3-ray-trainer:3777@" + DIGEST),
])
def test_the_chart_renders_the_references_given_with_a_port_or_a_digest(head: str, worker: str) -> None:
    got = _rendered_images(Images(head, worker).sets())
    want_worker = worker.replace(":3777@", "@")  # a digest pins; the chart then leaves the tag out
    assert (got["head"], got["worker"]) == (head, want_worker)


def test_values_e2e_no_longer_forces_pull_policy_never_the_local_run_sets_it() -> None:
    values = yaml.safe_load((ROOT / "values" / "e2e.yaml").read_text())
    assert "pullPolicy" not in (values.get("image") or {})
    local = _rendered_images(Images("local/gemma3-ray-base:1", "local/gemma3-ray-trainer:2", "Never").sets())
    assert local["policy"] == "Never"
    anywhere = _rendered_images(Images("127.0.0.1:5000/b:1", "127.0.0.1:5000/t:2").sets())
    assert anywhere["policy"] != "Never"


# ---------------------------------------------------------------- the machine's registries
def test_debian_mirrors_come_from_the_hosts_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("# old style\ndeb [arch=amd64] http://mirror.internal/debian/ bookworm main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(textwrap.dedent("""\
        Types: deb
        URIs: http://mirror.internal/debian
        Suites: bookworm bookworm-updates
        Components: main

        Types: deb
        URIs: http://mirror.internal/debian-security
        Suites: bookworm-security
        Components: main
        """))
    (tmp_path / "sources.list.d" / "other.sources").write_text(
        "Types: deb\nURIs: https://vendor.example/apt\nSuites: stable\nComponents: contrib\n")
    assert host_config.debian_mirrors("bookworm", tmp_path) == ("http://mirror.internal/debian",
                                                                "http://mirror.internal/debian-security")
    # a host of another release, same mirror: its URIs serve the suite the base wants
    (tmp_path / "sources.list").write_text("")
    for f in (tmp_path / "sources.list.d").glob("debian.sources"):
        f.write_text(f.read_text().replace("bookworm", "trixie"))
    assert host_config.debian_mirrors("bookworm", tmp_path)[0] == "http://mirror.internal/debian"


def test_no_debian_source_is_one_sentence_naming_the_files_and_the_variables(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb https://vendor.example/apt stable contrib\n")
    with pytest.raises(LookupError) as e:
        host_config.debian_mirrors("bookworm", tmp_path)
    assert "sources.list" in str(e.value) and "GEMMA3_RAY_DEBIAN_MIRROR" in str(e.value)


def test_pips_index_comes_from_pips_configuration() -> None:
    listed = ("global.cert='/etc/ssl/certs/ca-certificates.crt'\nglobal.index-url='https://pypi.mirror.internal/simple'\n"
              ":env:.extra-index-url='https://extra.internal/simple'\nglobal.find-links='/opt/wheels'\n"
              "site.index-url='https://site.internal/simple'\n")
    got = host_config.parse_pip_config_list(listed)
    assert got == {"index-url": "https://site.internal/simple", "extra-index-url": "https://extra.internal/simple"}
    assert host_config.pip_conf_lines(got) == ("index-url = https://site.internal/simple\n"
                                               "extra-index-url = https://extra.internal/simple\n")


def test_no_package_registry_address_is_written_in_the_e2e_code() -> None:
    addresses = re.compile(r"proxy\.golang\.org|deb\.debian\.org|pypi\.org|files\.pythonhosted|registry-1\.docker")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "e2e").rglob("*")) if p.is_file()
            and p.suffix in {".sh", ".py", ""} for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if addresses.search(line)]
    assert hits == []


def _fake_go(tmp_path: Path, version: str, needs: str) -> dict[str, str]:
    """A `go` that reports `version` and serves a go.mod asking for `needs` (what `go list -m -f {{.GoMod}}`
    prints: the go.mod's path; parts.sh reads only the go.mod, never the zip a proxy may refuse)."""
    mod = tmp_path / "upstream.mod"
    mod.write_text(f"module example.com/x\n\ngo {needs}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text(textwrap.dedent(f"""\
        #!/bin/bash
        case "$1 $2" in
          "env GOVERSION") echo go{version} ;;
          "env GOFLAGS") echo "-buildvcs=false" ;;
          "env GOPROXY") echo "https://mirror.internal/go" ;;
          "list -m") echo "{mod}" ;;
          *) echo "fake go: $*" >&2; exit 9 ;;
        esac
        """))
    (bin_dir / "go").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GEMMA3_RAY_CACHE": str(tmp_path / "cache")}


def test_parts_add_to_the_machines_goflags_and_say_which_go_is_needed(tmp_path: Path) -> None:
    env = _fake_go(tmp_path, "1.22.1", "1.26.0")
    flags = subprocess.run([str(ROOT / "e2e" / "build" / "parts.sh"), "goflags"], capture_output=True, text=True, env=env)
    assert flags.stdout.split() == ["-buildvcs=false", "-mod=mod"]
    out = subprocess.run([str(ROOT / "e2e" / "build" / "parts.sh"), "build", "registry"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode != 0
    assert "needs Go >= 1.26.0" in out.stderr and "this machine has go 1.22.1" in out.stderr, out.stderr
    assert not (tmp_path / "cache" / "parts").exists() or not any((tmp_path / "cache" / "parts").rglob(".built"))
    (tmp_path / "new").mkdir()
    ok = subprocess.run([str(ROOT / "e2e" / "build" / "parts.sh"), "go-check", "registry"], capture_output=True, text=True,
                        env=_fake_go(tmp_path / "new", "1.26.8", "1.26.0"))
    assert ok.returncode == 0, ok.stderr


# ---------------------------------------------------------------- preflight, pure parts
def _node(name: str, labels: dict | None = None, **spec) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_elastic_stages_node_is_a_schedulable_worker_never_the_control_plane() -> None:
    cp = _node("kind-control-plane", {"node-role.kubernetes.io/control-plane": ""})
    assert worker_node([cp, _node("w1")]) == ("w1", "")
    name, why = worker_node([cp, _node("w2", unschedulable=True),
                             _node("w3", taints=[{"key": "gpu", "effect": "NoSchedule"}])])
    assert name == ""
    assert "kind-control-plane (control plane)" in why and "w2 (cordoned)" in why and "w3 (tainted gpu:NoSchedule)" in why


def test_a_rayjob_field_the_crd_does_not_know_is_named() -> None:
    crd = {"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"spec": {
        "properties": {"entrypoint": {}, "rayClusterSpec": {}}}}}}}]}}
    assert unknown_fields(crd, "v1", {"entrypoint": "x", "rayClusterSpec": {}, "backoffLimit": 1}) == ["backoffLimit"]


# ---------------------------------------------------------------- one run per machine
def test_a_second_make_e2e_is_refused_before_it_touches_the_first_runs_output(tmp_path: Path) -> None:
    from e2e.support.session import take_lock

    env = {**os.environ, "GEMMA3_RAY_CACHE": str(tmp_path / "cache"), "E2E_OUTPUT": str(tmp_path / "out"),
           "KUBECONFIG": str(tmp_path / "none")}
    os.environ["GEMMA3_RAY_CACHE"] = env["GEMMA3_RAY_CACHE"]
    try:
        held = take_lock()
    finally:
        del os.environ["GEMMA3_RAY_CACHE"]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "e2e.log").write_text("the first run's log\n")
    try:
        second = subprocess.run([sys.executable, "-m", "e2e", "--only", "first"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)
    finally:
        held.close()
    assert second.returncode == 2
    assert "another make e2e runs on this machine" in second.stdout and f"pid {os.getpid()}" in second.stdout
    assert (tmp_path / "out" / "e2e.log").read_text() == "the first run's log\n"
    assert not (tmp_path / "out" / "summary.json").exists()


# ---------------------------------------------------------------- signals reach the scripts
STAND_IN = """#!/bin/bash
# Stands in for e2e/cluster/cluster.sh and e2e/build/image.sh: works until a signal, then a clean-up that takes 1.5 s
# (cluster.sh stop takes 5-15 s) and that a second signal must not cut short.
out=$1
cleanup() { trap '' INT TERM HUP; echo "got $1" >> "$out"; sleep 1.5; echo "cleaned $1" >> "$out"; exit 130; }
trap 'cleanup INT' INT; trap 'cleanup TERM' TERM; trap 'cleanup HUP' HUP
echo "stand-in says it started"; echo $$ > "$out.pid"; echo started >> "$out"
for i in $(seq 600); do sleep 0.1; done
"""

DRIVER = """
import sys
from pathlib import Path
from e2e.support import proc
from e2e.support.harness import run_script
proc.install()
try:
    run_script(["bash", sys.argv[1], sys.argv[2]], Path(sys.argv[3]), 120, "stand-in")
except KeyboardInterrupt as e:
    with proc.shielded(lambda m: None):
        Path(sys.argv[2] + ".driver").write_text(f"interrupted {getattr(e, 'signum', 2)}")
        sys.exit(128 + getattr(e, "signum", 2))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("after_s", [0.0, 0.7, 2.0])
def test_a_signal_to_make_e2e_reaches_the_script_which_finishes_its_clean_up(tmp_path: Path, sig: int,
                                                                              after_s: float) -> None:
    script, out = tmp_path / "stand_in.sh", tmp_path / "out"
    script.write_text(STAND_IN)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(script), str(out), str(tmp_path / "log")], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (out.exists() and "started" in out.read_text()):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.05)
    time.sleep(after_s)
    t0 = time.monotonic()
    driver.send_signal(sig)
    if sig == signal.SIGINT:  # a second ^C during the clean-up does not cut it short
        time.sleep(0.3)
        driver.send_signal(signal.SIGINT)
    driver.communicate(timeout=60)
    took = time.monotonic() - t0
    name = signal.Signals(sig).name.removeprefix("SIG")
    assert out.read_text().splitlines() == ["started", f"got {name}", f"cleaned {name}"]
    assert "stand-in says it started" in (tmp_path / "log").read_text(), "what the script said before the signal is kept"
    assert took >= 1.4, "the driver returned before the script's clean-up ended"
    assert driver.returncode == 128 + sig
    assert (tmp_path / "out.driver").read_text() == f"interrupted {int(sig)}"
    pid = int((tmp_path / "out.pid").read_text())
    assert not Path(f"/proc/{pid}").exists(), "the script still runs"



def test_a_signal_while_the_script_starts_still_reaches_it(tmp_path: Path, monkeypatch) -> None:
    """The signal lands inside subprocess.Popen, after the script started (a ^C right after its first line, seen
    under load): the script still gets it and finishes its clean-up before the interrupt goes on."""
    from e2e.support import proc

    script, out = tmp_path / "stand_in.sh", tmp_path / "out"
    script.write_text(STAND_IN)
    real = subprocess.Popen

    class SignalledWhileStarting(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            deadline = time.monotonic() + 30
            while not (out.exists() and "started" in out.read_text()) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)  # handled before this constructor returns

    saved = {s: signal.getsignal(s) for s in proc.HANDLED}
    monkeypatch.setattr(subprocess, "Popen", SignalledWhileStarting)
    try:
        proc.install()
        with pytest.raises(proc.Interrupted) as got:
            proc.run_child(["bash", str(script), str(out)], timeout=60)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert got.value.signum == signal.SIGTERM
    assert out.read_text().splitlines() == ["started", "got TERM", "cleaned TERM"]
    assert not Path(f"/proc/{int((tmp_path / 'out.pid').read_text())}").exists(), "the script still runs"


# ---------------------------------------------------------------- caches keep the last two keys
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("buildah") or not shutil.which("mmdebstrap"),
                    reason="e2e/build/image.sh build runs as root with buildah and mmdebstrap")
def test_the_image_cache_keeps_the_last_two_keys_of_each_image(tmp_path: Path) -> None:
    env = {**os.environ, "GEMMA3_RAY_CACHE": str(tmp_path)}
    images = tmp_path / "images"
    images.mkdir()

    def sh(*args: str) -> str:
        out = subprocess.run([str(ROOT / "e2e" / "build" / "image.sh"), *args], capture_output=True, text=True, env=env,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    current = {i: Path(sh("path", i)) for i in ("storage", "base", "trainer")}
    for n, key in enumerate(["0000000000000001", "0000000000000002", "0000000000000003"]):
        for stem in ("gemma3-ray-fake-gcs", "gemma3-ray-base", "gemma3-ray-trainer"):
            old = images / f"{stem}-{key}.tar"
            old.write_text("old")
            (images / f"{stem}-{key}.tar.id").write_text("sha256:old")
            os.utime(old, (1_000_000 + n, 1_000_000 + n))  # key 3 the newest of the old ones
    for path in current.values():  # this build's archives, "built" (the build finds them cached)
        path.write_text("archive")
        Path(f"{path}.id").write_text("sha256:x")
    sh("build")
    left = sorted(p.name for p in images.glob("*.tar"))
    want = sorted([p.name for p in current.values()] + [f"{s}-0000000000000003.tar" for s in
                                                       ("gemma3-ray-fake-gcs", "gemma3-ray-base", "gemma3-ray-trainer")])
    assert left == want


# ---------------------------------------------------------------- leftovers of a hard kill or a reboot
def _cluster_host_free() -> str:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("openssl"):
        return "needs root, ip and openssl"
    if subprocess.run(["ip", "link", "show", "cni0"], capture_output=True).returncode == 0:
        return "a cni0 bridge exists (a cluster runs)"
    if subprocess.run(["pgrep", "-x", "kubelet"], capture_output=True).returncode == 0 or Path("/etc/kueue").exists():
        return "a kubelet runs or /etc/kueue exists on this host"
    return ""


def test_what_a_killed_cluster_left_is_named_and_removed_and_nothing_else(tmp_path: Path) -> None:
    """Asks the host when it runs, with the cluster lock held, never at collection: `make test` collected while no
    cluster ran, a `make e2e` started one minutes later, and this test then deleted that live cluster's cni0
    (2026-12-04: the e2e's API server became unreachable mid-stage). The bridges it deletes are only the ones it
    added."""
    import fcntl

    lock = open(Path.home() / ".cache" / "gemma3-ray" / "cluster.lock", "a")  # noqa: SIM115 - held: no cluster starts meanwhile
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pytest.skip("a cluster is starting or stopping on this host")
    busy = _cluster_host_free()
    if busy:
        lock.close()
        pytest.skip(busy)
    added = False  # a cni0 this test made (and so may delete)

    def add_bridge(cidr: str) -> None:
        nonlocal added
        subprocess.run(["ip", "link", "add", "cni0", "type", "bridge"], check=True)  # fails if one exists
        added = True
        subprocess.run(["ip", "addr", "add", cidr, "dev", "cni0"], check=True)

    env = {**os.environ, "GEMMA3_RAY_CACHE": str(tmp_path / "cache")}
    sh = [str(ROOT / "e2e" / "cluster" / "cluster.sh"), "leftovers", str(tmp_path / "dir")]
    try:
        # another Kubernetes' bridge (another address) is not ours: left alone
        add_bridge("10.99.0.1/24")
        out = subprocess.run(sh, capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0 and out.stderr == "", out.stderr
        assert subprocess.run(["ip", "link", "show", "cni0"], capture_output=True).returncode == 0
        subprocess.run(["ip", "link", "del", "cni0"], check=True)
        added = False
        # ours after a reboot or SIGKILL: the bridge on 10.244.0.1/24, /etc/kueue with our CA's certificate
        add_bridge("10.244.0.1/24")
        certs = Path("/etc/kueue/metrics/certs")
        certs.mkdir(parents=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-days", "1", "-subj", "/CN=gemma3-ray-e2e-ca", "-keyout", str(certs / "tls.key"),
                        "-out", str(certs / "tls.crt")], check=True, capture_output=True)
        out = subprocess.run(sh, capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "the bridge cni0 (10.244.0.1/24)" in out.stderr and "/etc/kueue/metrics/certs" in out.stderr, out.stderr
        assert subprocess.run(["ip", "link", "show", "cni0"], capture_output=True).returncode != 0
        added = False
        assert not Path("/etc/kueue").exists()
    finally:
        if added:
            subprocess.run(["ip", "link", "del", "cni0"], capture_output=True)
        shutil.rmtree("/etc/kueue/metrics/certs", ignore_errors=True)
        for d in ("/etc/kueue/metrics", "/etc/kueue"):
            if Path(d).is_dir() and not any(Path(d).iterdir()):
                Path(d).rmdir()
        lock.close()
