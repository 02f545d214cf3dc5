"""`prereqs --image`, `image build` and `values --image` against gcp-storage-emulator (the staging
bucket, the uploaded context, the build log) and the Artifact Registry / Cloud Build / Container /
Resource Manager fakes (operations, 409, 403, 404, grants the build really needs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients
from gemma3_ray.gcp import image_build
from google.cloud import container_v1 as gke

from tests.plugin.build_fakes import FakeArtifactRegistry, FakeCloudBuild
from tests.plugin.conftest import ALL_SERVICES, PROJECT, PROJECT_NUMBER, REGION, storage_client
from tests.plugin.container_fakes import FakeContainer, FakeResourceManager
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage

ROOT = Path(__file__).resolve().parents[2]
REPO = f"projects/{PROJECT}/locations/{REGION}/repositories/gemma3-ray"
HOST = f"{REGION}-docker.pkg.dev/{PROJECT}/gemma3-ray"
STAGING = f"{PROJECT}-gemma3-ray-build"
COMPUTE_DEFAULT = f"serviceAccount:{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
BUILDER = f"serviceAccount:gemma3-ray-build@{PROJECT}.iam.gserviceaccount.com"  # the build's own account
NODES = f"nodes@{PROJECT}.iam.gserviceaccount.com"
DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS base
COPY --chown=ray:users trainer/requirements.txt \\
     /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt
FROM base
COPY --from=base /tmp/requirements.txt /tmp/again.txt
COPY ["images/trainer/extra*.txt", "/opt/"]
"""


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_build, "POLL_INTERVAL_S", 0.0)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "images/trainer").mkdir(parents=True)
    (root / "trainer").mkdir()
    (root / "images/trainer/Dockerfile").write_text(DOCKERFILE)
    (root / "images/trainer/extra-a.txt").write_text("a\n")
    (root / "trainer/requirements.txt").write_text("ray[train]==2.60.0\ntorch==2.11.0\n")
    (root / "trainer/vision_train.py").write_text("# not copied by the Dockerfile\n")
    return root


@dataclass
class Cloud:
    url: str
    usage: FakeServiceUsage
    iam: FakeIAM
    registry: FakeArtifactRegistry
    build: FakeCloudBuild
    container: FakeContainer
    rm: FakeResourceManager

    def clients(self) -> Clients:
        return Clients(project=PROJECT, storage=storage_client(self.url), iam=self.iam, service_usage=self.usage,
                       container=self.container, resource_manager=self.rm, cloud_build=self.build,
                       artifact_registry=self.registry)


@pytest.fixture
def cloud(gcs_iam_emulator: str) -> Cloud:
    registry = FakeArtifactRegistry()
    container = FakeContainer(PROJECT)
    nodes = gke.NodeConfig(machine_type="e2-standard-32", service_account=NODES)
    container.ready(REGION, gke.Cluster(name="trainers", node_pools=[gke.NodePool(name="p", initial_node_count=1,
                                                                                     config=nodes)]))
    iam = FakeIAM()
    return Cloud(gcs_iam_emulator, FakeServiceUsage(PROJECT_NUMBER, enabled=set(ALL_SERVICES)), iam, registry,
                 FakeCloudBuild(PROJECT, PROJECT_NUMBER, registry, storage_client(gcs_iam_emulator), iam=iam), container,
                 FakeResourceManager(PROJECT, number=PROJECT_NUMBER))


BASE = ["--project", PROJECT, "--region", REGION, "--cluster", "trainers", "--no-kube-context"]


def _members(policy, role: str) -> set[str]:  # type: ignore[no-untyped-def]
    return {m for b in policy.bindings if b.role == role for m in b.members}


def _bucket_members(url: str, bucket: str, role: str) -> set[str]:
    policy = storage_client(url).bucket(bucket).get_iam_policy(requested_policy_version=3)
    return {m for b in policy.bindings if b["role"] == role for m in b["members"]}


