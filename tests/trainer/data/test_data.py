"""Data: what the model is trained on (labels, <bos>, image tokens), bad rows, sources, the split."""

from __future__ import annotations

import io
import json
import time
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from localkit.sample_data import build_sample_dataset
from tests.trainer.messy import BAD_REASONS, write_messy_jsonl
from tests.trainer.thread_group import ThreadGroup
from trainer.data.dataset import ROW_ID, load_rows, prepare_data
from trainer.data.encoding import LABEL_IGNORE
from trainer.data.scan_store import ScanGroup
from trainer.job.arguments import parse_args
from trainer.job.flags import TrainArguments, UsageError
from trainer.job.storage import Storage

CPU = ["--use_gpu=false", "--quantization=none"]
LONG_NAME_WORDS = 400  # a product name far over --max_seq_length below
MAX_SEQ = 300
GROUP_TIMEOUT_S = 60
LOG_SETTLE_S = 0.5  # fake-gcs-server's request log reaches the fixture's reader asynchronously


def job_args(tiny_model: Path, data: Path, cache_dir: Path, *extra: str) -> TrainArguments:
    return parse_args([*CPU, f"--model_id={tiny_model}", f"--dataset_name={data}", f"--cache_dir={cache_dir}",
                          *extra])


@pytest.fixture(scope="module")
def sample_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_dataset(tmp_path_factory.mktemp("rows"), n_rows=12, seed=1)


def test_only_the_answer_and_its_end_of_turn_are_labelled(tiny_model, processor, sample_parquet, cache_dir) -> None:
    args = job_args(tiny_model, sample_parquet, cache_dir, "--eval_fraction=0")
    train, _, collator, _ = prepare_data(args, processor, None)
    rows = [train[i] for i in range(3)]
    batch = collator(rows)
    tok = processor.tokenizer
    config = json.loads((tiny_model / "config.json").read_text())
    for i, row in enumerate(rows):
        ids, labels, mask = batch["input_ids"][i], batch["labels"][i], batch["attention_mask"][i]
        labelled = labels != LABEL_IGNORE
        # The labelled span is contiguous, and it is the answer plus <end_of_turn>, nothing else.
        where = labelled.nonzero().flatten().tolist()
        assert where == list(range(where[0], where[-1] + 1))
        assert tok.decode(labels[labelled]) == row["answer"].strip() + "<end_of_turn>"
        assert (labels[labelled] == ids[labelled]).all()
        # What precedes it is the whole prompt, ending with the model turn's header.
        assert tok.decode(ids[: where[0]]).endswith("<end_of_turn>\n<start_of_turn>model\n")
        assert "You are an expert product description writer" in tok.decode(ids[: where[0]])
        # Exactly one <bos>, first.
        real = ids[mask == 1].tolist()
        assert real.count(tok.bos_token_id) == 1 and real[0] == tok.bos_token_id
        # The image: mm_tokens_per_image soft tokens (the model's image_token_index), marked by token_type_ids.
        soft = ids == config["image_token_index"]
        assert int(soft.sum()) == config["mm_tokens_per_image"]
        assert (batch["token_type_ids"][i].bool() == soft).all()
        assert not labelled[soft].any()
        # Padding is neither attended nor labelled; the sequence is as long as the scan computed.
        assert not labelled[mask == 0].any()
        assert int(mask.sum()) == collator.encoder.num_tokens(row)
    assert tuple(batch["pixel_values"].shape[:2]) == (3, 3)


def test_rows_stay_encoded_until_the_collator(tiny_model, processor, sample_parquet, cache_dir) -> None:
    args = job_args(tiny_model, sample_parquet, cache_dir, "--eval_fraction=0")
    train, _, _, _ = prepare_data(args, processor, None)
    image = train[0]["image"]
    assert isinstance(image, dict) and isinstance(image["bytes"], bytes)  # no PIL image materialised


