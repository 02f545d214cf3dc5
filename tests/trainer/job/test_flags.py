"""Flags: the contract's names parse, unknown or contradictory ones fail fast with the fix, and the
dataset's columns are checked before any model is fetched."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer import vision_train
from trainer.job.arguments import parse_args
from trainer.job.flag_values import column_mapping
from trainer.job.flags import TrainArguments, UsageError
from trainer.job.storage import run_root

ROOT = Path(__file__).resolve().parents[3]
CPU = ["--use_gpu=false", "--quantization=none"]

# The flag names of the trainer/chart/demo contract (prompts: common rules), verbatim.
CONTRACT_FLAGS = """model_id dataset_name output_dir gcs_bucket push_to_hub lora_r lora_alpha lora_dropout
max_seq_length num_train_epochs global_batch_size per_device_train_batch_size learning_rate
logging_steps save_strategy save_steps num_workers use_gpu accelerator_type storage_path quantization
attn_implementation gradient_checkpointing lora_target train_embeddings freeze_vision max_steps
eval_fraction eval_steps seed column_mapping prompt_template system_message bad_rows max_failures
save_total_limit hub_model_id merge_adapter cache_dir dataloader_num_workers
recipe use_liger_kernel adapter_dtype compile_vision run_name resume_from installer extra_pip
fused_lora vision_attention frozen_norms lm_attention lean_step image_feature_cache_gib min_workers
sample_rows sample_max_new_tokens sample_batch_size sample_time_budget_s sample_at_eval
streaming streaming_shuffle_window streaming_decoders streaming_object_store_gib""".split()  # noqa: SIM905


def test_flag_names_are_exactly_the_contract() -> None:
    assert sorted(f.name for f in dataclasses.fields(TrainArguments)) == sorted(CONTRACT_FLAGS)


def test_values_parse_as_the_chart_renders_them() -> None:
    args = parse_args(
        [*CPU, "--num_workers=2", "--lora_r=8", "--learning_rate=1e-4", "--freeze_vision=true",
         "--lora_target=language-model", '--column_mapping={"image": "img"}', "--eval_steps=5",
         "--prompt_template=Describe {product}.", "--max_steps=7"]
    )
    assert (args.num_workers, args.lora_r, args.learning_rate, args.max_steps) == (2, 8, 1e-4, 7)
    assert args.freeze_vision is True and args.use_gpu is False
    assert column_mapping(args) == {"image": "img", "answer": "description", "product": "Product Name"}


def test_unknown_flag_names_the_closest_known_one() -> None:
    with pytest.raises(UsageError, match=r"--lora_rank \(did you mean --lora_r\?\)"):
        parse_args([*CPU, "--lora_rank=8"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--quantization=4bit", "--use_gpu=false"], "quantization=4bit needs GPUs"),
        (["--merge_adapter=true", "--quantization=4bit"], "merge_adapter=true cannot merge into a 4-bit base"),
        ([*CPU, "--freeze_vision=true", "--lora_target=all-linear"], "set --lora_target=language-model"),
        ([*CPU, "--hub_model_id=me/x"], "add --push_to_hub=true"),
        ([*CPU, "--accelerator_type=H100"], "accelerator_type needs --use_gpu=true"),
        ([*CPU, "--gcs_bucket=a", "--storage_path=gs://b/run"], "disagrees with storage_path"),
        ([*CPU, "--eval_fraction=1.5"], "eval_fraction must be in"),
        ([*CPU, "--column_mapping={not json"], "column_mapping: not JSON"),
        ([*CPU, '--column_mapping={"imagez": "img"}'], r"unknown field\(s\) \['imagez'\]"),
        ([*CPU, "--prompt_template=Describe {0}."], "not a plain field name"),
    ],
)
def test_contradictions_fail_with_the_fix(flags: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(flags)


def test_push_to_hub_needs_the_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(UsageError, match="HF_TOKEN"):
        parse_args([*CPU, "--push_to_hub=true"])


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(UsageError) as err:
        parse_args(["--use_gpu=false", "--lora_r=0", "--num_workers=0", "--recipe=tutorial"])  # 4-bit recipe
    text = str(err.value)
    assert "num_workers must be >= 1" in text and "lora_r" in text and "quantization=4bit" in text


def test_run_root_follows_the_tutorials_flags() -> None:
    assert run_root(parse_args([*CPU, "--gcs_bucket=bkt", "--output_dir=runs/a"])) == "gs://bkt/runs/a"
    assert run_root(parse_args([*CPU, "--storage_path=gs://bkt/p/"])) == "gs://bkt/p"
    assert run_root(parse_args([*CPU, "--output_dir=/tmp/x"])) == "/tmp/x"


def test_missing_columns_fail_before_any_model_download(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"title": ["a"], "img": [b"x"], "description": ["d"]}), data)
    # A hub model id that does not exist: reaching any download would fail differently (and offline).
    with pytest.raises(SystemExit) as exit_info:
        vision_train.main([*CPU, "--model_id=no-such-org/no-such-model", f"--dataset_name={data}",
                 f"--storage_path={tmp_path / 'run'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "missing column(s) 'image' (for image), 'Product Name' (for product), 'Category' (for category)" in err
    assert "found ['description', 'img', 'title']" in err
    assert re.search(r"Expected columns \[.*'Category'.*'Product Name'.*'description'.*'image'", err)
    assert "--column_mapping" in err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_recipe_fills_only_unset_flags() -> None:
    fast = parse_args([])
    assert (fast.quantization, fast.attn_implementation, fast.gradient_checkpointing) == ("none", "sdpa", False)
    assert (fast.use_liger_kernel, fast.adapter_dtype) == (True, "bf16")
    tutorial = parse_args(["--recipe=tutorial"])
    assert (tutorial.quantization, tutorial.attn_implementation, tutorial.gradient_checkpointing) == (
        "4bit", "eager", True)
    assert (tutorial.per_device_train_batch_size, tutorial.global_batch_size) == (1, 64)
    mixed = parse_args(["--recipe=tutorial", "--per_device_train_batch_size=2", "--gradient_checkpointing=false"])
    assert (mixed.quantization, mixed.per_device_train_batch_size, mixed.gradient_checkpointing) == ("4bit", 2, False)
    cpu = parse_args(CPU)
    assert (cpu.use_liger_kernel, cpu.adapter_dtype, cpu.dataloader_num_workers) == (False, "fp32", 0)
    with pytest.raises(UsageError, match="use_liger_kernel=true needs GPUs"):
        parse_args([*CPU, "--use_liger_kernel=true"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--run_name=a/b"], r"run_name='a/b': use letters, digits"),
        (["--run_name=x", "--resume_from=x"], "names this run itself"),
        (["--resume_from=two words"], "neither a run name nor a gs:// or local checkpoint path"),
    ],
)
def test_run_identity_flags_fail_with_the_fix(flags: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args([*CPU, *flags])


def test_min_workers_above_num_workers_is_rejected() -> None:
    with pytest.raises(UsageError, match="min_workers=3 exceeds num_workers=2"):
        parse_args(["--use_gpu=false", "--num_workers=2", "--min_workers=3"])
    with pytest.raises(UsageError, match="min_workers must be >= 1"):
        parse_args(["--use_gpu=false", "--num_workers=2", "--min_workers=0"])
    assert parse_args(["--use_gpu=false", "--num_workers=2", "--min_workers=1"]).min_workers == 1
