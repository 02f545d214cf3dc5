"""The job under Ray Train on a local cluster with 2 CPU workers: it trains, the logged loss is the
true token mean, it writes what the contract says, and a killed worker resumes from the last
checkpoint on gs:// (fake-gcs-server) without losing or repeating steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch

from localkit.sample_data import build_sample_dataset
from tests.trainer.conftest import GCS_RUN_KILL_AFTER, GCS_RUN_STEPS
from tests.trainer.faults import RefuseOnRankOne
from tests.trainer.faults import marker as fault_marker
from tests.trainer.probes import RecordLoadedModules, loaded_modules
from trainer import vision_train
from trainer.data.dataset import prepare_data
from trainer.data.encoding import LABEL_IGNORE
from trainer.job.arguments import parse_args
from trainer.job.runs import MERGED_DIR
from trainer.job.storage import Storage

pytestmark = pytest.mark.slow

# 10 rows: 2 held out, 8 trained on. 2 workers x batch 2 x 2 accumulation steps = 8 samples: every
# optimizer step sees the whole training set once, so its loss does not depend on the shuffling.
N_ROWS = 10
MAX_STEPS = 4
SAVE_STEPS = 2
DRILL_MAX_STEPS = 5
FAULT_AT_STEP = 3  # between the checkpoints of steps 2 and 4
LOSS_RTOL = 1e-4
RESUME_ATOL = 1e-5
MIN_LOSS_DROP = 0.2
EVAL_TEST_STEPS = 6
PROBED_MODULES = ("torch", "peft", "bitsandbytes")


def job_flags(tiny_model: Path, data: Path, cache_dir: Path, storage: str, max_steps: int,
              run_name: str = "r1") -> list[str]:
    return [
        f"--model_id={tiny_model}", f"--dataset_name={data}", f"--cache_dir={cache_dir}",
        f"--storage_path={storage}", f"--run_name={run_name}", "--use_gpu=false", "--quantization=none", "--num_workers=2",
        "--global_batch_size=8", "--per_device_train_batch_size=2", f"--max_steps={max_steps}",
        "--logging_steps=1", "--save_strategy=steps", f"--save_steps={SAVE_STEPS}", "--eval_fraction=0.2",
        "--learning_rate=5e-3", "--gradient_checkpointing=false", "--max_failures=2", "--seed=7",
        # The end-of-run samples still run (base and adapter, samples.jsonl, report.html), 8 tokens long: no test
        # of these jobs reads their text, and the default 256 greedy tokens of the random model cost ~5 s a run.
        "--sample_max_new_tokens=8",
    ]


def records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_dataset(tmp_path_factory.mktemp("data"), n_rows=N_ROWS, seed=0)


@pytest.fixture(scope="module")
def local_run(ray_cluster, tiny_model, data, cache_dir, tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("run") / "storage"
    modules = root.parent / "modules"
    summary = vision_train.main([*job_flags(tiny_model, data, cache_dir, str(root), MAX_STEPS), "--merge_adapter=true"],
                                callbacks=[RecordLoadedModules(str(modules), PROBED_MODULES)])
    storage = root / "runs" / "r1"  # the run's directory: <storage_path>/runs/<run_name>
    return {"storage": storage, "summary": summary, "metrics": records((storage / "metrics.jsonl").read_text()),
            "modules": loaded_modules(modules)}


def test_training_runs_and_the_loss_falls(local_run) -> None:
    summary, metrics = local_run["summary"], local_run["metrics"]
    train = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, MAX_STEPS + 1))
    assert summary["global_step"] == MAX_STEPS and summary["num_workers"] == 2
    assert (summary["train_rows"], summary["eval_rows"]) == (8, 2)
    assert train[-1]["loss"] < train[0]["loss"] - MIN_LOSS_DROP
    assert summary["final_eval_loss"] < summary["first_eval_loss"]
    assert summary["first_train_loss"] == train[0]["loss"] and summary["final_train_loss"] == train[-1]["loss"]
    for r in train:
        for key in ("loss", "learning_rate", "grad_norm", "answer_token_accuracy", "tokens_per_second",
                    "samples_per_second", "epoch"):
            assert isinstance(r[key], float | int), (key, r)
        assert "peak_gpu_mem_gib" not in r  # CPU run
    assert any("eval_loss" in r for r in metrics)
    assert summary["samples_per_second"] > 0 and summary["tokens_per_second"] > 0


def test_a_cpu_run_leaves_bitsandbytes_out_of_its_workers(local_run) -> None:
    # peft imports bitsandbytes whenever it is installed (1.4-3 s of each worker's start); only --quantization=4bit
    # uses it (trainer/worker/unused_libraries.py). torch: the probe ran in a worker that imported the rest.
    workers = local_run["modules"]
    assert sorted(w["rank"] for w in workers) == [0, 1], workers
    for w in workers:
        assert w["loaded"] == {"torch": True, "peft": True, "bitsandbytes": False}, w


def test_no_worker_scratch_is_left_behind(local_run, ray_cluster) -> None:
    # Every job of this cluster so far (this module's and any before it in this process) removed its
    # workers' scratch: local checkpoints and TensorBoard files once stayed in /tmp, ~0.5 GB a run.
    from trainer.worker.scratch import PREFIX

    assert not list(ray_cluster.glob(f"{PREFIX}*")), list(ray_cluster.iterdir())


def test_outputs_land_where_the_contract_says(local_run, tiny_model) -> None:
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    storage: Path = local_run["storage"]
    ckpts = sorted(p.name for p in (storage / "checkpoints").glob("checkpoint-*"))
    assert ckpts == ["checkpoint-000002", "checkpoint-000004"]
    newest = storage / "checkpoints" / ckpts[-1]
    # Ray merged both workers' parts: rank 0's adapter/optimizer/state and each rank's RNG state.
    for name in ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth",
                 "rng_state_1.pth"):
        assert (newest / name).is_file(), name
    assert local_run["summary"]["newest_checkpoint"] == str(newest)
    assert json.loads((storage / "summary.json").read_text()) == local_run["summary"]
    assert list((storage / "tensorboard").rglob("events.out.tfevents.*"))
    final = storage / "final"
    assert local_run["summary"]["final_adapter"] == str(final)
    for name in ("adapter_config.json", "adapter_model.safetensors", "processor_config.json", "tokenizer.json"):
        assert (final / name).is_file(), name
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_model))
    tuned = PeftModel.from_pretrained(base, str(final))
    lora_b = [p for n, p in tuned.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # trained, not the zero init
    # --merge_adapter=true: a plain model with the adapter folded in, loadable without PEFT.
    assert local_run["summary"]["merged_model"] == str(storage / "merged")
    merged = AutoModelForImageTextToText.from_pretrained(str(storage / "merged"))
    folded = tuned.merge_and_unload().state_dict()
    name = next(n for n in folded if n.endswith("language_model.layers.0.self_attn.q_proj.weight"))
    assert torch.allclose(merged.state_dict()[name], folded[name])
    assert not torch.allclose(merged.state_dict()[name], AutoModelForImageTextToText.from_pretrained(
        str(tiny_model)).state_dict()[name])
    # the end-of-run samples ran on the adapter, not after the merge unloaded it (seen: every merge run's
    # samples failed "No adapter layers found", summary.samples_error set, no samples.jsonl)
    summary = local_run["summary"]
    assert summary["samples_error"] is None and summary["samples_rows"] > 0, summary["samples_error"]
    assert (storage / "samples.jsonl").is_file()


def answer_token_nll(model_dir: Path, rows, collator) -> list[tuple[float, int]]:
    """Independently of the trainer: (summed cross-entropy, token count) of each row's labelled tokens."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for row in rows:
            batch = collator([row])
            labels = batch.pop("labels")
            logits = model(**batch).logits[0, :-1].double()
            target = labels[0, 1:]
            keep = target != LABEL_IGNORE
            nll = torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum").item()
            out.append((nll, int(keep.sum())))
    return out