def test_eval_split_is_deterministic_by_seed(tiny_model, processor, sample_parquet, cache_dir) -> None:
    def eval_answers(seed: int) -> list[str]:
        args = job_args(tiny_model, sample_parquet, cache_dir, "--eval_fraction=0.25", f"--seed={seed}")
        train, evaluation, _, stats = prepare_data(args, processor, None)
        assert (stats["train_rows"], stats["eval_rows"]) == (9, 3)
        return [r["product"] + r["answer"] for r in evaluation]

    assert eval_answers(3) == eval_answers(3)
    assert eval_answers(3) != eval_answers(4)


def write_bad_rows(sample_parquet: Path, out: Path) -> Path:
    rows = pq.read_table(sample_parquet).to_pylist()
    rows[1]["image"] = {"bytes": b"this is not an image", "path": "broken.png"}
    rows[2]["description"] = "   "
    rows[3]["image"] = None
    rows[4]["Product Name"] = " ".join(["Handwritten"] * LONG_NAME_WORDS)
    from datasets import Dataset, Features, Image, Value

    features = Features({"Product Name": Value("string"), "Category": Value("string"), "image": Image(),
                         "description": Value("string")})
    Dataset.from_list(rows, features=features).to_parquet(str(out))
    return out


def test_bad_rows_are_counted_and_skipped(tiny_model, processor, sample_parquet, cache_dir, tmp_path) -> None:
    data = write_bad_rows(sample_parquet, tmp_path / "bad.parquet")
    args = job_args(tiny_model, data, cache_dir, "--eval_fraction=0", f"--max_seq_length={MAX_SEQ}")
    train, _, _, stats = prepare_data(args, processor, None)
    assert stats["skipped_rows"] == {"corrupt_image": 1, "empty_answer": 1, "missing_image": 1, "too_long": 1}
    assert stats["train_rows"] == 12 - 4 == len(train)


def test_bad_rows_fail_names_the_row(tiny_model, processor, sample_parquet, cache_dir, tmp_path) -> None:
    data = write_bad_rows(sample_parquet, tmp_path / "bad.parquet")
    args = job_args(tiny_model, data, cache_dir, "--bad_rows=fail", f"--max_seq_length={MAX_SEQ}")
    with pytest.raises(UsageError, match=r"row 1: corrupt_image; --bad_rows=skip would skip such rows"):
        prepare_data(args, processor, None)


def test_bad_rows_fail_stops_every_worker_of_a_group_naming_the_first_row(tiny_model, processor, sample_parquet,
                                                                          cache_dir, tmp_path) -> None:
    """Two workers split the scan (rows 0-5, 6-11); the bad rows lie in rank 1's share only. Both workers
    stop with the first bad row; rank 0 does not wait for a share rank 1 never delivers."""
    rows = pq.read_table(sample_parquet).to_pylist()
    for i in (7, 9):
        rows[i]["description"] = "   "
    from datasets import Dataset

    data = tmp_path / "rows.parquet"
    Dataset.from_list(rows).to_parquet(str(data))
    args = job_args(tiny_model, data, cache_dir, "--bad_rows=fail", "--eval_fraction=0")
    ranks = ThreadGroup(2, timeout=GROUP_TIMEOUT_S)  # a rank left waiting breaks the barrier: no hang
    raised: list[BaseException | None] = [None, None]

    def worker(rank: int) -> None:
        group = ScanGroup(Storage(root=str(tmp_path / "run")), rank, 2, ranks.barrier.wait,
                          partial(ranks.broadcast, rank))
        try:
            prepare_data(args, processor, None, scan_group=group)
        except BaseException as e:  # noqa: BLE001 - what each rank raised is the result
            raised[rank] = e

    ranks.run(worker)
    for e in raised:
        assert isinstance(e, UsageError) and str(e) == "row 7: empty_answer; --bad_rows=skip would skip such rows", e


