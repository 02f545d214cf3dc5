"""`down --prereqs`: two releases in two namespaces share a project and a bucket; taking one down
removes exactly what `prereqs` made for it and nothing of the other (gcp-storage-emulator for the
bucket, its IAM policy and objects; the IAM fake for service accounts)."""

from __future__ import annotations

import pytest
from gemma3_ray import cli
from gemma3_ray.gcp import grants
from gemma3_ray.release import prereqs
from gemma3_ray.utils import names

from tests.plugin.conftest import PROJECT, REGION, storage_client
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage
from tests.plugin.test_prereqs import BUCKET, _clients, bucket_bindings

BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context"]
GCP_ONLY = ["--no-uninstall", "--prereqs"]


def _gsa(ns: str, release: str = "gemma3-ray") -> str:
    return f"{names.release_gsa_id(ns, release)}@{PROJECT}.iam.gserviceaccount.com"


def _wi(ns: str, ksa: str = "gemma3-ray") -> str:
    return f"serviceAccount:{PROJECT}.svc.id.goog[{ns}/{ksa}]"


def _titles(url: str) -> set[str]:
    return {b["condition"]["title"] for b in bucket_bindings(url) if b.get("condition")}


def _objects(url: str) -> set[str]:
    return {b.name for b in storage_client(url).list_blobs(BUCKET)}


def _wi_members(iam: FakeIAM, gsa: str) -> set[str]:
    return {m for b in iam.policies[gsa].bindings if b.role == prereqs.WORKLOAD_IDENTITY_ROLE for m in b.members}


@pytest.fixture
def two_releases(gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage,
                 capsys: pytest.CaptureFixture[str]) -> str:
    for ns in ("team-a", "team-b"):
        assert cli.main(["prereqs", "--apply", *BASE, "-n", ns], _clients(gcs_iam_emulator, fake_iam, fake_usage)) == 0
        bucket = storage_client(gcs_iam_emulator).bucket(BUCKET)
        for name in ("runs/r1-x/metrics.jsonl", "runs/r1-x/checkpoint_000001/model.pt"):
            bucket.blob(f"gemma3-ray/{ns}/gemma3-ray/{name}").upload_from_string("x")
    capsys.readouterr()
    return gcs_iam_emulator


