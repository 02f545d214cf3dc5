"""Sample generations on the tiny model after the demo's training recipe (values/local.yaml), without Ray."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from PIL import Image

from localkit.sample_data import build_sample_dataset
from trainer.data.dataset import decode_image, image_bytes
from trainer.job.arguments import parse_args
from trainer.job.flags import ANSWER_FIELD, IMAGE_FIELD
from trainer.worker import samples
from trainer.worker.model import build_trainer, load_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
N_ROWS = 60  # 51 train, 9 eval: 40 steps of batch 1 see most training rows once
N_SAMPLES = 4
MAX_NEW_TOKENS = 16


def demo_flags(tiny_model: Path, data: Path, cache_dir: Path) -> list[str]:
    """The demo's `training:` map as trainer flags (the chart renders them the same way), on CPU."""
    training = yaml.safe_load((ROOT / "values" / "local.yaml").read_text())["training"]
    training.update(model_id=str(tiny_model), dataset_name=str(data), save_strategy="no")
    flags = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in training.items()]
    return [*flags, f"--cache_dir={cache_dir}", "--use_gpu=false"]


@pytest.fixture(scope="module")
def trained(tiny_model: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = build_sample_dataset(tmp_path_factory.mktemp("data"), n_rows=N_ROWS, seed=0)
    args = parse_args(demo_flags(tiny_model, data, cache_dir))
    torch.manual_seed(0)
    torch.set_flush_denormal(True)
    trainer, _, _ = build_trainer(args, tiny_model, tmp_path_factory.mktemp("out"), torch.device("cpu"), None)
    trainer.train()
    evaluation, collator = trainer.eval_dataset, trainer.data_collator
    ids = samples.pick_rows(len(evaluation), N_SAMPLES)
    rows = [evaluation[i] for i in ids]
    images = [decode_image(image_bytes(r[IMAGE_FIELD], collator.image_base, None)) for r in rows]
    log: list[str] = []
    settings = samples.SampleSettings(rows=N_SAMPLES, max_new_tokens=MAX_NEW_TOKENS, batch_size=3, budget_s=600)
    trainer.model.train()  # as in a callback mid-training: collect_samples must hand it back in this mode
    records = samples.collect_samples(trainer.model, collator.encoder, rows, images, ids, settings, log=log.append)
    return {"trainer": trainer, "records": records, "rows": rows, "images": images, "ids": ids, "log": log,
            "collator": collator}


def test_fine_tuned_differs_from_base_and_is_closer_to_the_reference(trained: dict[str, Any]) -> None:
    records = trained["records"]
    assert len(records) == N_SAMPLES  # two batches (3 + 1): batching keeps every row
    assert all(r["finetuned_output"] != r["base_output"] for r in records)
    base = sum(r["base_f1"] for r in records) / len(records)
    tuned = sum(r["finetuned_f1"] for r in records) / len(records)
    assert tuned > base, (base, tuned, [(r["base_output"], r["finetuned_output"]) for r in records])
    assert sum(r["finetuned_f1"] > r["base_f1"] for r in records) > len(records) // 2


def test_base_output_is_the_untrained_model(trained: dict[str, Any], tiny_model: Path) -> None:
    """disable_adapter() gives exactly what the base model writes (LoRA and the trained embeddings off)."""
    base_model = load_model(parse_args(["--use_gpu=false", "--quantization=none",
                                              "--attn_implementation=eager"]), tiny_model, torch.device("cpu"))
    base = samples.generate(base_model.eval(), trained["collator"].encoder, trained["rows"], trained["images"],
                            MAX_NEW_TOKENS)
    assert [r["base_output"] for r in trained["records"]] == [text for text, _ in base]


def test_records_carry_what_the_report_needs(trained: dict[str, Any]) -> None:
    r = trained["records"][0]
    row = trained["rows"][0]
    assert r["row_id"] == trained["ids"][0]
    assert (r["product"], r["category"], r["reference"]) == (row["product"], row["category"], row[ANSWER_FIELD])
    assert 0 < r["tokens"]["finetuned_output"] <= MAX_NEW_TOKENS and r["tokens"]["prompt"] > 0
    assert r["tokens"]["reference"] > 0
    head, _, payload = r["thumbnail"].partition(";base64,")
    assert head == "data:image/jpeg"
    with Image.open(io.BytesIO(base64.b64decode(payload))) as im:
        assert max(im.size) <= samples.THUMBNAIL_PX
    assert trained["trainer"].model.training  # back in training mode
    assert "time budget 600 s" in trained["log"][0] and f"{N_SAMPLES}/{N_SAMPLES} rows" in trained["log"][-1]


def test_an_exhausted_budget_generates_nothing_and_says_so(trained: dict[str, Any]) -> None:
    log: list[str] = []
    settings = samples.SampleSettings(rows=N_SAMPLES, max_new_tokens=MAX_NEW_TOKENS, batch_size=2, budget_s=0)
    out = samples.collect_samples(trained["trainer"].model, trained["collator"].encoder, trained["rows"],
                                  trained["images"], trained["ids"], settings, log=log.append)
    assert out == [] and f"0/{N_SAMPLES} rows" in log[-1] and f"{N_SAMPLES} left out" in log[-1]
