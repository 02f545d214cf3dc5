"""`prereqs` against real storage emulators (gcp-storage-emulator for buckets + bucket IAM,
fake-gcs-server for bucket locations) and the IAM / Service Usage fakes, through the CLI's own code."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Overrides, resolve
from gemma3_ray.gcp import bucket_setup, grants
from gemma3_ray.release import prereqs
from gemma3_ray.utils import names

from tests.plugin.conftest import ALL_SERVICES, PROJECT, PROJECT_NUMBER, REGION, Recorder, storage_client
from tests.plugin.container_fakes import FakeResourceManager
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage

GSA = f"{names.release_gsa_id('default', 'gemma3-ray')}@{PROJECT}.iam.gserviceaccount.com"
BUCKET = f"{PROJECT}-gemma3-ray"
BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context"]


def _clients(url: str, iam: FakeIAM, usage: FakeServiceUsage, rec: Recorder | None = None) -> Clients:
    return Clients(project=PROJECT, storage=storage_client(url, rec), iam=iam, service_usage=usage,
                   resource_manager=FakeResourceManager(PROJECT, number=PROJECT_NUMBER))


def bucket_bindings(url: str, bucket: str = BUCKET) -> list[dict]:  # type: ignore[type-arg]
    return list(storage_client(url).bucket(bucket).get_iam_policy(requested_policy_version=3).bindings)


def _sa_members(iam: FakeIAM, role: str, gsa: str = GSA) -> set[str]:
    return {m for b in iam.policies[gsa].bindings if b.role == role for m in b.members}


def test_apply_creates_least_privilege_prereqs_and_second_run_has_nothing_to_do(
    gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    rec = Recorder()
    args = [*BASE, "-n", "team-a", "--ksa", "trainer"]
    gsa = f"{names.release_gsa_id('team-a', 'gemma3-ray')}@{PROJECT}.iam.gserviceaccount.com"
    assert cli.main(["prereqs", "--apply", *args], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec)) == 0
    out = capsys.readouterr().out
    assert f"+ create bucket gs://{BUCKET} in {REGION}" in out
    assert "Done: 6 change(s) applied." in out

    assert fake_usage.enabled == ALL_SERVICES
    bucket = storage_client(gcs_iam_emulator).get_bucket(BUCKET)
    assert bucket.iam_configuration.uniform_bucket_level_access_enabled is True
    assert bucket.iam_configuration.public_access_prevention == "enforced"
    assert bucket.labels == {"managed-by": "gemma3-ray"}
    # the release's own service account, and on the bucket only its two conditional grants
    assert set(fake_iam.accounts) == {gsa}
    assert "release team-a/gemma3-ray" in fake_iam.accounts[gsa].description
    bindings = {b["role"]: b for b in bucket_bindings(gcs_iam_emulator)}
    assert set(bindings) == {"roles/storage.objectUser"}  # no bucket-level role at all
    for b in bindings.values():
        assert b["members"] == {f"serviceAccount:{gsa}"}
        assert b["condition"]["title"] == "gemma3-ray team-a/gemma3-ray"
    assert ('resource.name.startsWith("projects/_/buckets/demo-proj-1-gemma3-ray/objects/gemma3-ray/team-a/gemma3-ray/")'
            in bindings["roles/storage.objectUser"]["condition"]["expression"])
    assert _sa_members(fake_iam, prereqs.WORKLOAD_IDENTITY_ROLE, gsa) == {
        f"serviceAccount:{PROJECT}.svc.id.goog[team-a/trainer]"}

    mutations = (len(rec.mutations()), len(fake_iam.mutations()), len(fake_usage.mutations()))
    assert cli.main(["prereqs", "--apply", *args], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec)) == 0
    out = capsys.readouterr().out
    assert "Nothing to do: every prerequisite is in place." in out
    assert "+ " not in out
    assert (len(rec.mutations()), len(fake_iam.mutations()), len(fake_usage.mutations())) == mutations


def test_dry_run_prints_the_plan_and_changes_nothing(
    gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    rec = Recorder()
    assert cli.main(["prereqs", "--dry-run", *BASE], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec)) == 0
    out = capsys.readouterr().out
    planned = [line for line in out.splitlines() if line.startswith("  + ")]
    assert len(planned) == 6, out
    assert "enable APIs: storage.googleapis.com" in out
    assert f"grant roles/iam.workloadIdentityUser on {GSA}" in out
    assert "Dry run: nothing changed" in out
    assert rec.requests, "the plan reads the bucket"
    assert rec.mutations() == []
    assert fake_iam.mutations() == [] and fake_usage.mutations() == []
    assert list(storage_client(gcs_iam_emulator).list_buckets()) == []


def test_two_concurrent_runs_sharing_a_service_account_keep_every_binding(
    gcs_iam_emulator: str, fake_usage: FakeServiceUsage,
) -> None:
    """Two releases given the same --gsa-name at once: both read the policy before either writes (the
    fake's etag check answers the second write 409), and both Workload Identity bindings survive."""
    iam = FakeIAM(read_barrier=threading.Barrier(2, timeout=60))
    teams = [("team-a", "trainer-a"), ("team-b", "trainer-b")]
    shared = f"shared-trainer@{PROJECT}.iam.gserviceaccount.com"
    iam.create_service_account(request={"name": f"projects/{PROJECT}", "account_id": "shared-trainer",
                                        "service_account": {"description": "made by hand"}})
    errors: list[BaseException] = []

    def run(ns: str, ksa: str) -> None:
        try:
            dep = resolve(Overrides(project=PROJECT, region=REGION, namespace=ns, ksa=ksa,
                                    gsa_name="shared-trainer"), None, None)
            clients = _clients(gcs_iam_emulator, iam, fake_usage)
            assert prereqs.run(dep, clients, dry_run=False, hf_token=None, out=lambda _: None) == 0
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=t) for t in teams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert iam.conflicts >= 1, "the interleaved writes must have met a stale etag"
    assert _sa_members(iam, prereqs.WORKLOAD_IDENTITY_ROLE, shared) == {
        f"serviceAccount:{PROJECT}.svc.id.goog[{ns}/{ksa}]" for ns, ksa in teams}
    assert len(iam.accounts) == 1