def test_over_long_row_fails_with_the_fix(tiny_model, processor, sample_parquet, cache_dir, tmp_path) -> None:
    rows = pq.read_table(sample_parquet).to_pylist()[:3]
    rows[2]["Product Name"] = " ".join(["Handwritten"] * LONG_NAME_WORDS)
    data = tmp_path / "rows.jsonl"
    images = tmp_path / "img"
    images.mkdir()
    with open(data, "w") as fh:
        for i, r in enumerate(rows):
            (images / f"{i}.png").write_bytes(r["image"]["bytes"])
            fh.write(json.dumps({**r, "image": f"img/{i}.png"}) + "\n")
    args = job_args(tiny_model, data, cache_dir, "--bad_rows=fail", f"--max_seq_length={MAX_SEQ}")
    with pytest.raises(UsageError, match=r"row 2: too_long \(raise --max_seq_length\)"):
        prepare_data(args, processor, None)


def test_jsonl_with_image_paths_and_a_column_mapping(tiny_model, processor, sample_parquet, cache_dir,
                                                     tmp_path) -> None:
    rows = pq.read_table(sample_parquet).to_pylist()[:4]
    (tmp_path / "pics").mkdir()
    with open(tmp_path / "data.jsonl", "w") as fh:
        for i, r in enumerate(rows):
            if i != 3:  # row 3 points at a file that is not there
                (tmp_path / "pics" / f"{i}.png").write_bytes(r["image"]["bytes"])
            fh.write(json.dumps({"picture": f"pics/{i}.png", "caption": r["description"],
                                 "title": r["Product Name"]}) + "\n")
    args = job_args(
        tiny_model, tmp_path / "data.jsonl", cache_dir, "--eval_fraction=0", "--system_message=",
        "--prompt_template=Describe the {title}.",
        '--column_mapping={"image": "picture", "answer": "caption", "title": "title"}',
    )
    train, _, collator, stats = prepare_data(args, processor, None)
    assert stats["skipped_rows"] == {"missing_image": 1} and stats["train_rows"] == 3
    batch = collator([train[0]])
    text = processor.tokenizer.decode(batch["input_ids"][0])
    assert "Describe the " + train[0]["title"] in text and "expert product" not in text
    decoded = Image.open(io.BytesIO((tmp_path / "pics" / "0.png").read_bytes()))
    assert decoded.size[0] > 0


def test_gcs_sources_are_fetched_once_and_images_read_lazily(tiny_model, processor, sample_parquet, fake_gcs,
                                                               fake_gcs_downloads, tmp_path) -> None:
    """gs:// data through fake-gcs-server: the jsonl is copied into the node cache once; its relative
    image paths resolve to gs:// objects, each fetched into the node cache once (by the scan) and read
    from there by the collator; rows stay references, not pixels."""
    from tests.trainer.conftest import GCS_BUCKET

    store = Storage(root=f"gs://{GCS_BUCKET}/data", emulator_host=fake_gcs)
    rows = pq.read_table(sample_parquet).to_pylist()[:3]
    lines = []
    for i, r in enumerate(rows):
        store.write_bytes(f"images/{i}.png", r["image"]["bytes"])
        lines.append(json.dumps({**r, "image": f"images/{i}.png"}))
    store.write_bytes("rows.jsonl", ("\n".join(lines) + "\n").encode())
    cache = tmp_path / "cache"
    args = job_args(tiny_model, f"gs://{GCS_BUCKET}/data/rows.jsonl", cache, "--eval_fraction=0")
    train, _, collator, stats = prepare_data(args, processor, fake_gcs)
    assert stats["train_rows"] == 3 and stats["skipped_rows"] == {}
    assert train[0]["image"] == "images/0.png"  # still a reference, not pixels
    (marker,) = list(cache.glob("gcs-prefixes/*/.complete"))
    stamp = marker.stat().st_mtime_ns
    load_rows(args, fake_gcs)
    assert marker.stat().st_mtime_ns == stamp  # the second load reused the node's copy
    assert not list(marker.parent.glob("images"))  # the data copy holds the jsonl only, no images
    batch = collator([train[0]])
    assert tuple(batch["pixel_values"].shape[:2]) == (1, 3)
    time.sleep(LOG_SETTLE_S)
    images = {k: v for k, v in fake_gcs_downloads().items() if k.startswith(store.uri("images/"))}
    assert images == {store.uri(f"images/{i}.png"): 1 for i in range(3)}  # scan + collator: one fetch each


