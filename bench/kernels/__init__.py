"""kernels: kernel candidates on the GPU, each checked against a float32 reference, then timed.

Owns: SigLIP attention and the frozen LayerNorm, the ``kernels`` scenario (``attention_check``); round 3-4's
checks of the speed levers' kernels (``kernel_check``); the FP8 experiment, not shipped: the layers
(``fp8_linear``, which the bench's ``fp8`` recipe applies) and their check (``fp8_check``).

May import: nothing (of bench; the trainer's speed/ is what they check).
"""
