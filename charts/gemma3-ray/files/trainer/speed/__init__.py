"""speed: the speed levers and kernels, each lever a row of ``job/lever_table.py`` and a module here.

Owns: turning the levers on for a trainer by walking the table (``speed_levers``); fused LoRA layers, their Triton
kernels and their PEFT wiring (``fast_lora``, ``fast_lora_kernels``, ``fast_lora_peft``); the frozen vision
features cached (``feature_cache``); the compile cache kept on storage (``compile_cache``); the lean step
(``step_levers``); the vision tower's attention lever (``vision_attention``); which kernel each fast path runs on
this GPU (``capability``); the one wrapper over Transformers' SDPA function that routes each call to its module's
kernel (``sdpa_router``); SigLIP attention through FlashAttention 4 (``fa4_attention``); the language model's
attention through cuDNN with grouped kv heads (``lm_attention``); the vision tower's frozen LayerNorms through
PyTorch's kernel (``frozen_norm``); TRL's fused LM head scoring only the labelled positions on CPU too
(``lm_head``).

May import: job.
"""