def test_trls_vision_collator_would_label_the_newline_after_end_of_turn(tiny_model, processor, sample_parquet,
                                                                         cache_dir) -> None:
    """Why the job keeps its own encoder: TRL's DataCollatorForVisionLanguageModeling, given the same rows
    as prompt/completion conversations, builds the same input_ids, token_type_ids and pixels with one
    <bos>, but it labels the whole completion, also the newline the chat template writes after
    <end_of_turn>; the job labels the answer and <end_of_turn> only. (TRL's prompt/completion path also
    has no pad_to_multiple_of, which the job uses on GPUs.)"""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from trainer.data.dataset import decode_image, image_bytes

    args = job_args(tiny_model, sample_parquet, cache_dir, "--eval_fraction=0")
    train, _, collator, _ = prepare_data(args, processor, None)
    rows = [train[i] for i in range(3)]
    ours = collator(rows)
    examples = []
    for row in rows:
        msgs = collator.encoder.messages(row)
        image = decode_image(image_bytes(row["image"], collator.image_base, None))
        examples.append({"prompt": msgs[:-1], "completion": msgs[-1:], "images": [image]})
    theirs = DataCollatorForVisionLanguageModeling(processor, completion_only_loss=True)(examples)
    tok = processor.tokenizer
    end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
    assert torch.allclose(ours["pixel_values"], theirs["pixel_values"])
    for i in range(len(rows)):
        mine, trl = ours["attention_mask"][i].bool(), theirs["attention_mask"][i].bool()
        ids = ours["input_ids"][i][mine]
        assert ids.tolist() == theirs["input_ids"][i][trl].tolist()
        assert ours["token_type_ids"][i][mine].tolist() == theirs["token_type_ids"][i][trl].tolist()
        assert ids.tolist().count(tok.bos_token_id) == 1
        differ = (ours["labels"][i][mine] != theirs["labels"][i][trl]).nonzero().flatten().tolist()
        assert len(differ) == 1, differ  # one position: TRL labels it, the job does not
        assert tok.decode(ids[differ[0]]) == "\n" and ids[differ[0] - 1] == end_of_turn
        assert ours["labels"][i][mine][differ[0]] == LABEL_IGNORE


def test_messy_rows_are_skipped_by_reason_with_their_row_ids(tiny_model, processor, sample_parquet, cache_dir,
                                                             tmp_path) -> None:
    """Issue #13's rows: the scan decodes every image in full (the truncated JPEG passed Image.verify()),
    stops at the decompression bomb instead of raising, and rejects an image marker in a text field."""
    data, where = write_messy_jsonl(sample_parquet, tmp_path, n_good=6)
    args = job_args(tiny_model, data, cache_dir, "--eval_fraction=0")
    train, _, _, stats = prepare_data(args, processor, None)
    assert stats["skipped_rows"] == BAD_REASONS
    assert stats["skipped_row_ids"] == {reason: [row] for reason, row in where.items()}
    assert stats["train_rows"] == 6 and train[ROW_ID] == list(range(6))


def test_bad_rows_fail_names_the_truncated_jpeg(tiny_model, processor, sample_parquet, cache_dir, tmp_path) -> None:
    data, where = write_messy_jsonl(sample_parquet, tmp_path, n_good=6)
    args = job_args(tiny_model, data, cache_dir, "--bad_rows=fail")
    with pytest.raises(UsageError, match=rf"row {where['corrupt_image']}: corrupt_image; --bad_rows=skip"):
        prepare_data(args, processor, None)


