"""`bench.py run --profile` (bench/profile_step.py): kernel categories, the gap, and a CPU smoke of one row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import profile_step

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "cat"), [
    ("lora_bwd", "lora"), ("lora_fwd", "lora"), ("dropout_lora_bwd", "lora"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
    ("fmha_cutlassB_bf16_aligned_128x64_k65536_sm80(PyTorchMemEffAttention::AttentionBackwardKernel", "attention"),
    ("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN", "gemm"),
    ("_layer_norm_backward_kernel", "triton"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel",
     "copy/cast"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl", "elementwise"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdam", "optimizer"),
    ("void cudnn::fusion::compute_dot_do_o<true>", "other"),
])
def test_kernel_categories(name: str, cat: str) -> None:
    assert profile_step.category(name) == cat


def test_summary_gap_is_step_wall_minus_gpu_time() -> None:
    kernels = [("lora_bwd", 500.0), ("lora_bwd", 700.0), ("nvjet_sm90_x", 3000.0), ("direct_copy_kernel", 800.0)]
    s = profile_step.summarise(kernels, step_wall_s=0.006, captured_wall_s=0.009)
    assert s["gpu_ms"] == 5.0 and s["gap_ms"] == 1.0 and s["captured_step_wall_ms"] == 9.0
    assert s["by_category_ms"] == {"gemm": 3.0, "lora": 1.2, "copy/cast": 0.8}
    assert s["top_kernels"][0] == {"name": "nvjet_sm90_x", "ms": 3.0, "calls": 1, "category": "gemm"}
    assert s["top_kernels"][1]["calls"] == 2


@pytest.mark.slow
def test_profiled_row_on_cpu_keeps_its_timed_steps(tmp_path: Path) -> None:
    # the tiny Gemma 3 on CPU: 1 warm-up + 2 timed + 1 profiled step; the profiled step is neither timed nor phased
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "bench.bench", "run", "--smoke", "--recipe", "custom", "--warmup", "1",
           "--steps", "2", "--phase_steps", "0", "--profile", "--out", str(out), "--work", str(tmp_path / "w"), "--",
           "--use_liger_kernel=false", "--fused_lora=false", "--per_device_train_batch_size=1", "--global_batch_size=1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text().splitlines()[-1])
    assert res["timed_steps"] == 2 and len(res["loss_log"]) == 4
    text = (tmp_path / "r-custom-profile.txt").read_text()
    assert res["profile"]["file"].endswith("r-custom-profile.txt") and res["profile"]["captured_step_wall_ms"] > 0
    assert "OPS BY GPU TIME" in text and "aten::" in text and ".py(" not in text.split("OPS BY GPU TIME")[1][:3000]


def test_idle_time_is_charged_to_the_caller_that_launched_the_next_kernel() -> None:
    from types import SimpleNamespace as NS

    def ev(name, dev, start, end, kernels=(), parent=None):
        return NS(name=name, device_type=f"DeviceType.{dev}", time_range=NS(start=start, end=end),
                  kernels=[NS(name=k, duration=d) for k, d in kernels], cpu_parent=parent, stack=[])

    frame = ev("modeling_gemma3.py(352): forward", "CPU", 0, 9)
    module = ev("torch/nn/modules/module.py(1775): _call_impl", "CPU", 0, 9, parent=frame)
    lora = ev("fast_lora.py(120): forward", "CPU", 0, 5)
    clone = ev("aten::clone", "CPU", 6, 8, parent=module)
    events = [
        frame, module, lora, clone,
        ev("aten::mm", "CPU", 0, 5, kernels=[("nvjet_gemm", 10), ("nvjet_gemm2", 10)], parent=lora),
        ev("aten::copy_", "CPU", 6, 7, kernels=[("direct_copy_kernel", 5)], parent=clone),
        ev("aten::copy_", "CPU", 7, 8, kernels=[("direct_copy_kernel", 1)], parent=clone),
        ev("nvjet_gemm", "CUDA", 10, 20),
        ev("nvjet_gemm2", "CUDA", 15, 25),  # overlaps: no idle
        ev("direct_copy_kernel", "CUDA", 40, 45),  # 15 µs idle before it, launched by the first copy_
        ev("direct_copy_kernel", "CUDA", 50, 51),  # 5 more
        ev("lora_fwd", "CUDA", 61, 62),  # 10, no op launched it
    ]
    total, callers = profile_step.idle_by_caller(NS(events=lambda: events))
    assert total == 30
    want = "aten::copy_ <- aten::clone <- modeling_gemma3.py(352): forward"  # torch's module frames left out
    assert callers == [(want, 20, 2), ("(launch not found)", 10, 1)]
    assert profile_step.copies_by_caller(NS(events=lambda: events)) == [(want, 6, 2)]