def test_the_repository_dockerfile_builds_from_the_ray_pin() -> None:
    ctx = image_build.context()
    assert ctx.files == ("images/trainer/Dockerfile", "images/trainer/check_pins.py", "trainer/requirements.txt")
    ray = next(line for line in (ROOT / "trainer/requirements.txt").read_text().splitlines() if line.startswith("ray["))
    assert ctx.build_args == (("BASE_IMAGE", f"rayproject/ray:{ray.split('==')[1]}-py311-gpu"),)


def test_the_context_is_what_the_dockerfile_copies_and_its_tag_follows_the_pins(source: Path) -> None:
    ctx = image_build.context(source)
    assert ctx.files == ("images/trainer/Dockerfile", "images/trainer/extra-a.txt", "trainer/requirements.txt")
    assert ctx.build_args == (("BASE_IMAGE", "rayproject/ray:2.60.0-py311-gpu"),)
    assert image_build.context(source, base="rayproject/ray:2.60.0-py311-cu128").tag != ctx.tag
    assert ctx.tarball() == image_build.context(source).tarball()  # reproducible bytes
    tag = ctx.tag
    (source / "trainer/vision_train.py").write_text("# changed, but not in the image\n")
    assert image_build.context(source).tag == tag
    (source / "trainer/requirements.txt").write_text("ray[train]==2.60.0\ntorch==2.11.1\n")
    assert image_build.context(source).tag != tag
    (source / "images/trainer/Dockerfile").write_text(DOCKERFILE + "COPY missing.txt /x\n")
    with pytest.raises(image_build.NotFound, match="copies 'missing.txt', which does not exist"):
        image_build.context(source)


def test_prereqs_image_grants_only_the_node_pull_identity_and_the_builder(
    cloud: Cloud, capsys: pytest.CaptureFixture[str],
) -> None:
    cloud.usage.enabled -= {"artifactregistry.googleapis.com", "cloudbuild.googleapis.com"}
    assert cli.main(["prereqs", "--dry-run", "--image", *BASE], cloud.clients()) == 0
    out = capsys.readouterr().out
    assert "+ enable APIs: artifactregistry.googleapis.com, cloudbuild.googleapis.com" in out
    assert f"+ create Artifact Registry Docker repository {HOST}" in out
    assert f"+ grant roles/artifactregistry.reader on {HOST} for serviceAccount:{NODES}" in out
    assert f"+ create the build's service account {BUILDER.split(':')[1]} (builds run as it, not as the nodes)" in out
    assert f"+ grant roles/artifactregistry.writer on {HOST} for {BUILDER}" in out
    assert cloud.registry.mutations() == [] and cloud.usage.mutations() == []

    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    capsys.readouterr()
    assert set(cloud.registry.repositories) == {REPO}
    policy = cloud.registry.policies[REPO]
    assert _members(policy, "roles/artifactregistry.reader") == {f"serviceAccount:{NODES}"}
    assert _members(policy, "roles/artifactregistry.writer") == {BUILDER}
    assert {b.role for b in policy.bindings} == {"roles/artifactregistry.reader", "roles/artifactregistry.writer"}
    # separate identities: the build writes the repository and reads/writes its staging bucket; the nodes
    # only read the repository and get nothing on the bucket
    staging = storage_client(cloud.url).bucket(STAGING).get_iam_policy(requested_policy_version=3)
    granted = {(b["role"], m) for b in staging.bindings for m in b["members"] if m.startswith("serviceAccount:")}
    assert granted == {("roles/storage.objectViewer", BUILDER), ("roles/storage.objectCreator", BUILDER)}
    assert f"serviceAccount:{NODES}" not in _members(policy, "roles/artifactregistry.writer")
    assert BUILDER.split(":")[1] in cloud.iam.accounts
    bucket = storage_client(cloud.url).get_bucket(STAGING)
    assert bucket.iam_configuration.public_access_prevention == "enforced"

    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    assert "Nothing to do" in capsys.readouterr().out