def test_an_image_marker_in_the_prompt_template_is_a_flag_error(tiny_model, processor, sample_parquet,
                                                                cache_dir) -> None:
    args = job_args(tiny_model, sample_parquet, cache_dir, "--prompt_template=See <start_of_image> {product}")
    with pytest.raises(UsageError, match="prompt_template contains an image marker"):
        prepare_data(args, processor, None)


def test_a_row_that_fails_in_the_collator_is_skipped_not_fatal(tiny_model, processor, sample_parquet, cache_dir,
                                                               tmp_path) -> None:
    """An image that vanishes or breaks after the scan: the micro-batch keeps its size, the row is replaced
    by an unlabelled stand-in (no loss, no tokens counted) and logged with its reason."""
    data, _ = write_messy_jsonl(sample_parquet, tmp_path, n_good=4)
    skip_log = tmp_path / "skipped.jsonl"
    args = job_args(tiny_model, data, cache_dir, "--eval_fraction=0")
    train, _, collator, _ = prepare_data(args, processor, None, skip_log=skip_log)
    (tmp_path / "images" / "1.png").unlink()
    (tmp_path / "images" / "2.png").write_bytes(b"not an image any more")
    batch = collator([train[i] for i in range(4)])
    labelled = (batch["labels"] != LABEL_IGNORE).sum(dim=1).tolist()
    assert batch["input_ids"].shape[0] == 4 and batch["pixel_values"].shape[0] == 4
    assert labelled[1] == labelled[2] == 0 and labelled[0] > 0 and labelled[3] > 0
    alone = collator([train[1]])  # nothing in the batch decodes: the stand-in comes from the training rows
    assert (alone["labels"] != LABEL_IGNORE).sum() == 0
    logged = [json.loads(line) for line in skip_log.read_text().splitlines()]
    assert logged == [{"row": 1, "reason": "missing_image"}, {"row": 2, "reason": "corrupt_image"},
                      {"row": 1, "reason": "missing_image"}]


def test_a_dataset_fixed_in_place_is_scanned_again(tiny_model, processor, cache_dir, tmp_path) -> None:
    """#21: row 24 has a truncated JPEG and bad_rows=fail stops the run on it; fixed in place (same file, row
    count and columns), the rerun of the same run passes: the run's stored scan is keyed by the data's
    identity (here a digest of the file, as run_definition's), and a scan that stopped the run is not kept.
    Before #21 the rerun failed again on `row 24: corrupt_image`; under skip it kept skipping the row."""
    import hashlib

    import pyarrow as pa

    from tests.trainer.messy import truncated_jpeg

    source = build_sample_dataset(tmp_path / "good", n_rows=30, seed=2)
    rows, schema = pq.read_table(source).to_pylist(), pq.read_schema(source)
    good = rows[24]["image"]["bytes"]
    data = tmp_path / "data" / "products.parquet"
    data.parent.mkdir()
    run = Storage(root=str(tmp_path / "runs" / "r"))

    def write(image: bytes) -> ScanGroup:
        rows[24]["image"] = {"bytes": image, "path": None}
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), data)
        group = ScanGroup(run)
        group.data_identity = hashlib.sha256(data.read_bytes()).hexdigest()
        return group

    strict = job_args(tiny_model, data, cache_dir, "--bad_rows=fail", "--eval_fraction=0")
    with pytest.raises(UsageError, match=r"^row 24: corrupt_image"):
        prepare_data(strict, processor, None, scan_group=write(truncated_jpeg(good)))
    _, _, _, stats = prepare_data(strict, processor, None, scan_group=write(good))
    assert stats["train_rows"] == 30 and not stats["skipped_rows"]
    lenient = job_args(tiny_model, data, cache_dir, "--eval_fraction=0")
    _, _, _, stats = prepare_data(lenient, processor, None, scan_group=write(truncated_jpeg(good)))
    assert stats["skipped_row_ids"] == {"corrupt_image": [24]} and not stats["scan_reused"]
    _, _, _, stats = prepare_data(lenient, processor, None, scan_group=write(good))
    assert stats["train_rows"] == 30 and not stats["skipped_rows"] and not stats["scan_reused"]