def test_two_releases_coexist_and_one_goes_without_touching_the_other(
    two_releases: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    url = two_releases
    clients = _clients(url, fake_iam, fake_usage)
    # coexisting: own service accounts, own grants, own folders
    assert set(fake_iam.accounts) == {_gsa("team-a"), _gsa("team-b")}
    assert _titles(url) == {"gemma3-ray team-a/gemma3-ray", "gemma3-ray team-b/gemma3-ray"}
    b_objects = {o for o in _objects(url) if o.startswith("gemma3-ray/team-b/")}
    assert len(b_objects) == 3  # the directory object `prereqs` made, and two of the job's

    assert cli.main(["down", *GCP_ONLY, "--delete-data", "--dry-run", *BASE, "-n", "team-a"], clients) == 0
    assert "Dry run: nothing changed" in capsys.readouterr().out
    assert len(fake_iam.accounts) == 2 and len(_objects(url)) == 6

    assert cli.main(["down", "--apply", *GCP_ONLY, "--delete-data", *BASE, "-n", "team-a"], clients) == 0
    out = capsys.readouterr().out
    assert f"removed Google service account {_gsa('team-a')}" in out
    assert f"removed {prereqs.WORKLOAD_IDENTITY_ROLE} on {_gsa('team-a')} for {_wi('team-a')}" in out
    assert "removed this release's grants on gs://" in out
    assert "removed 3 object(s) under gs://demo-proj-1-gemma3-ray/gemma3-ray/team-a/gemma3-ray/" in out
    assert f"keep bucket gs://{BUCKET} (shared by the releases; never deleted by `down`; also used by " \
           "team-b/gemma3-ray)" in out
    # team-b untouched
    assert set(fake_iam.accounts) == {_gsa("team-b")}
    assert _wi_members(fake_iam, _gsa("team-b")) == {_wi("team-b")}
    assert _titles(url) == {"gemma3-ray team-b/gemma3-ray"}
    b_bindings = [b for b in bucket_bindings(url) if b.get("condition")]
    assert {tuple(sorted(b["members"])) for b in b_bindings} == {(f"serviceAccount:{_gsa('team-b')}",)}
    assert _objects(url) == b_objects
    assert storage_client(url).lookup_bucket(BUCKET) is not None

    # idempotent: the second `down` finds nothing and says so, exit 0
    assert cli.main(["down", "--apply", *GCP_ONLY, "--delete-data", *BASE, "-n", "team-a"], clients) == 0
    out = capsys.readouterr().out
    assert "Nothing to remove" in out and "removed" not in out
    assert f"nothing to remove: Google service account {_gsa('team-a')}" in out


def test_a_shared_service_account_is_kept_and_its_users_named(
    gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    clients = _clients(gcs_iam_emulator, fake_iam, fake_usage)
    for ns in ("team-a", "team-b"):
        assert cli.main(["prereqs", "--apply", *BASE, "-n", ns, "--gsa-name", "shared-trainer"], clients) == 0
    shared = f"shared-trainer@{PROJECT}.iam.gserviceaccount.com"
    assert "release team-a/gemma3-ray" in fake_iam.accounts[shared].description  # team-a created it
    capsys.readouterr()

    assert cli.main(["down", "--apply", *GCP_ONLY, *BASE, "-n", "team-a", "--gsa-name", "shared-trainer"], clients) == 0
    out = capsys.readouterr().out
    assert f"keep Google service account {shared} (still used by {_wi('team-b')}" in out
    assert "release team-b/gemma3-ray (bucket grants)" in out
    assert shared in fake_iam.accounts
    assert _wi_members(fake_iam, shared) == {_wi("team-b")}
    assert _titles(gcs_iam_emulator) == {"gemma3-ray team-b/gemma3-ray"}

    # team-b is the last release using it: its `down` deletes it, though team-a created it (never orphaned)
    assert cli.main(["down", *GCP_ONLY, *BASE, "-n", "team-b", "--gsa-name", "shared-trainer"], clients) == 0
    assert "Dry run: nothing changed" in capsys.readouterr().out and shared in fake_iam.accounts
    assert cli.main(["down", "--apply", *GCP_ONLY, *BASE, "-n", "team-b", "--gsa-name", "shared-trainer"], clients) == 0
    out = capsys.readouterr().out
    assert f"removed Google service account {shared} (created for release team-a/gemma3-ray; no release uses it" in out
    assert shared not in fake_iam.accounts


def test_data_another_release_still_uses_is_not_deleted(
    two_releases: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    """A release whose --prefix holds team-a's folder: team-a's `down --delete-data` names it and keeps
    the objects (it removes team-a's grants and service account all the same)."""
    url = two_releases
    clients = _clients(url, fake_iam, fake_usage)
    assert cli.main(["prereqs", "--apply", *BASE, "-n", "audit", "--release", "reader", "--prefix", "gemma3-ray/team-a"],
                    clients) == 0
    capsys.readouterr()
    before = _objects(url)
    assert cli.main(["down", "--apply", *GCP_ONLY, "--delete-data", *BASE, "-n", "team-a"], clients) == 0
    out = capsys.readouterr().out
    assert "not deleted: release audit/reader uses that prefix too" in out
    assert _objects(url) == before
    assert _gsa("team-a") not in fake_iam.accounts


def test_a_service_account_prereqs_did_not_create_is_kept(
    gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, capsys: pytest.CaptureFixture[str],
) -> None:
    fake_iam.create_service_account(request={"name": f"projects/{PROJECT}", "account_id": "team-owned-sa",
                                             "service_account": {"description": "ours"}})
    clients = _clients(gcs_iam_emulator, fake_iam, fake_usage)
    assert cli.main(["prereqs", "--apply", *BASE, "--gsa-name", "team-owned-sa"], clients) == 0
    capsys.readouterr()
    assert cli.main(["down", "--apply", *GCP_ONLY, *BASE, "--gsa-name", "team-owned-sa"], clients) == 0
    out = capsys.readouterr().out
    assert "keep Google service account team-owned-sa@" in out and "not created by `prereqs`" in out
    assert f"team-owned-sa@{PROJECT}.iam.gserviceaccount.com" in fake_iam.accounts
    assert _titles(gcs_iam_emulator) == set()


def test_a_failed_step_is_an_error_not_a_success_line(
    two_releases: str, fake_usage: FakeServiceUsage, fake_iam: FakeIAM, capsys: pytest.CaptureFixture[str],
) -> None:
    fake_iam.allowed = {"iam.serviceAccounts.get", "iam.serviceAccounts.getIamPolicy", "iam.serviceAccounts.setIamPolicy"}
    rc = cli.main(["down", "--apply", *GCP_ONLY, *BASE, "-n", "team-a"], _clients(two_releases, fake_iam, fake_usage))
    captured = capsys.readouterr()
    assert rc == 1
    assert "FAILED to remove Google service account" in captured.out
    assert "Done" not in captured.out
    assert "down stopped after" in captured.err and "iam.serviceAccounts.delete" in captured.err
    assert grants.title("team-a", "gemma3-ray") not in _titles(two_releases)  # the steps before it did run