def test_logged_loss_is_the_true_token_mean(local_run, tiny_model, processor, data, cache_dir) -> None:
    """Step 1's logged loss (2 workers x 2 accumulation steps, micro-batches with different numbers of
    answer tokens) equals the mean cross-entropy over every answer token of the training set, computed
    here independently with the untrained model (LoRA starts as the identity)."""
    args = parse_args(job_flags(tiny_model, data, cache_dir, "unused", MAX_STEPS))
    train, _, collator, _ = prepare_data(args, processor, None)
    per_row = answer_token_nll(tiny_model, train, collator)
    total, counts = sum(n for n, _ in per_row), [c for _, c in per_row]
    assert len(set(counts)) > 1  # unequal token counts: a mean of per-batch means would differ
    expected = total / sum(counts)
    logged = local_run["metrics"][0]
    assert logged["step"] == 1 and logged["kind"] == "train"
    assert logged["loss"] == pytest.approx(expected, rel=LOSS_RTOL)


def test_eval_loss_is_the_true_token_mean(ray_cluster, tiny_model, processor, data, cache_dir,
                                          tmp_path: Path) -> None:
    """The eval loss (4 held-out rows with answers of different lengths, eval batches of 1 row on each of
    2 workers) equals the mean cross-entropy over every answer token of the eval split under the final
    weights, computed here independently with the merged model the job wrote. Trainer's own mean of
    per-batch means would differ."""
    root = tmp_path / "storage"
    storage = root / "runs" / "r1"
    # Some steps with trainable embeddings, so the rows' losses drift apart (a random model scores every
    # token about ln(vocab)) and the two averages differ clearly.
    flags = [*job_flags(tiny_model, data, cache_dir, str(root), EVAL_TEST_STEPS),
             "--global_batch_size=2", "--per_device_train_batch_size=1", "--eval_fraction=0.4",
             f"--save_steps={EVAL_TEST_STEPS}", "--train_embeddings=true", "--merge_adapter=true"]
    summary = vision_train.main(flags)
    args = parse_args(flags)
    _, evaluation, collator, _ = prepare_data(args, processor, None)
    per_row = answer_token_nll(storage / MERGED_DIR, evaluation, collator)
    total, counts = sum(n for n, _ in per_row), [c for _, c in per_row]
    row_means = [n / c for n, c in per_row]
    token_mean, mean_of_means = total / sum(counts), sum(row_means) / len(row_means)
    assert len(counts) == 4 and token_mean != pytest.approx(mean_of_means, rel=3 * LOSS_RTOL)  # they differ beyond the tolerance
    assert summary["final_eval_loss"] == pytest.approx(token_mean, rel=LOSS_RTOL)