def test_iam_404_right_after_creating_the_service_account_is_waited_out(
    gcs_iam_emulator: str, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #12 (6): real IAM answers getIamPolicy/setIamPolicy on a just-created account with 404
    for a while; that escaped as google.api_core.exceptions.NotFound."""
    iam = FakeIAM(not_found_after_create=3)
    assert cli.main(["prereqs", "--apply", *BASE], _clients(gcs_iam_emulator, iam, fake_usage)) == 0, capsys.readouterr().err
    assert _sa_members(iam, prereqs.WORKLOAD_IDENTITY_ROLE) == {
        f"serviceAccount:{PROJECT}.svc.id.goog[default/gemma3-ray]"}
    assert [c for c in iam.calls if c[0] == "get_iam_policy"].__len__() >= 4


def test_a_project_without_a_workload_pool_fails_at_once_with_the_fix(
    gcs_iam_emulator: str, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #12 (6): real IAM's 400 "Identity Pool does not exist" is permanent: no 38 s of retries."""
    iam = FakeIAM(workload_pools=set())
    assert cli.main(["prereqs", "--apply", *BASE], _clients(gcs_iam_emulator, iam, fake_usage)) == 1
    err = _one_sentence_error(capsys)
    assert f"--workload-pool={PROJECT}.svc.id.goog" in err and "gcloud container clusters update" in err
    assert [c[0] for c in iam.calls].count("set_iam_policy") == 1, "a permanent 400 is not retried"


def test_offline_plan_without_credentials(gcloud_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #12 (4): `make prereqs` (a dry run) without credentials prints everything it would ensure,
    each marked "not checked"; the same without --dry-run is the one-sentence "Not logged in"."""
    _no_credentials(tmp_path, monkeypatch)
    assert cli.main(["prereqs", "--dry-run", *BASE, "-n", "team-a"]) == 0
    out = capsys.readouterr().out
    unchecked = [line for line in out.splitlines() if line.startswith("  ? ")]
    assert len(unchecked) == 6, out  # APIs, bucket, GSA, its two bucket grants, Workload Identity
    assert all(line.endswith(": not checked (not logged in)") for line in unchecked)
    gsa = names.release_gsa_id("team-a", "gemma3-ray")
    for expected in (f"gs://{BUCKET}", gsa, "roles/storage.objectUser", "directory object",
                     f"{PROJECT}.svc.id.goog[team-a/gemma3-ray]", "iamcredentials.googleapis.com"):
        assert expected in out
    assert "gcloud auth application-default login" in out
    assert cli.main(["prereqs", "--apply", *BASE]) == 1
    assert "Not logged in" in _one_sentence_error(capsys)


def test_notfound_from_a_storage_endpoint_without_iam_is_one_sentence(
    fake_gcs_factory, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #12 (6): fake-gcs-server has no bucket IAM endpoint (404): that was a traceback."""
    url = fake_gcs_factory(REGION.upper())
    storage_client(url).create_bucket(BUCKET)
    fake_iam.create_service_account(request={"name": f"projects/{PROJECT}",
                                             "account_id": names.release_gsa_id("default", "gemma3-ray")})
    assert cli.main(["prereqs", "--apply", *BASE], _clients(url, fake_iam, fake_usage)) == 1
    err = _one_sentence_error(capsys)
    assert f"gs://{BUCKET}" in err and "404" in err


def _no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    # no metadata server either: point google-auth's GCE probe at a closed local port
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")


def test_grants_title_and_prefix_round_trip() -> None:
    gs = grants.for_release("b", "team/x", "ns-1", "rel-1", "serviceAccount:a@p.iam.gserviceaccount.com")

    class P:
        bindings: list = []  # type: ignore[type-arg]
        version = 1

    policy = P()
    for g in gs:
        grants.add(policy, g, "d")
    (holder,) = grants.holders(policy)
    assert (holder.name, holder.prefixes) == ("ns-1/rel-1", frozenset({"team/x"}))
    assert grants.overlaps("team/x", "team") and not grants.overlaps("team/x", "team/x2")
    assert len(grants.remove_release(policy, "ns-1", "rel-1")) == 1 and policy.bindings == []


def _one_sentence_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("gemma3-ray: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_permission_denied_names_the_permission_and_the_role(
    gcs_iam_emulator: str, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    iam = FakeIAM(allowed={"iam.serviceAccounts.get", "iam.serviceAccounts.getIamPolicy"})
    assert cli.main(["prereqs", "--apply", *BASE], _clients(gcs_iam_emulator, iam, fake_usage)) == 1
    err = _one_sentence_error(capsys)
    assert "'iam.serviceAccounts.create'" in err and "roles/iam.serviceAccountAdmin" in err


def test_disabled_api_says_how_to_enable_it(
    gcs_iam_emulator: str, fake_iam: FakeIAM, capsys: pytest.CaptureFixture[str],
) -> None:
    usage = FakeServiceUsage(project_number="123456789012", self_disabled=True)
    assert cli.main(["prereqs", "--dry-run", *BASE], _clients(gcs_iam_emulator, fake_iam, usage)) == 1
    err = _one_sentence_error(capsys)
    assert "serviceusage.googleapis.com API is disabled" in err
    assert "gcloud services enable serviceusage.googleapis.com --project 123456789012" in err


def test_bucket_of_another_project_is_refused(
    gcs_iam_emulator: str, fake_iam: FakeIAM, capsys: pytest.CaptureFixture[str],
) -> None:
    storage_client(gcs_iam_emulator).create_bucket("taken-name")  # the emulator's project number: 123456789012
    usage = FakeServiceUsage(project_number="999999999999")  # ours differs
    rc = cli.main(["prereqs", "--apply", *BASE, "--bucket", "taken-name"], _clients(gcs_iam_emulator, fake_iam, usage))
    assert rc == 1
    err = _one_sentence_error(capsys)
    assert "'taken-name' is taken by another project" in err and "--bucket" in err
    assert fake_iam.mutations() == []


def test_bucket_in_another_region_is_refused(
    fake_gcs_factory, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    url = fake_gcs_factory("EUROPE-WEST4")  # fake-gcs-server puts every bucket in its -location
    storage_client(url).create_bucket(BUCKET)
    assert cli.main(["prereqs", "--apply", *BASE], _clients(url, fake_iam, fake_usage)) == 1
    err = _one_sentence_error(capsys)
    assert f"gs://{BUCKET} is in EUROPE-WEST4 but the cluster is in {REGION}" in err


def test_bucket_in_the_clusters_region_is_accepted(
    fake_gcs_factory, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    url = fake_gcs_factory(REGION.upper())
    storage_client(url).create_bucket(BUCKET)
    assert cli.main(["prereqs", "--dry-run", *BASE], _clients(url, fake_iam, fake_usage)) == 0
    out = capsys.readouterr().out
    assert f"create bucket gs://{BUCKET}" not in out
    # fake-gcs-server keeps no bucket IAM settings, so hardening the existing bucket is planned
    assert f"enforce uniform bucket-level access and public access prevention on gs://{BUCKET}" in out


@pytest.mark.parametrize(("flag", "value", "field"), [
    ("--bucket", "Bad_Bucket!", "bucket name"),
    ("--bucket", "my-google-bucket", "bucket name"),
    ("--gsa-name", "x", "Google service account ID"),
    ("--ksa", "Trainer", "Kubernetes service account name"),
    ("--namespace", "team_a", "Kubernetes namespace"),
    ("--project", "My Project", "project ID"),
    ("--region", "us-central1-a", "region"),
    ("--machine-type", "n1-standard-4", "machine type"),
])
def test_invalid_names_fail_before_any_api_call(
    flag: str, value: str, field: str, gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rec = Recorder()
    rc = cli.main(["prereqs", "--apply", *BASE, flag, value], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec))
    assert rc == 2
    err = _one_sentence_error(capsys)
    assert field.lower() in err.lower() and value in err
    assert rec.requests == [] and fake_iam.calls == [] and fake_usage.calls == []


@pytest.mark.parametrize(("location", "region", "ok"), [
    ("NAM4", "us-central1", True), ("NAM4", "us-east1", True), ("NAM4", "us-west1", False),
    ("EUR4", "europe-west4", True), ("EUR4", "europe-west1", False), ("US", "us-east4", True),
])
def test_dual_region_buckets(location: str, region: str, ok: bool, fake_gcs_factory, fake_iam: FakeIAM,
                             fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #12 (8): a predefined dual-region holds exactly its two regions (NAM4 was refused for a
    us-central1 cluster). fake-gcs-server reports every bucket in its -location."""
    url = fake_gcs_factory(location)
    storage_client(url).create_bucket(BUCKET)
    base = ["--project", PROJECT, "--region", region, "--no-kube-context"]
    rc = cli.main(["prereqs", "--dry-run", *base], _clients(url, fake_iam, fake_usage))
    captured = capsys.readouterr()
    assert (rc == 0) is ok, captured.err
    if not ok:
        assert f"is in {location} but the cluster is in {region}" in captured.err


def test_configurable_dual_region_is_judged_by_its_data_locations() -> None:
    """A configurable dual-region reports its multi-region ("US") as location and its two regions as
    customPlacementConfig.dataLocations (neither emulator keeps them, so the API's JSON is parsed by
    the real client here)."""
    from google.cloud.storage import Bucket

    bucket = Bucket(client=None, name="b")
    bucket._set_properties({"name": "b", "location": "US", "locationType": "dual-region",  # noqa: SLF001
                            "customPlacementConfig": {"dataLocations": ["US-EAST1", "US-EAST4"]}})
    assert bucket_setup.location_holds_region(bucket.location, "us-east4", bucket.data_locations)
    assert not bucket_setup.location_holds_region(bucket.location, "us-central1", bucket.data_locations)
    assert bucket_setup.location_holds_region("US", "us-central1")  # the multi-region itself


def test_offline_plan_includes_the_image_prerequisites(gcloud_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _no_credentials(tmp_path, monkeypatch)
    assert cli.main(["prereqs", "--dry-run", "--image", *BASE]) == 0
    unchecked = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ? ")]
    assert len(unchecked) == 14 and any("the build's service account" in line for line in unchecked) and any("Artifact Registry Docker repository" in line for line in unchecked)


def test_two_releases_granting_on_the_bucket_at_once_keep_both_grants(
    gcs_iam_emulator: str, fake_usage: FakeServiceUsage,
) -> None:
    """Two releases' `prereqs` at once on the shared bucket: both read the bucket policy before either
    writes; Cloud Storage answers the second write 412 (stale etag), it re-reads and retries, and both
    releases' grants survive."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.plugin.gcp_fakes import EtagBucketIam

    bucket_iam = EtagBucketIam(read_barrier=threading.Barrier(2, timeout=60))
    storage_client(gcs_iam_emulator).create_bucket(BUCKET)
    iam = FakeIAM()
    errors: list[BaseException] = []

    def run(ns: str) -> None:
        try:
            client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                    client_options={"api_endpoint": gcs_iam_emulator}, _http=bucket_iam.session())
            dep = resolve(Overrides(project=PROJECT, region=REGION, namespace=ns), None, None)
            clients = Clients(project=PROJECT, storage=client, iam=iam, service_usage=fake_usage,
                              resource_manager=FakeResourceManager(PROJECT, number=PROJECT_NUMBER))
            assert prereqs.run(dep, clients, dry_run=False, hf_token=None, out=lambda _: None) == 0
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(ns,)) for ns in ("team-a", "team-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert bucket_iam.conflicts >= 1, "the interleaved writes must have met a stale etag"
    titles = {b["condition"]["title"] for b in bucket_iam.policies[BUCKET]["bindings"]}
    assert titles == {"gemma3-ray team-a/gemma3-ray", "gemma3-ray team-b/gemma3-ray"}
