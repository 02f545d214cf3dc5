"""The fit table (plugin/gemma3_ray/config/fits.toml, issue #46): its rules against the results files and the bench's
scenarios, and `values` writing, for each machine family and Gemma 3 size, a recipe the table says fits — or refusing
in one sentence, before anything is written, what does not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from gemma3_ray import cli
from gemma3_ray.config import fits, machine_shapes

from bench import scenario_table
from tests.plugin.conftest import ROOT, GcloudHome

GCLOUD_PROPS = {"core": {"project": "acme-ml-1", "account": "ml@acme.example"},
                "compute": {"region": "us-central1", "zone": "us-central1-c"}}
# One machine type of each GPU family the plugin knows.
FAMILIES = {"a4-highgpu-8g": "nvidia-b200", "a3-ultragpu-8g": "nvidia-h200-141gb", "a3-highgpu-8g": "nvidia-h100-80gb",
            "a2-ultragpu-8g": "nvidia-a100-80gb", "a2-highgpu-8g": "nvidia-tesla-a100", "g2-standard-24": "nvidia-l4",
            "g4-standard-384": "nvidia-rtx-pro-6000"}


def _results_line(source: str) -> dict:
    path, scenario = source.split()
    for line in (ROOT / path).read_text().splitlines():
        row = json.loads(line)
        if row.get("scenario") == scenario:
            return row
    raise AssertionError(f"{path} has no line of scenario {scenario}")


def problems(table: fits.Table) -> list[str]:
    """Every way the table breaks its rules (fits.toml's header); [] when it holds."""
    out: list[str] = []
    classes = {g.name: g for g in table.gpus}
    for accel in machine_shapes.GPU_MEMORY_GB:
        owners = [g.name for g in table.gpus if accel in g.accelerators]
        if len(owners) != 1:
            out.append(f"{accel} is in {len(owners)} classes")
    scenarios = {s.name: s for s in scenario_table.load()}
    for g in table.gpus:
        for size in fits.SIZES:
            cells = [c for c in table.cells if c.size == size and c.gpu == g.name]
            if len(cells) != 1:
                out.append(f"{size} x {g.name}: {len(cells)} cells")
    for c in table.cells:
        where = f"{c.size} x {c.gpu}"
        gpu = classes.get(c.gpu)
        if gpu is None:
            out.append(f"{where}: no class {c.gpu}")
            continue
        if c.derived:
            if gpu.emulated_gib is not None:
                out.append(f"{where}: derived, but the class is emulated here: measure it")
            base = next((b for b in table.cells if b.size == c.size and c.derived.startswith(b.gpu + ":")), None)
            if base is None or not base.source or (base.recipe, base.micro_batch) != (c.recipe, c.micro_batch):
                out.append(f"{where}: derived from no measured cell of the same recipe and micro-batch")
            continue
        if not c.source:
            out.append(f"{where}: neither measured nor derived")
            continue
        line = _results_line(c.source)
        cap = line.get("memory_cap_gib")
        if not line.get("ok") or line.get("peak_reserved_gib") is None:
            out.append(f"{where}: its results line did not run ({line.get('error')})")
            continue
        if abs(line["peak_reserved_gib"] - c.peak_gib) > 0.05:
            out.append(f"{where}: peak {c.peak_gib} GiB, its results line {line['peak_reserved_gib']:.2f}")
        if (line.get("size") or "4b") != c.size:
            out.append(f"{where}: its results line trained {line.get('size')}")
        if gpu.emulated_gib is not None and cap is not None and abs(cap - gpu.emulated_gib) > 0.01:
            out.append(f"{where}: measured capped at {cap} GiB, the class emulates {gpu.emulated_gib}")
        if cap is None and gpu.emulated_gib is not None and gpu.emulated_gib < 139:
            out.append(f"{where}: measured on the whole H200, not capped to the class")
        if not c.fits:
            if c.peak_gib <= table.headroom * gpu.emulated_gib or not c.instead:
                out.append(f"{where}: refused, but its peak leaves headroom or it names nothing instead")
            continue
        flags = line.get("flags") or {}
        if (flags.get("recipe"), flags.get("per_device_train_batch_size")) != (c.recipe, c.micro_batch):
            out.append(f"{where}: the cell says {c.recipe} x {c.micro_batch}, its results line ran "
                       f"{flags.get('recipe')} x {flags.get('per_device_train_batch_size')}")
        if c.peak_gib > table.headroom * gpu.emulated_gib:
            out.append(f"{where}: {c.peak_gib} GiB is over {table.headroom:.0%} of {gpu.emulated_gib} GiB")
        if abs((line.get("samples_per_s") or 0) - (c.samples_per_s or 0)) > 0.01:
            out.append(f"{where}: {c.samples_per_s} samples/s, its results line {line.get('samples_per_s')}")
        s = scenarios.get(c.source.split()[1])
        if s is None:
            out.append(f"{where}: no scenario {c.source.split()[1]} in bench/scenarios.toml re-proves it")
        elif s.name.startswith("fit_"):
            opts = " ".join(s.options) + " " + " ".join(s.flags)
            want = [f"--size {c.size}", f"--recipe={c.recipe}", f"--per_device_train_batch_size={c.micro_batch} "]
            if cap is not None:
                want.append(f"--memory_gib {gpu.emulated_gib}")
            missing = [w for w in want if w not in opts + " "]
            if missing or s.group not in ("fits", "fits_27b"):
                out.append(f"{where}: scenario {s.name} does not run the cell ({', '.join(missing) or s.group})")
    return out


def test_the_fit_table_holds_its_rules() -> None:
    assert problems(fits.table()) == []


def test_the_rules_catch_a_cell_over_its_headroom_and_a_micro_batch_not_measured() -> None:
    t = fits.table()
    bad = [dataclasses.replace(c, peak_gib=70.5) if (c.size, c.gpu) == ("12b", "80gb") else c for c in t.cells]
    bad = [dataclasses.replace(c, micro_batch=12) if (c.size, c.gpu) == ("4b", "a100-40") else c for c in bad]
    bad.append(dataclasses.replace(bad[0]))
    found = problems(dataclasses.replace(t, cells=tuple(bad)))
    assert any("12b x 80gb" in p and "peak" in p for p in found), found
    assert any("4b x a100-40" in p and "x 4" in p for p in found), found
    assert any("4b x l4-24: 2 cells" in p for p in found), found


def _values(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(["values", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("size", fits.SIZES)
@pytest.mark.parametrize("machine", sorted(FAMILIES))
def test_values_writes_what_the_table_says_fits_each_family_and_size(
    machine: str, size: str, gcloud_home: GcloudHome, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    assert machine_shapes.shape_for_machine_type(machine).accelerator == FAMILIES[machine]
    model = f"google/gemma-3-{size}-it"
    out_file = tmp_path / "values.yaml"
    out_file.write_text("training:\n  num_train_epochs: 2  # mine\n")
    rc, out, err = _values(capsys, "--machine-type", machine, "--model", model, "-o", str(out_file))
    cell = fits.table().cell(size, FAMILIES[machine])
    assert cell is not None
    if not cell.fits:
        assert rc != 0 and "Traceback" not in err
        assert f"Gemma 3 {size.upper()} does not fit {FAMILIES[machine]}" in err and "12B" in err
        assert len(err.strip().splitlines()) == 1
        assert out_file.read_text() == "training:\n  num_train_epochs: 2  # mine\n"  # nothing written
        return
    assert rc == 0, err
    training = yaml.safe_load(out_file.read_text())["training"]
    assert training["model_id"] == model and training["num_train_epochs"] == 2
    assert training.get("recipe", "fast") == cell.recipe
    assert training.get("per_device_train_batch_size", fits.RECIPE_MICRO_BATCH[cell.recipe]) == cell.micro_batch
    # re-run without --model: the size comes from the file's model_id, the same cell, the model kept
    rc, _, err = _values(capsys, "--machine-type", machine, "-o", str(out_file))
    assert rc == 0, err
    again = yaml.safe_load(out_file.read_text())["training"]
    assert again == training


def test_a_model_id_that_names_no_size_asks_for_model_size(
    gcloud_home: GcloudHome, capsys: pytest.CaptureFixture[str],
) -> None:
    gcloud_home.write("default", GCLOUD_PROPS, activate=True)
    rc, out, err = _values(capsys, "--machine-type", "a3-highgpu-8g", "--model", "gs://acme/my-finetuned-vlm")
    assert rc != 0 and out == ""
    assert "--model-size" in err and "Traceback" not in err
    rc, out, err = _values(capsys, "--machine-type", "a3-highgpu-8g", "--model", "gs://acme/my-finetuned-vlm",
                           "--model-size", "12b")
    assert rc == 0, err
    training = yaml.safe_load(out)["training"]
    assert training == {"model_id": "gs://acme/my-finetuned-vlm", "per_device_train_batch_size": 6}


def test_the_bench_rows_of_the_table_are_the_fits_groups() -> None:
    """Every fit_ scenario is a cell of the table (a row nobody reads would re-prove nothing)."""
    cells = {c.source.split()[1] for c in fits.table().cells if c.source}
    rows = {s.name for s in scenario_table.load() if s.group in ("fits", "fits_27b") and s.run == "row"}
    assert rows <= cells, sorted(rows - cells)


def test_doctor_check_names_a_micro_batch_over_the_measured_one() -> None:
    assert fits.check_values("12b", "nvidia-h100-80gb", None, 6) is None
    msg = fits.check_values("12b", "nvidia-h100-80gb", None, None)
    assert msg is not None and "set it to 6 or less" in msg
    msg = fits.check_values("27b", "nvidia-h100-80gb", "fast", 4)
    assert msg is not None and "training.recipe: tutorial" in msg
    assert "does not fit" in (fits.check_values("27b", "nvidia-l4", "tutorial", 1) or "")


def test_doctor_fails_values_that_need_more_than_the_table_measured() -> None:
    from gemma3_ray.release import doctor

    h100 = {"workers": {"accelerator": "nvidia-h100-80gb"}}
    # the chart's default micro-batch (16) on an 80 GB GPU: more than the 8 measured there
    [check] = doctor.check_fit({**h100, "training": {}})
    assert not check.ok and "set it to 8 or less" in check.detail
    [check] = doctor.check_fit({**h100, "training": {"per_device_train_batch_size": 8}})
    assert check.ok, check.detail
    [check] = doctor.check_fit({"workers": {"accelerator": "nvidia-l4"},
                                "training": {"model_id": "google/gemma-3-27b-it", "recipe": "tutorial"}})
    assert not check.ok and "does not fit nvidia-l4" in check.detail
    [check] = doctor.check_fit({**h100, "training": {"model_id": "/models/mine"}})
    assert check.ok and "--model-size" in check.detail  # a warning: the size is unknown
    assert doctor.check_fit(None) == []


def test_the_plugin_readme_shows_the_table_as_it_is() -> None:
    text = (ROOT / "plugin" / "README.md").read_text()
    shown = text.split("<!-- fits:begin")[1].split("-->", 1)[1].split("<!-- fits:end -->")[0].strip()
    assert shown == fits.markdown()


@pytest.mark.parametrize("path", sorted((ROOT / "values").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_values_file_fits_its_gpu(path: Path) -> None:
    from gemma3_ray.release import doctor

    values = yaml.safe_load(path.read_text()) or {}
    if not (values.get("workers") or {}).get("accelerator"):
        pytest.skip("no GPU named (the chart's default B200 is checked by the table itself)")
    for check in doctor.check_fit(values):
        assert check.ok, f"{path.name}: {check.detail}"