def test_resume_drill_on_gcs(local_run, gcs_restart_run, fake_gcs) -> None:
    """Rank 1 is killed after step 3; Ray restarts the group, which resumes from the step-2 checkpoint
    on gs:// and ends at step 5 with the same per-step losses as the uninterrupted run. The job (data and
    storage on gs://) is conftest's gcs_restart_run, which test_scale counts the downloads of."""
    summary, root = gcs_restart_run["summary"], gcs_restart_run["root"]
    assert (DRILL_MAX_STEPS, FAULT_AT_STEP) == (GCS_RUN_STEPS, GCS_RUN_KILL_AFTER)
    storage = Storage(root=root, emulator_host=fake_gcs)
    assert storage.read_bytes(fault_marker(FAULT_AT_STEP)) is not None  # the fault did fire
    assert summary["global_step"] == DRILL_MAX_STEPS
    assert summary["resumed_from_step"] == FAULT_AT_STEP - FAULT_AT_STEP % SAVE_STEPS == 2
    metrics = records(storage.read_bytes("metrics.jsonl").decode())
    train = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, DRILL_MAX_STEPS + 1))  # each step once
    uninterrupted = {r["step"]: r["loss"] for r in local_run["metrics"] if r["kind"] == "train"}
    for r in train[:MAX_STEPS]:
        assert r["loss"] == pytest.approx(uninterrupted[r["step"]], abs=RESUME_ATOL), r["step"]
    # Checkpoints on gs://, keeping save_total_limit=1; the final adapter and the summary next to them.
    fs, base = storage.fs()
    listing = fs.get_file_info(pafs.FileSelector(f"{base}/checkpoints", recursive=True))
    ckpts = sorted({Path(i.path).relative_to(f"{base}/checkpoints").parts[0] for i in listing
                    if i.type == pafs.FileType.File and "/checkpoint-" in i.path})
    assert ckpts == [f"checkpoint-{DRILL_MAX_STEPS:06d}"]
    assert summary["newest_checkpoint"] == f"{root}/checkpoints/{ckpts[0]}"
    assert storage.read_bytes("final/adapter_model.safetensors")
    assert json.loads(storage.read_bytes("summary.json")) == summary


def test_ray_listens_on_loopback_only(local_run) -> None:
    """Every socket the session's Ray cluster listens on is bound to 127.0.0.1 (the brief: local Ray only)."""
    import ipaddress
    import os

    import psutil

    ray_procs = [p for p in psutil.Process(os.getpid()).children(recursive=True)]
    assert ray_procs, "the Ray cluster of this session has no processes"
    listening = []
    for proc in ray_procs:
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        listening += [(proc.name(), c.laddr) for c in conns if c.status == psutil.CONN_LISTEN]
    assert listening, "no listening sockets found for the Ray processes"
    exposed = []
    for name, (ip, port) in listening:
        addr = ipaddress.ip_address(ip)
        mapped = getattr(addr, "ipv4_mapped", None)
        if not (addr.is_loopback or (mapped is not None and mapped.is_loopback)):
            exposed.append(f"{name} {ip}:{port}")
    assert not exposed, f"Ray listens beyond loopback: {exposed}"


def test_a_usage_error_on_one_rank_ends_the_job(ray_cluster, tiny_model, data, cache_dir, tmp_path, capsys) -> None:
    """Rank 1 refuses its inputs while rank 0 waits for it in a collective (the data scan's broadcast):
    the job ends with rank 1's sentence and exit 2 (a rank that only returned left rank 0 waiting forever)."""
    sentence = "rank 1 refuses these inputs"
    flags = job_flags(tiny_model, data, cache_dir, str(tmp_path / "storage"), MAX_STEPS, run_name="refused")
    with pytest.raises(SystemExit) as stop:
        vision_train.main(flags, callbacks=[RefuseOnRankOne(sentence)])
    assert stop.value.code == 2
    assert f"error: {sentence}" in capsys.readouterr().err
