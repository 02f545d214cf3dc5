"""Which kernel each fast path runs on this GPU, chosen by its compute capability (issue #33, target 4).

Every fast path of the trainer asks `choose(path, capability)` before it installs anything. The table below
names, per architecture, the kernel the path runs and the portable fallback it takes everywhere else (a CPU,
an architecture older than Ampere, or one this table does not know: a new GPU gets the path that cannot fail,
never a kernel tuned for another chip). What each choice was measured on is `PROVEN` (and the trainer README).

| path | sm80/sm86/sm89 (A100, L4, ...) | sm90 (H100, H200) | sm100/sm103 (B200, B300) | unknown, CPU |
|---|---|---|---|---|
| `fused_lora` | Triton kernels, self-tested at start | same | same | PEFT's layer |
| `siglip_attention` | SDPA's order (FlashAttention-2 first) | FA4 when installed, else cuDNN | FA4 when installed, else cuDNN | SDPA's order |
| `lm_attention` | SDPA (Transformers' path) | cuDNN with grouped kv heads | cuDNN with grouped kv heads | SDPA |

The fused LoRA kernels use no architecture-specific instruction: Triton compiles them for the device at hand,
and their tiles (64-128 columns, 32-64 rows) fit the shared memory of every architecture named here (100 KB and
up). cuDNN and FA4 pick their own kernels per architecture; FA4 (CuTe DSL) builds for sm90 and sm100 only, and
runs SigLIP's head dim 72 zero-padded to 96 (at 72 its sm90 backward gave a wrong dq). The frozen LayerNorm
(`frozen_norm.py`) is PyTorch's own kernel everywhere. Standard library only: the driver may import this module.
"""

from __future__ import annotations

from dataclasses import dataclass

AMPERE_ADA = {(8, 0), (8, 6), (8, 7), (8, 9)}
HOPPER = {(9, 0)}
BLACKWELL = {(10, 0), (10, 3)}
KNOWN = AMPERE_ADA | HOPPER | BLACKWELL

PATHS = ("fused_lora", "siglip_attention", "lm_attention")

# Where each (path, kernel) was measured on a GPU: bench/results/<call>.jsonl rows. Paths not named here are
# chosen by the table above but unproven on that architecture (the README says so).
PROVEN: dict[tuple[str, str], tuple[str, ...]] = {
    ("fused_lora", "triton"): ("sm90",),
    ("siglip_attention", "cudnn"): ("sm90",),
    ("lm_attention", "cudnn_gqa"): ("sm90",),
}


@dataclass(frozen=True)
class Choice:
    path: str
    kernel: str
    reason: str

    @property
    def fallback(self) -> bool:
        return self.kernel in FALLBACK.values()


FALLBACK = {
    "fused_lora": "peft",
    "siglip_attention": "sdpa",
    "lm_attention": "sdpa",
}


def arch(capability: tuple[int, int] | None) -> str:
    return "cpu" if capability is None else f"sm{capability[0]}{capability[1]}"


def choose(path: str, capability: tuple[int, int] | None, available: frozenset[str] | set[str] = frozenset()) -> Choice:
    """The kernel `path` runs on a device of `capability` ((major, minor), None for a CPU); `available` names
    optional packages present in the process (e.g. {"fa4"})."""
    if path not in FALLBACK:
        raise ValueError(f"unknown fast path {path!r}: one of {', '.join(PATHS)}")
    name = arch(capability)
    if capability is None:
        return Choice(path, FALLBACK[path], "no GPU")
    if tuple(capability) not in KNOWN:
        return Choice(path, FALLBACK[path], f"{name} is not in the table: the portable path")
    cap = tuple(capability)
    if path == "fused_lora":
        return Choice(path, "triton", f"{name}: Triton compiles the kernels for it")
    if path == "siglip_attention":
        if cap in HOPPER | BLACKWELL:
            if "fa4" in available:
                return Choice(path, "fa4", f"{name}: FlashAttention 4 (CuTe DSL) builds for sm90 and sm100")
            return Choice(path, "cudnn", f"{name}: cuDNN's fused attention (FA4 not installed)")
        return Choice(path, FALLBACK[path], f"{name}: SDPA's own order (FlashAttention-2 first)")
    # lm_attention: cuDNN's fused attention with a mask and grouped kv heads, Hopper and newer
    if cap in HOPPER | BLACKWELL:
        return Choice(path, "cudnn_gqa", f"{name}: cuDNN's fused attention with grouped kv heads")
    return Choice(path, FALLBACK[path], f"{name}: Transformers' SDPA path")


def device_capability() -> tuple[int, int] | None:
    """This process's GPU (device 0 of what it sees), or None without one."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]


def available_packages() -> frozenset[str]:
    """Optional kernel packages importable here (found, not imported: FA4's import compiles nothing but
    loads its CUDA libraries)."""
    from importlib.util import find_spec

    found = set()
    try:
        if find_spec("flash_attn") is not None and find_spec("flash_attn.cute") is not None:
            found.add("fa4")
    except (ImportError, ValueError):
        pass
    return frozenset(found)


def plan(capability: tuple[int, int] | None = None, available: frozenset[str] | None = None,
         detect: bool = True) -> dict[str, Choice]:
    """Every path's choice for this device (detected unless given)."""
    if detect and capability is None:
        capability = device_capability()
    if available is None:
        available = available_packages()
    return {p: choose(p, capability, available) for p in PATHS}


def proven_on(path: str, kernel: str) -> tuple[str, ...]:
    return PROVEN.get((path, kernel), ())
