"""`values`: derived from gcloud state and the kube context, stable, comment-preserving, and accepted by the
chart (its JSON schema and `helm template` with Helm 4 and Helm 3)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from gemma3_ray import cli
from gemma3_ray.config import fits, machine_shapes
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.kube_context import parse_gke_context
from gemma3_ray.utils import names
from gemma3_ray.utils.errors import InvalidName, MissingSetting, UserError
from google.cloud import compute_v1

from tests.plugin.conftest import ROOT, GcloudHome

CHART = ROOT / "charts" / "gemma3-ray"
HELMS = {"helm4": os.environ.get("HELM", str(ROOT / ".tools/bin/helm")),
         "helm3": os.environ.get("HELM3", str(ROOT / ".tools/bin/helm3"))}
GCLOUD_PROPS = {"core": {"project": "acme-ml-1", "account": "ml@acme.example"},
                "compute": {"region": "us-central1", "zone": "us-central1-c"}}


def values(capsys: pytest.CaptureFixture[str], *args: str, clients: Clients | None = None) -> str:
    rc = cli.main(["values", *args], clients)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return captured.out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def assert_chart_accepts(text: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The values pass the chart's schema and render with both Helm majors; returns the rendered objects."""
    mine = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(_merge(yaml.safe_load((CHART / "values.yaml").read_text()), mine), schema)
    path = tmp_path / "values.yaml"
    path.write_text(text)
    docs: list[dict[str, Any]] = []
    for helm in HELMS.values():
        out = subprocess.run([helm, "template", "t", str(CHART), "-n", "ml", "-f", str(path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return docs


def _find(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def test_values_from_a_named_gcloud_configuration_render_with_the_chart(
    gcloud_home: GcloudHome, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    gcloud_home.write("default", {"core": {"project": "wrong-proj-0"}})
    gcloud_home.write("ml", GCLOUD_PROPS, activate=True)
    text = values(capsys, "--machine-type", "a3-ultragpu-8g", "--replicas", "2", "-n", "ml")
    v = yaml.safe_load(text)
    gsa = names.release_gsa_id("ml", "gemma3-ray")  # the release's own service account
    assert v["serviceAccount"]["gcpServiceAccount"] == f"{gsa}@acme-ml-1.iam.gserviceaccount.com"
    assert v["storage"]["bucket"] == "acme-ml-1-gemma3-ray"
    assert (v["workers"]["accelerator"], v["workers"]["gpusPerNode"], v["workers"]["replicas"]) == (
        "nvidia-h200-141gb", 8, 2)
    assert "gcloud configuration 'ml'" in text and "# Workload Identity" in text

    docs = assert_chart_accepts(text, tmp_path)
    sa = _find(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == v["serviceAccount"]["gcpServiceAccount"]
    assert sa["metadata"]["name"] == "gemma3-ray"
    entry = _find(docs, "RayJob")["spec"]["entrypoint"]
    assert "--num_workers=16" in entry and "--storage_path=gs://acme-ml-1-gemma3-ray/gemma3-ray/ml/gemma3-ray" in entry
    assert "nvidia-h200-141gb" in json.dumps(_find(docs, "RayJob"))


@pytest.mark.parametrize("machine", ["a4-highgpu-8g", "a3-megagpu-8g", "a3-highgpu-8g", "g2-standard-24",
                                     "g2-standard-8"])
def test_every_machine_shape_renders(machine: str, gcloud_home: GcloudHome, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    text = values(capsys, "--machine-type", machine, "--reservation", "projects/acme-ml-1/reservations/h-res")
    shape = machine_shapes.shape_for_machine_type(machine)
    docs = assert_chart_accepts(text, tmp_path)
    rendered = json.dumps(_find(docs, "RayJob"))
    assert f'"nvidia.com/gpu": {shape.gpus_per_node}' in rendered
    assert shape.accelerator in rendered and "h-res" in rendered
    # The default model (4B) fits the GPU as the fit table measured it (fits.toml): the fast recipe at its own
    # micro-batch 16 on an H200 or B200, a smaller one below, the tutorial's 4-bit recipe on a 24 GB L4 — in the
    # RayJob the chart renders.
    entry = _find(docs, "RayJob")["spec"]["entrypoint"]
    cell = fits.table().cell("4b", shape.accelerator)
    assert cell is not None and cell.fits
    assert ("--recipe=tutorial" in entry) is (cell.recipe == "tutorial")
    if cell.micro_batch == fits.RECIPE_MICRO_BATCH[cell.recipe]:
        assert "--per_device_train_batch_size" not in entry
    else:
        assert f"--per_device_train_batch_size={cell.micro_batch} " in entry + " "


def test_every_known_accelerator_has_a_memory_size() -> None:
    accelerators = {machine_shapes.shape_for_machine_type(m).accelerator for m in machine_shapes.KNOWN_MACHINE_TYPES}
    assert accelerators <= set(machine_shapes.GPU_MEMORY_GB)


def test_kube_context_wins_over_gcloud_and_flags_win_over_both(
    gcloud_home: GcloudHome, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    kubeconfig = tmp_path / "kubeconfig"
    ctx = "gke_cluster-proj-7_europe-west4-a_trainers"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": ctx,
        "clusters": [{"name": ctx, "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": ctx, "user": {"token": "x"}}],
        "contexts": [{"name": ctx, "context": {"cluster": ctx, "user": ctx}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    v = yaml.safe_load(text := values(capsys))
    assert v["storage"]["bucket"] == "cluster-proj-7-gemma3-ray"
    assert "cluster trainers" in text and "region europe-west4" in text
    v = yaml.safe_load(values(capsys, "--project", "flag-proj-3", "--bucket", "my-bucket", "--region", "us-east4",
                              "--zone", "us-east4-a"))
    assert v["storage"]["bucket"] == "my-bucket"
    gsa = names.release_gsa_id("default", "gemma3-ray")
    assert v["serviceAccount"]["gcpServiceAccount"] == f"{gsa}@flag-proj-3.iam.gserviceaccount.com"


def test_output_is_stable_and_an_existing_file_keeps_its_comments_and_keys(
    gcloud_home: GcloudHome, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    first = values(capsys, "--machine-type", "a4-highgpu-8g")
    assert values(capsys, "--machine-type", "a4-highgpu-8g") == first

    mine = tmp_path / "my.yaml"
    mine.write_text(
        "# my team's overrides\n"
        "training:\n"
        "  model_id: google/gemma-3-12b-pt  # the bigger one\n"
        "  num_train_epochs: 3\n"
        "workers:\n"
        "  # keep two nodes\n"
        "  replicas: 5\n"
        "  shmSize: 32Gi\n"
    )
    assert cli.main(["values", "-o", str(mine), "--machine-type", "g2-standard-24", "--replicas", "2"]) == 0
    updated = mine.read_text()
    for kept in ("# my team's overrides", "model_id: google/gemma-3-12b-pt  # the bigger one",
                 "# keep two nodes", "shmSize: 32Gi", "num_train_epochs: 3"):
        assert kept in updated
    assert updated.index("training:") < updated.index("workers:") < updated.index("serviceAccount:")
    v = yaml.safe_load(updated)
    assert (v["workers"]["replicas"], v["workers"]["accelerator"]) == (2, "nvidia-l4")
    again = mine.read_bytes()
    assert cli.main(["values", "-o", str(mine), "--machine-type", "g2-standard-24", "--replicas", "2"]) == 0
    assert mine.read_bytes() == again
    assert_chart_accepts(updated, tmp_path)


class FakeReservations:
    """compute_v1.ReservationsClient.get over real Reservation messages."""

    def __init__(self, reservations: dict[tuple[str, str, str], compute_v1.Reservation]) -> None:
        self.reservations = reservations
        self.calls: list[tuple[str, str, str]] = []

    def get(self, *, project: str, zone: str, reservation: str) -> compute_v1.Reservation:
        from google.api_core import exceptions as gexc

        self.calls.append((project, zone, reservation))
        try:
            return self.reservations[(project, zone, reservation)]
        except KeyError:
            raise gexc.NotFound(f"The resource 'projects/{project}/zones/{zone}/reservations/{reservation}' was not found") from None


def _reservation(machine_type: str = "", accel: tuple[str, int] | None = None) -> compute_v1.Reservation:
    props = compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(machine_type=machine_type)
    if accel:
        props.guest_accelerators = [compute_v1.AcceleratorConfig(accelerator_type=accel[0], accelerator_count=accel[1])]
    return compute_v1.Reservation(specific_reservation=compute_v1.AllocationSpecificSKUReservation(
        count=4, instance_properties=props))


def test_reservation_is_read_through_the_compute_api(gcloud_home: GcloudHome, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    fake = FakeReservations({
        ("acme-ml-1", "us-central1-c", "b200-res"): _reservation("a4-highgpu-8g"),
        ("shared-proj-1", "us-central1-c", "l4-res"): _reservation("", ("nvidia-l4", 4)),
    })
    clients = Clients(project="acme-ml-1", reservations=fake)
    v = yaml.safe_load(values(capsys, "--reservation", "b200-res", clients=clients))
    assert (v["workers"]["accelerator"], v["workers"]["gpusPerNode"]) == ("nvidia-b200", 8)
    assert v["capacity"] == {"type": "reservation", "reservation": "b200-res"}
    text = values(capsys, "--reservation", "projects/shared-proj-1/reservations/l4-res", clients=clients)
    v = yaml.safe_load(text)
    assert (v["workers"]["accelerator"], v["workers"]["gpusPerNode"]) == ("nvidia-l4", 4)
    assert fake.calls[-1] == ("shared-proj-1", "us-central1-c", "l4-res")
    assert_chart_accepts(text, tmp_path)

    assert cli.main(["values", "--reservation", "missing-res"], clients) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(("machine", "accel", "gpus"), [
    ("a4-highgpu-8g", "nvidia-b200", 8), ("a3-ultragpu-8g", "nvidia-h200-141gb", 8),
    ("a3-megagpu-8g", "nvidia-h100-mega-80gb", 8), ("a3-highgpu-8g", "nvidia-h100-80gb", 8),
    ("a3-highgpu-2g", "nvidia-h100-80gb", 2), ("g2-standard-4", "nvidia-l4", 1), ("g2-standard-48", "nvidia-l4", 4),
    ("g2-standard-96", "nvidia-l4", 8), ("a2-ultragpu-4g", "nvidia-a100-80gb", 4),
])
def test_machine_shapes(machine: str, accel: str, gpus: int) -> None:
    shape = machine_shapes.shape_for_machine_type(machine)
    assert (shape.accelerator, shape.gpus_per_node) == (accel, gpus)
    cpu, memory = machine_shapes.node_resources(shape) or (0, "")
    vcpus, _ = machine_shapes.node_size(machine) or (0, 0)
    assert 0 < cpu < vcpus and memory.endswith("Gi")


@pytest.mark.parametrize("machine", ["g2-standard-5", "n2-standard-8", "a3-highgpu-3g"])
def test_unknown_machine_types_are_refused(machine: str) -> None:
    with pytest.raises(InvalidName, match="--accelerator and --gpus-per-node"):
        machine_shapes.shape_for_machine_type(machine)


def test_gke_context_names() -> None:
    c = parse_gke_context("gke_my-proj-1_us-central1-a_gpu-cluster")
    assert c is not None and (c.project, c.location, c.name, c.region) == ("my-proj-1", "us-central1-a", "gpu-cluster", "us-central1")
    assert parse_gke_context("gke_my-proj-1_europe-west4_c1").region == "europe-west4"  # type: ignore[union-attr]
    for other in ("kind-kind", "gke_a_b", "gke_my-proj-1_nowhere_c1", "arn:aws:eks:x", "gke_My_us-central1_c"):
        assert parse_gke_context(other) is None


def test_missing_project_and_region_are_explained(gcloud_home: GcloudHome, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["values"]) == MissingSetting.exit_code
    err = capsys.readouterr().err
    assert "gcloud config set project" in err and 'make prereqs ARGS="--project P --region R"' in err
    gcloud_home.write("default", {"core": {"project": "acme-ml-1"}}, activate=True)
    assert cli.main(["values"]) == MissingSetting.exit_code
    err = capsys.readouterr().err  # the same two ways as the project's: the flag (in make's form) or gcloud (#27 item 4)
    assert "gcloud config set compute/region" in err and 'make prereqs ARGS="--region us-central1"' in err
    assert issubclass(MissingSetting, UserError)


@pytest.mark.parametrize("major", list(HELMS))
def test_up_renders_the_release_through_pyhelm3(major: str, gcloud_home: GcloudHome, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`up` hands the generated values to helm through pyhelm3; rendering the same call offline proves
    the values and the chart agree on every key (pyhelm3's template uses the same helm invocation)."""
    from gemma3_ray.config import render
    from gemma3_ray.kube import helm_release

    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    path = tmp_path / "v.yaml"
    path.write_text(values(capsys, "--machine-type", "a3-megagpu-8g"))
    monkeypatch.setenv("HELM", HELMS[major])
    monkeypatch.delenv("HELM_BIN", raising=False)
    objs = helm_release.template(helm_release.client(None, None), "t", helm_release.chart_path(None), [render.load_plain(path)], "ml")
    kinds = {o["kind"] for o in objs}
    assert {"ServiceAccount", "RayJob"} <= kinds
    job = next(o for o in objs if o["kind"] == "RayJob")
    assert "nvidia-h100-mega-80gb" in json.dumps(job)


def test_owned_keys_are_authoritative_on_every_write(gcloud_home: GcloudHome, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #12 (1): values for an L4 on a reservation, then for a B200 on demand, into the same file:
    nothing of the first run survives (the chart would render B200 nodes on the L4 reservation with the
    tutorial recipe), and the user's own keys and comments stay."""
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    mine = tmp_path / "my.yaml"
    mine.write_text("# my team's file\ntraining:\n  model_id: google/gemma-3-12b-pt  # the bigger one\n"
                    "  # our learning rate\n  learning_rate: 0.0001\n")
    assert cli.main(["values", "-o", str(mine), "--machine-type", "g2-standard-8", "--reservation", "l4-res"]) == 0
    first = yaml.safe_load(mine.read_text())
    assert first["training"]["recipe"] == "tutorial"
    assert first["capacity"] == {"type": "reservation", "reservation": "l4-res"}
    # the user adds a note after the plugin's keys; it must survive their removal
    mine.write_text(mine.read_text() + "# note: ask #ml-infra before changing the bucket\nnameOverride: gemma3-ray\n")

    assert cli.main(["values", "-o", str(mine), "--machine-type", "a4-highgpu-8g"]) == 0
    text = mine.read_text()
    v = yaml.safe_load(text)
    assert "recipe" not in v["training"] and "capacity" not in v
    assert "l4-res" not in text and "tutorial" not in text and "g2-standard-8" not in text
    assert (v["workers"]["accelerator"], v["workers"]["gpusPerNode"]) == ("nvidia-b200", 8)
    # the file's model is 12B: the fit table's micro-batch for it on a B200 (fits.toml), the L4's recipe gone
    assert v["training"] == {"model_id": "google/gemma-3-12b-pt", "learning_rate": 0.0001,
                             "per_device_train_batch_size": 8}
    for kept in ("# my team's file", "# the bigger one", "# our learning rate",
                 "# note: ask #ml-infra before changing the bucket"):
        assert kept in text
    docs = assert_chart_accepts(text, tmp_path)
    rendered = json.dumps(_find(docs, "RayJob"))
    assert "l4-res" not in rendered and "--recipe" not in rendered

    # and back: the reservation keys return, stable on a re-run
    assert cli.main(["values", "-o", str(mine), "--machine-type", "g2-standard-8", "--reservation", "l4-res"]) == 0
    again = mine.read_bytes()
    assert yaml.safe_load(again)["capacity"]["reservation"] == "l4-res"
    assert cli.main(["values", "-o", str(mine), "--machine-type", "g2-standard-8", "--reservation", "l4-res"]) == 0
    assert mine.read_bytes() == again
    capsys.readouterr()


def test_a_values_file_without_a_shape_drops_the_old_shape(gcloud_home: GcloudHome, tmp_path: Path) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    mine = tmp_path / "v.yaml"
    assert cli.main(["values", "-o", str(mine), "--machine-type", "a3-highgpu-8g"]) == 0
    assert yaml.safe_load(mine.read_text())["training"] == {"per_device_train_batch_size": 8}
    assert cli.main(["values", "-o", str(mine)]) == 0
    v = yaml.safe_load(mine.read_text())
    assert "training" not in v and set(v["workers"]) == {"replicas"}
    assert_chart_accepts(mine.read_text(), tmp_path)


def test_the_header_follows_the_latest_run(gcloud_home: GcloudHome, tmp_path: Path) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    mine = tmp_path / "v.yaml"
    assert cli.main(["values", "-o", str(mine), "--machine-type", "g2-standard-8", "--reservation", "l4-res"]) == 0
    head = mine.read_text().split("\nserviceAccount:")[0]
    assert "--machine-type" in head and "--reservation" in head
    mine.write_text(mine.read_text().replace("serviceAccount:", "# my line\nserviceAccount:", 1))
    assert cli.main(["values", "-o", str(mine), "--machine-type", "a4-highgpu-8g", "-n", "team-a"]) == 0
    head = mine.read_text().split("\nserviceAccount:")[0]
    assert "--reservation" not in head and "namespace team-a" in head and "# my line" in head


@pytest.mark.parametrize(("flags", "flag", "fix"), [
    (["--machine-type", "a2-megagpu-16g"], "--machine-type a2-megagpu-16g", "a2-highgpu-8g"),
    (["--accelerator", "nvidia-l4", "--gpus-per-node", "-1"], "--gpus-per-node -1", "1, 2, 4 or 8"),
    (["--accelerator", "nvidia-l4", "--gpus-per-node", "16"], "--gpus-per-node 16", "1, 2, 4 or 8"),
    (["--accelerator", "x", "--gpus-per-node", "1"], "--accelerator 'x'", "nvidia-l4"),
    (["--accelerator", "nvidia-l4"], "--accelerator and --gpus-per-node", "pass both"),
    (["--prefix", "a b;$(id)"], "--prefix 'a b;$(id)'", "team-a/gemma3-ray"),
    (["--prefix", "team/../other"], "--prefix", "'..'"),
    (["--prefix", "/"], "--prefix", "team-a/gemma3-ray"),
    (["--reservation", "projects/p/reservation/x"], "reservation", "reservationBlocks"),
])
def test_shape_and_prefix_flags_are_checked_at_the_flag(flags: list[str], flag: str, fix: str,
                                                       gcloud_home: GcloudHome,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #12 (5): refused in one sentence naming the flag and the fix, before any API call (no
    clients given: any Google call would fail with "Not logged in")."""
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    assert cli.main(["values", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gemma3-ray: error: ") and "\n" not in err, err
    assert flag in err and fix in err, err
    assert "Not logged in" not in err


def test_reservation_without_a_zone_says_so_before_looking_for_credentials(
    gcloud_home: GcloudHome, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #12 (8): it used to say "Not logged in" (the Compute client was built first)."""
    gcloud_home.write("default", {"core": {"project": "acme-ml-1"}, "compute": {"region": "us-central1"}},
                      activate=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    assert cli.main(["values", "--reservation", "l4-res"]) == 2
    err = capsys.readouterr().err
    assert "--reservation l4-res is read through the Compute API in its zone: pass --zone" in err
    assert "Not logged in" not in err


@pytest.mark.parametrize(("reservation", "owner", "block"), [
    ("l4-res/reservationBlocks/block-1", "acme-ml-1", "block-1"),
    ("projects/shared-proj-1/reservations/l4-res/reservationBlocks/b2", "shared-proj-1", "b2"),
])
def test_reservation_block_paths_are_accepted_and_rendered(reservation: str, owner: str, block: str,
                                                           gcloud_home: GcloudHome, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #12 (8): GKE consumes one block of a reservation with the reservation-blocks node label."""
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    fake = FakeReservations({(owner, "us-central1-c", "l4-res"): _reservation("g2-standard-48")})
    text = values(capsys, "--reservation", reservation, clients=Clients(project="acme-ml-1", reservations=fake))
    assert fake.calls == [(owner, "us-central1-c", "l4-res")]
    assert yaml.safe_load(text)["capacity"] == {"type": "reservation", "reservation": reservation}
    sel = _find(assert_chart_accepts(text, tmp_path), "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0][
        "template"]["spec"]["nodeSelector"]
    assert sel["cloud.google.com/reservation-name"] == "l4-res"
    assert sel["cloud.google.com/reservation-blocks"] == block
    assert sel["cloud.google.com/reservation-affinity"] == "specific"
    assert (sel.get("cloud.google.com/reservation-project") == owner) is reservation.startswith("projects/")


def test_the_flag_checks_agree_with_the_charts_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    workers = schema["properties"]["workers"]["properties"]
    assert set(machine_shapes.GPUS_PER_NODE) == set(workers["gpusPerNode"]["enum"]) - {0}
    import re

    pattern = re.compile(workers["accelerator"]["pattern"])
    for accel in machine_shapes.GPU_MEMORY_GB:
        assert pattern.match(machine_shapes.accelerator(accel))
    prefix = re.compile(schema["properties"]["storage"]["properties"]["prefix"]["pattern"])
    from gemma3_ray.utils import names

    for ok in ("gemma3-ray/r1", "a.b/c_d/e=f", "x"):
        assert prefix.match(names.prefix(ok))
