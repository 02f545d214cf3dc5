"""speed: the speed levers and kernels, each chosen by a flag (the LM head's on every device).

Owns: turning the levers on for a trainer (``speed_levers``); fused LoRA layers, their Triton kernels
and their PEFT wiring (``fast_lora``, ``fast_lora_kernels``, ``fast_lora_peft``); the frozen vision
features cached (``feature_cache``); the compile cache kept on storage (``compile_cache``); per-step
levers (``step_levers``); the vision tower's attention backend (``vision_attention``); which kernel each fast
path runs on this GPU (``capability``); SigLIP attention through FlashAttention 4 (``fa4_attention``); the
vision tower's frozen LayerNorms through PyTorch's kernel (``frozen_norm``); TRL's fused LM head scoring only
the labelled positions on CPU too (``lm_head``).

May import: job.
"""
