"""Training-speed benchmark of the trainer's own path on Gemma 3 4B (random weights), one GPU.

What runs is `trainer/vision_train.py` itself: its flag parsing, its data path (parquet rows → lazy
image decode → its collator and the Gemma 3 processor), its model setup (`load_model`, quantization,
attention kernel, LoRA, Liger) and its TRL `SFTTrainer` step (loss, accumulation, clipping, optimizer).
Only the inputs are synthetic: the google/gemma-3-4b-it architecture with random bf16 weights (saved
once, then loaded through the trainer's `from_pretrained` path, 4-bit quantization included), the
real Gemma 3 tokenizer and processor (896×896 images, 256 soft tokens), and product rows whose texts
are sized like the tutorial's data (~390 tokens per sample with the image).

Two steps:

    python3 -m bench.bench prepare --out .bench/assets        # here (CPU): processor + config
    python3 -m bench.bench run --assets .bench/assets --recipe default --out results.jsonl   # GPU

`run` prints one `RESULT {json}` line per recipe: samples/s, tokens/s, peak GPU memory, MFU and the
projected wall time of the tutorial's 3-epoch workload (1,345 samples) on one GPU, and per-phase
times measured on extra steps after the timed ones (vision tower, language model, loss, optimizer,
data loading; backward is the rest of the step).

MFU = model FLOPs / step time / 989e12 (H100/H200 dense bf16 peak). Model FLOPs per sample follow
the reference measurement (../shared/reference-bench): frozen linear layers under LoRA cost 4·N·T
(forward 2·N·T + input-gradient 2·N·T), attention 3× its forward, the 262k-vocabulary head counted
at every token for every recipe (so MFU compares recipes at equal work, whatever a recipe skips),
the SigLIP tower 4·N·P with a backward pass or 2·N·P without one (frozen vision).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

PEAK_BF16_FLOPS = 989e12
TUTORIAL_SAMPLES = 1345
TUTORIAL_EPOCHS = 3
IMAGE_SIDE = 896

# google/gemma-3-4b-it's architecture (as ../shared/reference-bench).
TEXT_CONFIG = dict(
    hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, vocab_size=262208, sliding_window=1024,
    query_pre_attn_scalar=256, max_position_embeddings=131072,
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
)
VISION_CONFIG = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
    num_attention_heads=16, patch_size=14, image_size=IMAGE_SIDE, vision_use_head=False,
)
MM_TOKENS_PER_IMAGE = 256
# The other Gemma 3 vision sizes (google/gemma-3-12b-it, -27b-it): the same SigLIP tower and processor, a larger
# language model. Bytes: their bf16 weights, to place them where they fit on the GPU machine (ensure_weights).
SIZES: dict[str, dict[str, Any]] = {
    "4b": {},
    "12b": dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256),
    "27b": dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
                num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168),
}
WEIGHT_BYTES = {"4b": 8.6e9, "12b": 24.4e9, "27b": 54.9e9}

# Recipes: trainer flags. Everything not named takes the trainer's default.
TUTORIAL_FLAGS = {
    # the tutorial's vision_train.py: QLoRA (NF4, double quant), eager attention, gradient
    # checkpointing, batch 1 × 4 accumulation (one worker's share of its global batch 64 on 16 GPUs),
    # LoRA r16/α16/0.05 on all linear layers, embeddings trained
    "quantization": "4bit",
    "attn_implementation": "eager",
    "gradient_checkpointing": "true",
    "per_device_train_batch_size": 1,
    "global_batch_size": 4,
    "train_embeddings": "true",
    "lora_target": "all-linear",
    "lora_r": 16,
    "lora_alpha": 16,
    "lora_dropout": 0.05,
    "learning_rate": 0.0002,
}
# The tutorial's global batch; the rows below keep it on one GPU (micro-batch x accumulation).
GLOBAL_BATCH = 64
PLAIN_TRL_FLAGS = {
    # TRL + PEFT as a careful user writes it: bf16, sdpa, no checkpointing, batch 8, but no Liger, PEFT's
    # fp32 adapters, no loader processes and none of this project's levers
    "use_liger_kernel": "false", "adapter_dtype": "fp32", "dataloader_num_workers": 0,
    "fused_lora": "false", "vision_attention": "sdpa", "lm_attention": "sdpa", "lean_step": "false",
    "per_device_train_batch_size": 8, "global_batch_size": 64,
}
ROUND1_FLAGS = {  # the fast recipe as round 1 left it (before fused LoRA and cuDNN SigLIP attention)
    "fused_lora": "false", "vision_attention": "sdpa", "lm_attention": "sdpa", "lean_step": "false",
    "per_device_train_batch_size": 8, "global_batch_size": 64,
}
RECIPES: dict[str, dict[str, Any]] = {
    "tutorial": TUTORIAL_FLAGS,
    "plain_trl": PLAIN_TRL_FLAGS,
    "round1": ROUND1_FLAGS,
    "default": {"per_device_train_batch_size": 16, "global_batch_size": 64},
    # no backward through SigLIP: LoRA on the language model only, vision tower run without gradients
    "freeze_vision": {"freeze_vision": "true", "lora_target": "language-model", "per_device_train_batch_size": 32,
                      "global_batch_size": 64},
    # the vision tower's encoder layers compiled (static shapes)
    "default_compile": {"compile_vision": "true", "per_device_train_batch_size": 16,
                        "global_batch_size": 64},
    # the default plus bench/kernels/fp8_linear.py (an experiment, not a trainer flag): the frozen base weights in FP8
    "fp8": {"per_device_train_batch_size": 16, "global_batch_size": 64},
    # explicit flags only (after --)
    "custom": {},
}


# ------------------------------------------------------------------------------------------------
# prepare (CPU, here): processor and config; the GPU machine has no GGUF package to build them from
# ------------------------------------------------------------------------------------------------
def prepare(out: Path) -> Path:
    """The processor and the config of every size in SIZES (out/gemma3-4b, gemma3-12b, gemma3-27b)."""
    from localkit.tiny_model import gemma3_processor_and_config

    for size, text in SIZES.items():
        processor, config = gemma3_processor_and_config({**TEXT_CONFIG, **text}, VISION_CONFIG, MM_TOKENS_PER_IMAGE)
        target = out / f"gemma3-{size}"
        target.mkdir(parents=True, exist_ok=True)
        processor.save_pretrained(target)
        config.save_pretrained(target)
    return out / "gemma3-4b"


# ------------------------------------------------------------------------------------------------
# run (GPU)
# ------------------------------------------------------------------------------------------------
def weights_home(work: Path, size: str) -> Path:
    """Where `size`'s random weights go: `work`, unless it lacks room for them and /dev/shm has it (the 27B's 55 GB
    beside the GPU machine's 64 GiB disk); other sizes' weights are removed first when neither has room."""
    import shutil

    need = WEIGHT_BYTES[size] * 1.05
    work.mkdir(parents=True, exist_ok=True)
    for home in (work, Path("/dev/shm/gemma3-bench")):
        try:
            home.mkdir(parents=True, exist_ok=True)
            if shutil.disk_usage(home).free > need:
                return home
        except OSError:
            continue
    for home in (work, Path("/dev/shm/gemma3-bench")):
        for old in home.glob("gemma3-*-random*") if home.exists() else ():
            if not old.name.startswith(f"gemma3-{size}-"):
                print(f"[bench] removing {old} to make room for the {size} weights", flush=True)
                shutil.rmtree(old, ignore_errors=True)
    return max((work, Path("/dev/shm/gemma3-bench")),
               key=lambda h: shutil.disk_usage(h).free if h.exists() else 0)


def ensure_weights(assets: Path, work: Path, layers: tuple[int, int] | None = None, size: str = "4b") -> Path:
    """Random bf16 weights for `size`'s architecture (SIZES), saved once so the trainer loads them its own way;
    `layers` = (language model, vision tower) layers of a reduced copy of it (the FP8 loss comparison)."""
    import shutil

    import torch
    from transformers import AutoConfig, Gemma3ForConditionalGeneration

    name = f"gemma3-{size}-random" + (f"-{layers[0]}x{layers[1]}" if layers else "")
    for home in (work, Path("/dev/shm/gemma3-bench")):
        found = home / name
        if (found / "model.safetensors.index.json").exists() or (found / "model.safetensors").exists():
            return found
    model_dir = (weights_home(work, size) if not layers else work) / name
    t0 = time.time()
    src = assets / f"gemma3-{size}"
    config = AutoConfig.from_pretrained(src)
    if layers:
        config.text_config.num_hidden_layers, config.vision_config.num_hidden_layers = layers
        config.text_config.layer_types = config.text_config.layer_types[:layers[0]]
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Gemma3ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in src.iterdir():
        if f.name != "config.json" and not (tmp / f.name).exists():
            shutil.copy(f, tmp / f.name)
    del model
    torch.cuda.empty_cache()
    tmp.rename(model_dir)
    print(f"[bench] random {size} weights saved in {time.time() - t0:.0f}s ({model_dir})", flush=True)
    return model_dir


def synthetic_rows(processor, n: int, seed: int = 1234) -> list[dict[str, Any]]:
    """Rows in the tutorial's schema, texts sized like its data, 896×896 JPEG photos of noise blobs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    vocab = [w for w in processor.tokenizer.get_vocab() if w.startswith("▁") and w[1:].isalpha()][:20000]

    def words(k: int) -> str:
        return " ".join(vocab[int(i)][1:] for i in rng.integers(0, len(vocab), k))

    rows = []
    for i in range(n):
        base = rng.integers(0, 255, (28, 28, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((IMAGE_SIDE, IMAGE_SIDE), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        rows.append({
            "Product Name": words(int(rng.integers(8, 20))),          # names in the data: ~10-25 tokens
            "Category": words(int(rng.integers(4, 9))),               # "A | B | C" style categories
            "image": {"bytes": buf.getvalue(), "path": f"img-{i}.jpg"},
            "description": words(int(rng.integers(35, 70))),          # descriptions: ~40-80 tokens
        })
    return rows


def write_dataset(processor, work: Path, n: int) -> Path:
    from datasets import Dataset, Features, Image, Value

    path = work / f"products-{n}.parquet"
    if not path.exists():
        features = Features({"Product Name": Value("string"), "Category": Value("string"), "image": Image(),
                             "description": Value("string")})
        Dataset.from_list(synthetic_rows(processor, n), features=features).to_parquet(str(path))
    return path


def model_flops_per_sample(config, n_tokens: float, vision_backward: bool) -> float:
    t, v = config.text_config, config.vision_config
    h, inter, layers = t.hidden_size, t.intermediate_size, t.num_hidden_layers
    nh, nkv, hd = t.num_attention_heads, t.num_key_value_heads, t.head_dim
    n_lm = layers * (h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * inter)
    n_head = h * t.vocab_size
    flops = 4 * n_lm * n_tokens + 4 * n_head * n_tokens
    flops += 3 * layers * 4 * n_tokens * n_tokens * nh * hd  # attention (causal counted full)
    patches = (v.image_size // v.patch_size) ** 2
    vh, vi, vl = v.hidden_size, v.intermediate_size, v.num_hidden_layers
    n_vis = vl * (4 * vh * vh + 2 * vh * vi)
    k = 2 if vision_backward else 1
    flops += 2 * k * n_vis * patches + (1 + 2 * (k - 1)) * vl * 4 * patches * patches * vh
    flops += 2 * k * config.mm_tokens_per_image * vh * h
    return flops


def run(assets: Path, work: Path, recipe: str, extra: list[str], warmup: int, steps: int, phase_steps: int,
        out: Path | None, smoke: bool = False, name: str | None = None, epochs: float = 0.0,
        rows: int = 0, layers: tuple[int, int] | None = None, profile: bool = False, size: str = "4b",
        memory_gib: float = 0.0) -> dict[str, Any]:
    """One recipe: `warmup + steps + phase_steps` optimizer steps, or with `epochs`, that many epochs over
    `rows` rows (the tutorial's workload: 3 x 1,345), timed end to end by trainer.train(). `profile`: one more
    step, after the timed ones, under torch.profiler (bench/profile_step.py), written beside `out`. `size`: the
    Gemma 3 size (SIZES); `memory_gib`: this process's GPU memory capped there (a smaller GPU, emulated: PyTorch's
    allocator refuses to reserve more, so a row that does not fit there fails out of memory here)."""
    import torch
    from transformers import AutoConfig, AutoProcessor

    from bench.step_timer import StepTimer
    from trainer.job.arguments import parse_args as parse_trainer_args
    from trainer.worker.model import build_trainer
    from trainer.worker.worker import CUDA_ALLOC_CONF

    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)  # as the trainer's workers do
    res: dict[str, Any] = {"name": name or recipe, "recipe": recipe, "ok": False, "layers": layers, "size": size}
    t0 = time.time()
    try:
        if memory_gib and not smoke:
            total = torch.cuda.get_device_properties(0).total_memory
            if memory_gib * 2**30 > total:
                raise ValueError(f"--memory_gib {memory_gib} is above this GPU's {total / 2**30:.1f} GiB")
            torch.cuda.set_per_process_memory_fraction(memory_gib * 2**30 / total)
            res["memory_cap_gib"] = memory_gib
        if smoke:  # CPU check of this script: the tiny demo model instead of 4B
            from localkit.tiny_model import build_tiny_gemma3

            model_dir = build_tiny_gemma3()
        else:
            model_dir = ensure_weights(assets, work, layers, size)
        processor = AutoProcessor.from_pretrained(model_dir)
        flags = dict(RECIPES[recipe])
        argv = [f"--{k}={v}" for k, v in flags.items()] + list(extra)
        common = ["--model_id=" + str(model_dir), f"--use_gpu={str(not smoke).lower()}", "--eval_fraction=0",
                  "--save_strategy=no", "--logging_steps=1", "--num_workers=1", f"--storage_path={work / 'runs' / recipe}"]
        if not any(a.startswith("--global_batch_size") for a in argv):
            # One worker, one micro-batch per optimizer step (no accumulation) unless the recipe says otherwise.
            cap = parse_trainer_args([*argv, *common, "--global_batch_size=1"]).per_device_train_batch_size
            argv.append(f"--global_batch_size={cap}")
        args = parse_trainer_args(argv + common)
        per_step = args.global_batch_size
        total = warmup + steps + phase_steps + int(profile)
        dataset = write_dataset(processor, work, rows or max(64, per_step * total))
        args.dataset_name = str(dataset)
        if epochs:
            args.max_steps, args.num_train_epochs = -1, epochs
            steps, phase_steps = 10**9, 0
        else:
            args.max_steps = total
        res["flags"] = {k: v for k, v in vars(args).items() if k not in ("prompt_template", "system_message")}
        device = torch.device("cpu" if smoke else "cuda")
        if not smoke:
            torch.cuda.reset_peak_memory_stats()
        trainer, _processor, stats = build_trainer(args, model_dir, work / "runs" / recipe / "local", device, None)
        if recipe == "fp8":  # the trainer's own path, then the experimental conversion (bench/kernels/fp8_linear.py)
            from bench.kernels import fp8_linear

            trainer.speed_levers["fp8"] = fp8_linear.apply_to(trainer.model, trainer.speed_levers)
        timer = StepTimer(trainer.model, timed_from=warmup, phase_from=warmup + steps + int(profile),
                          skip=warmup + steps + 1 if profile else None)
        trainer.add_callback(timer.get_callback())
        prof = None
        if profile:
            from bench.profile_step import ProfileStep

            where = (out.parent if out else work) / f"{(out.stem + '-') if out else ''}{res['name']}-profile.txt"
            prof = ProfileStep(warmup + steps, where,
                               lambda: sum(timer.step_times) / len(timer.step_times) if timer.step_times else None)
            trainer.add_callback(prof.get_callback())
        # Tokens per sample, measured on the collator's own output.
        sample = trainer.data_collator([trainer.train_dataset[i] for i in range(min(16, len(trainer.train_dataset)))])
        tokens_per_sample = float(sample["attention_mask"].sum()) / sample["attention_mask"].shape[0]
        labelled_per_sample = float((sample["labels"] != -100).sum()) / sample["labels"].shape[0]
        t_train = time.time()
        trainer.train()
        res["train_wall_s"] = round(time.time() - t_train, 1)
        if epochs:
            res["workload"] = {"rows": len(trainer.train_dataset), "epochs": epochs,
                               "samples": len(trainer.train_dataset) * epochs, "train_wall_s": res["train_wall_s"],
                               "samples_per_s": len(trainer.train_dataset) * epochs / res["train_wall_s"],
                               "optimizer_steps": trainer.state.global_step}
        if prof is not None and prof.summary is not None:
            res["profile"] = dict(prof.summary, top_kernels=prof.summary["top_kernels"][:12], file=str(prof.out))
        levers = getattr(trainer, "speed_levers", {})
        cache = levers.get("image_feature_cache")
        res["levers"] = {k: v for k, v in levers.items() if k != "image_feature_cache"}
        if cache is not None:
            res["levers"]["image_feature_cache"] = {"hits": cache.hits, "misses": cache.misses,
                                                     "gib": round(cache.bytes / 2**30, 2)}
        samples_per_step = per_step
        tsum = sum(timer.step_times)
        sps = samples_per_step * len(timer.step_times) / tsum
        config = AutoConfig.from_pretrained(model_dir)
        flops = model_flops_per_sample(config, tokens_per_sample, vision_backward=not args.freeze_vision)
        ph = {k: round(v / max(1, timer.phase_steps), 4) for k, v in timer.phase.items()}
        if "step" in ph:
            fwd = sum(ph.get(k, 0.0) for k in ("vision_tower", "projector", "language_model"))
            ph["backward_and_loss"] = round(ph["step"] - fwd - ph.get("optimizer", 0.0), 4)
        res.update(
            ok=True,
            timed_steps=len(timer.step_times),
            step_s_mean=tsum / len(timer.step_times),
            step_s_min=min(timer.step_times),
            step_s_max=max(timer.step_times),
            step_s=[round(t, 3) for t in timer.step_times],
            samples_per_step=samples_per_step,
            samples_per_s=sps,
            tokens_per_s=sps * tokens_per_sample,
            tokens_per_sample=tokens_per_sample,
            labelled_tokens_per_sample=labelled_per_sample,
            data_wait_s_mean=(sum(timer.data_times) / len(timer.data_times)) if timer.data_times else None,
            tflop_per_sample=flops / 1e12,
            mfu=flops * sps / PEAK_BF16_FLOPS,
            tutorial_3ep_projected_s=TUTORIAL_EPOCHS * TUTORIAL_SAMPLES / sps,
            phase_s_per_step=ph,
            trainable_params=sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            loss_log=[h.get("loss") for h in trainer.state.log_history if "loss" in h],
            data_stats=stats,
        )
        if torch.cuda.is_available():
            res["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
            res["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    except Exception as e:  # a recipe that fails (e.g. out of memory) is a result too
        import traceback

        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {str(e)[:800]}"
        if torch.cuda.is_available():
            res["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
            res["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        res["out_of_memory"] = "OutOfMemoryError" in type(e).__name__ or "out of memory" in str(e)
    res["wall_s"] = round(time.time() - t0, 1)
    res["versions"] = versions()
    return emit(res, out)


def emit(res: dict[str, Any], out: str | None) -> dict[str, Any]:
    """One result: printed as a RESULT line (the call's log) and appended to the call's results file."""
    line = json.dumps(res, default=str)
    print("RESULT " + line, flush=True)
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")
    return res


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "ray", "bitsandbytes",
                 "liger-kernel"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "-"
    try:
        import torch

        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:
        out["gpu"] = "?"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write the processor + 4B config (CPU, where the GGUF package is)")
    p.add_argument("--out", type=Path, default=ROOT / ".bench" / "assets")
    r = sub.add_parser("run", help="run one recipe on the GPU (extra args after -- are trainer flags)")
    r.add_argument("--assets", type=Path, default=ROOT / ".bench" / "assets")
    r.add_argument("--work", type=Path, default=Path(os.environ.get("BENCH_WORK", "/tmp/gemma3-bench")))
    r.add_argument("--recipe", required=True, choices=sorted(RECIPES))
    r.add_argument("--name", default=None, help="label of the result (default: the recipe)")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--phase_steps", type=int, default=2)
    r.add_argument("--out", type=Path, default=None)
    r.add_argument("--smoke", action="store_true", help="CPU check of the script with the tiny demo model")
    r.add_argument("--epochs", type=float, default=0.0, help="time this many epochs over --rows rows instead")
    r.add_argument("--rows", type=int, default=0, help="rows of the synthetic dataset (default: enough steps)")
    r.add_argument("--layers", default="", help="LM,vision layers of a reduced 4B model (e.g. 6,6; default: all)")
    r.add_argument("--profile", action="store_true", help="one more step under torch.profiler, written beside --out")
    r.add_argument("--size", default="4b", choices=sorted(SIZES), help="the Gemma 3 size (random weights)")
    r.add_argument("--memory_gib", type=float, default=0.0,
                   help="cap this process's GPU memory here (a smaller GPU's, emulated; default: the whole GPU)")
    r.add_argument("flags", nargs="*", help="extra trainer flags, e.g. --per_device_train_batch_size=12")
    d = sub.add_parser("data", help="write the random 4B weights and N synthetic rows (for bench/e2e_ray.sh)")
    d.add_argument("--assets", type=Path, default=ROOT / ".bench" / "assets")
    d.add_argument("--work", type=Path, default=Path(os.environ.get("BENCH_WORK", "/tmp/gemma3-bench")))
    d.add_argument("--rows", type=int, required=True)
    d.add_argument("--size", default="4b", choices=sorted(SIZES), help="the Gemma 3 size (random weights)")
    a = parser.parse_args()
    if a.cmd == "prepare":
        print(prepare(a.out))
    elif a.cmd == "data":
        from transformers import AutoProcessor

        a.work.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        model_dir = ensure_weights(a.assets, a.work, size=a.size)
        print(f"[bench] {a.size} weights at {model_dir} ({time.time() - t0:.0f}s)", flush=True)
        print(write_dataset(AutoProcessor.from_pretrained(model_dir), a.work, a.rows))
    else:
        res = run(a.assets, a.work, a.recipe, a.flags, a.warmup, a.steps, a.phase_steps, a.out, a.smoke, a.name,
                  a.epochs, a.rows, tuple(int(v) for v in a.layers.split(",")) if a.layers else None, a.profile,
                  a.size, a.memory_gib)
        sys.exit(0 if res.get("ok") else 1)


if __name__ == "__main__":
    main()
