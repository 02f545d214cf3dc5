"""The LM head scores only the labelled positions on every device.

TRL's fused LM head (`trl.trainer.utils.add_fused_lm_head`, which `SFTTrainer` adds) projects the hidden states
onto Gemma 3's 262k-token vocabulary in tiles and folds each tile into log-probabilities, entropy and top-1
flags. On Triton devices (CUDA, XPU) it scores only the positions whose label is not -100; elsewhere it scores
every position, so that a compiler's tile shapes stay fixed (Neuron). On CPU nothing is compiled, and this job's
labels are answer-only: the prompt, the image's soft tokens and the padding are unlabelled — on the bundled demo
rows 88% of the positions before padding (122 tokens a row, 14 labelled). Scoring only the labelled ones gives the same loss, gradients and metrics (the
unlabelled positions are zeroed either way) for a fraction of the work; on CPU the head is most of a step (the
demo, the tests). Worker code: TRL is imported here, never by the driver.
"""

from __future__ import annotations

from typing import Any

MARK = "_gemma3_ray_labelled_only"


def labelled_positions_only() -> dict[str, Any]:
    """Make TRL's fused LM head score only labelled positions on CPU too (a no-op where it already does);
    what was done, for the run's levers. A TRL without the hook this relies on is left as it is."""
    from trl.trainer import utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None or not callable(original):
        return {"applied": False, "reason": "this TRL has no trl.trainer.utils._use_triton (its head is unchanged)"}
    if getattr(original, MARK, False):
        return {"applied": True, "devices": "all"}

    def compact(device) -> bool:
        # Read in add_fused_lm_head's forward only, as "score only the labelled positions"; the tile kernel is
        # chosen by trl.kernels.chunked_logprob's own _use_triton (torch ops on CPU), which stays as it is.
        return device.type == "cpu" or original(device)

    setattr(compact, MARK, True)
    compact.__wrapped__ = original  # type: ignore[attr-defined]
    trl_utils._use_triton = compact
    return {"applied": True, "devices": "all"}


def on(args) -> bool:
    return True  # every device, every recipe


def lever(run) -> dict[str, Any]:
    return labelled_positions_only()