def test_without_a_cluster_the_compute_default_account_pulls(cloud: Cloud, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["prereqs", "--dry-run", "--image", "--project", PROJECT, "--region", REGION, "--no-kube-context"]
    assert cli.main(args, cloud.clients()) == 0
    assert f"for {COMPUTE_DEFAULT}" in capsys.readouterr().out.split("roles/artifactregistry.reader", 1)[1].splitlines()[0]


def test_build_plans_then_pushes_then_values_writes_it(
    cloud: Cloud, source: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(image_build, "repo_root", lambda: source)  # values --image reads the repository's Dockerfile
    build = ["image", "build", "--context", str(source), *BASE]
    tag = image_build.context(source).tag
    assert cli.main(build, cloud.clients()) == 0
    out = capsys.readouterr().out
    assert f"! Artifact Registry repository {HOST} MISSING: create it with `gemma3-ray prereqs --apply --image`" in out
    assert f"push {HOST}/trainer:{tag}" in out and "Dry run: nothing changed" in out
    assert cli.main([*build, "--apply"], cloud.clients()) == 1
    assert "run `gemma3-ray prereqs --apply --image` first" in capsys.readouterr().err
    assert cli.main(["values", "--image", *BASE], cloud.clients()) == 1
    assert "build it with `gemma3-ray prereqs --apply --image`, then `gemma3-ray image build --apply`" in capsys.readouterr().err
    assert cloud.build.mutations() == []

    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    capsys.readouterr()
    assert cli.main([*build, "--apply"], cloud.clients()) == 0
    out = capsys.readouterr().out
    states = [line.split(": ")[1].split(" ")[0] for line in out.splitlines() if "build build-0001:" in line]
    assert states == ["QUEUED", "WORKING", "SUCCESS"], out
    assert f"Done: pushed {HOST}/trainer:{tag}@sha256:" in out
    uploaded = storage_client(cloud.url).bucket(STAGING).get_blob(f"source/{tag}.tgz")
    assert uploaded.download_as_bytes() == image_build.context(source).tarball()
    (made,) = cloud.build.builds.values()
    assert list(made.steps[0].args) == ["build", "--file", "images/trainer/Dockerfile", "--build-arg",
                                        "BASE_IMAGE=rayproject/ray:2.60.0-py311-gpu", "--tag", f"{HOST}/trainer:{tag}", "."]
    assert made.logs_bucket == f"gs://{STAGING}/logs"
    assert made.service_account == f"projects/{PROJECT}/serviceAccounts/{BUILDER.split(':')[1]}"  # not the nodes' account

    assert cli.main([*build, "--apply"], cloud.clients()) == 0
    assert "Nothing to do: the image of these sources exists" in capsys.readouterr().out
    assert len(cloud.build.mutations()) == 1

    values = tmp_path / "v.yaml"
    assert cli.main(["values", "--image", "-o", str(values), *BASE], cloud.clients()) == 0
    text = values.read_text()
    assert f"repository: {HOST}/trainer" in text and f"tag: {tag}" in text and "dependencies: image" in text
    from tests.plugin.test_values import assert_chart_accepts

    docs = assert_chart_accepts(text, tmp_path)  # the chart's schema and helm template (Helm 4 and 3) take it
    job = next(d for d in docs if d["kind"] == "RayJob")
    images = {c["image"] for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
              for c in g["template"]["spec"]["containers"]}
    assert images == {f"{HOST}/trainer:{tag}"}


def test_a_failed_build_prints_its_log_and_pushes_nothing(
    cloud: Cloud, source: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    capsys.readouterr()
    cloud.build.fail_step = "ERROR: No matching distribution found for torch==2.11.0"
    assert cli.main(["image", "build", "--apply", "--context", str(source), *BASE], cloud.clients()) == 1
    captured = capsys.readouterr()
    assert "| Step #0: ERROR: No matching distribution found for torch==2.11.0" in captured.out
    assert "ended FAILURE: Build step failure" in captured.err and "nothing was pushed" in captured.err
    assert "Done:" not in captured.out and cloud.registry.tags == {}


def test_grants_an_earlier_version_gave_the_nodes_account_are_revoked(
    cloud: Cloud, capsys: pytest.CaptureFixture[str],
) -> None:
    """Earlier versions built as the Compute Engine default account, which often is the nodes' too: writer on
    the repository and objectAdmin on the staging bucket. Now the nodes' identity only reads the repository."""
    from gemma3_ray.gcp import iam_policy

    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    node = f"serviceAccount:{NODES}"
    iam_policy.change_binding(iam_policy.service_account_policy(cloud.registry, REPO), "roles/artifactregistry.writer",
                              node, present=True)
    iam_policy.change_binding(iam_policy.bucket_policy(storage_client(cloud.url).bucket(STAGING)),
                              "roles/storage.objectAdmin", node, present=True)
    capsys.readouterr()
    assert cli.main(["prereqs", "--image", *BASE], cloud.clients()) == 0
    out = capsys.readouterr().out
    assert f"+ revoke roles/artifactregistry.writer on {HOST} from {node}" in out
    assert f"+ revoke roles/storage.objectAdmin on gs://{STAGING} from {node}" in out
    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    assert _members(cloud.registry.policies[REPO], "roles/artifactregistry.writer") == {BUILDER}
    assert _members(cloud.registry.policies[REPO], "roles/artifactregistry.reader") == {node}
    assert node not in {m for b in storage_client(cloud.url).bucket(STAGING).get_iam_policy(
        requested_policy_version=3).bindings for m in b["members"]}


def test_the_builder_grant_is_what_lets_it_push(cloud: Cloud, source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    policy = cloud.registry.policies[REPO]
    for b in policy.bindings:
        if b.role == "roles/artifactregistry.writer":
            b.members.remove(BUILDER)
    assert cli.main(["image", "build", "--apply", "--context", str(source), *BASE], cloud.clients()) == 1
    assert "uploadArtifacts\" denied" in capsys.readouterr().err
    assert cloud.registry.tags == {}


def test_missing_build_permissions_stop_it_before_the_upload(
    cloud: Cloud, source: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    cloud.rm.granted = {"artifactregistry.repositories.get", "artifactregistry.tags.get", "storage.objects.create"}
    assert cli.main(["image", "build", "--apply", "--context", str(source), *BASE], cloud.clients()) == 1
    err = capsys.readouterr().err
    assert "you lack cloudbuild.builds.create, cloudbuild.builds.get" in err and "roles/cloudbuild.builds.editor" in err
    assert list(storage_client(cloud.url).list_blobs(STAGING)) == []
    assert cloud.build.mutations() == []


def test_doctor_checks_the_image_the_values_name(
    cloud: Cloud, source: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gemma3_ray.config.deployment import Overrides, resolve
    from gemma3_ray.release import doctor_gke

    monkeypatch.setattr(image_build, "repo_root", lambda: source)
    dep = resolve(Overrides(project=PROJECT, region=REGION, cluster="trainers"), None, None)
    tag = image_build.context().tag
    values = {"workers": {"image": {"repository": f"{HOST}/trainer", "tag": tag}}}
    (missing,) = doctor_gke.image_checks(dep, cloud.clients(), values)
    assert not missing.ok and "after `gemma3-ray prereqs --apply --image`" in missing.detail
    assert doctor_gke.image_checks(dep, cloud.clients(), {"workers": {"image": {"repository": "rayproject/ray"}}}) == []

    assert cli.main(["prereqs", "--apply", "--image", *BASE], cloud.clients()) == 0
    assert cli.main(["image", "build", "--apply", *BASE], cloud.clients()) == 0
    capsys.readouterr()
    checks = doctor_gke.image_checks(dep, cloud.clients(), values)
    assert [c.line() for c in checks] == [f"[ok] training image: {HOST}/trainer:{tag} exists",
                                          f"[ok] image pull access: {NODES} may read {HOST}"]

    (source / "trainer/requirements.txt").write_text("ray[train]==2.60.0\ntorch==2.11.1\n")
    for b in cloud.registry.policies[REPO].bindings:
        if b.role == "roles/artifactregistry.reader":
            b.members.remove(f"serviceAccount:{NODES}")
    by_name = {c.name: c for c in doctor_gke.image_checks(dep, cloud.clients(), values)}
    assert by_name["training image sources"].line().startswith("[warn]")
    assert not by_name["image pull access"].ok and "run `gemma3-ray prereqs --apply --image`" in by_name["image pull access"].detail


@pytest.mark.usefixtures("gcloud_home")
def test_offline_plan_without_credentials(source: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    args = ["image", "build", "--context", str(source), *BASE]
    assert cli.main(args, Clients(project=PROJECT)) == 0
    out = capsys.readouterr().out
    assert f"image {HOST}/trainer:{image_build.context(source).tag}: not checked (not logged in)" in out
    assert cli.main([*args, "--apply"], Clients(project=PROJECT)) == 1
    assert "Not logged in" in capsys.readouterr().err


@pytest.mark.usefixtures("gcloud_home")
def test_the_image_prerequisites_plan_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gemma3_ray.config.deployment import Overrides, resolve
    from gemma3_ray.gcp.artifact_registry import RegistryPrereqs
    from gemma3_ray.utils.plan import Plan

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    plan = Plan()
    RegistryPrereqs(resolve(Overrides(project=PROJECT, region=REGION), None, None), Clients(project=PROJECT)).extend(plan)
    # APIs, repository, staging bucket, the nodes' reader grant, the build's account, its writer grant, its two
    # staging bucket grants
    assert len(plan.actions) == 8 and all(a.text.endswith("[not checked: not logged in]") for a in plan.actions)
    assert any("the build's service account gemma3-ray-build@" in a.text for a in plan.actions)
    with pytest.raises(image_build.UserError, match="Not logged in"):
        plan.actions[0].run()


def test_an_autopilot_cluster_pulls_as_its_auto_provisioning_account(cloud: Cloud,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from gemma3_ray.gke import cluster as gke_cluster

    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "auto", node_service_account=NODES.replace("nodes@", "auto-nodes@"))
    cloud.container.ready(REGION, gke_cluster.desired_cluster(spec))
    args = ["prereqs", "--dry-run", "--image", "--project", PROJECT, "--region", REGION, "--cluster", "auto",
            "--no-kube-context"]
    assert cli.main(args, cloud.clients()) == 0
    assert f"roles/artifactregistry.reader on {HOST} for serviceAccount:auto-{NODES}" in capsys.readouterr().out


def test_a_missing_staging_bucket_is_named_not_a_traceback(cloud: Cloud, source: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from google.cloud import artifactregistry_v1 as ar

    cloud.registry.create_repository(request={"parent": REPO.rsplit("/repositories/", 1)[0], "repository_id": "gemma3-ray",
                                              "repository": ar.Repository(format_=ar.Repository.Format.DOCKER)})
    build = ["image", "build", "--context", str(source), *BASE]
    assert cli.main(build, cloud.clients()) == 0
    assert f"! build staging bucket gs://{STAGING} MISSING" in capsys.readouterr().out
    assert cli.main([*build, "--apply"], cloud.clients()) == 1
    assert f"The build staging bucket gs://{STAGING} does not exist: run `gemma3-ray prereqs --apply --image` first." in \
        capsys.readouterr().err
    assert cloud.build.mutations() == []
