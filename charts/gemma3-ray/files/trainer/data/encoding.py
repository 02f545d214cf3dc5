"""A row as chat text and token ids: answer-only labels, one <bos>, image soft tokens marked."""

from __future__ import annotations

from typing import Any

from trainer.job.flag_values import prompt_fields
from trainer.job.flags import ANSWER_FIELD, TrainArguments, UsageError

LABEL_IGNORE = -100
# GPU micro-batches are padded to a multiple of this many tokens (2% more tokens on average, steadier steps).
GPU_PAD_MULTIPLE = 16


class SampleEncoder:
    """Turns a row into the chat-formatted prompt and answer, and into token ids with labels.

    The prompt is the chat template rendered up to the model turn's header (`add_generation_prompt`),
    exactly what the model sees when it generates; the answer is the rest of the rendered conversation.
    Only the answer and its end-of-turn token are labelled; what the template adds after the
    end-of-turn (a newline) stays unlabelled. `<bos>` comes from the template alone (the tokenizer's own
    special tokens are off), so there is exactly one.
    """

    def __init__(self, processor, args: TrainArguments):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.args = args
        self.fields = prompt_fields(args.prompt_template)
        # Gemma3Processor: the chat template puts `boi_token` (<start_of_image>) where the image goes and the
        # processor expands it into `full_image_sequence` (boi, image_seq_length soft tokens, eoi). The ids
        # come from the tokenizer; the model's config must agree (checked in load_model).
        self.soft_token_id = self.tokenizer.convert_tokens_to_ids(self.tokenizer.image_token)
        self.boi_token = processor.boi_token
        self.full_image_sequence = processor.full_image_sequence
        if getattr(processor.image_processor, "do_pan_and_scan", False):
            raise UsageError("the processor has do_pan_and_scan=true, which varies the image tokens; disable it")
        end = "<end_of_turn>"
        self.end_of_turn_id = self.tokenizer.convert_tokens_to_ids(end) if end in self.tokenizer.get_vocab() else None
        # The processor's image markers: in a row's text they would add image tokens without an image
        # (the forward pass then fails). Rows that contain them are rejected, not escaped.
        self.image_markers = sorted({t for t in (self.boi_token, getattr(processor, "eoi_token", None),
                                                 self.tokenizer.image_token) if t})
        for name, text in (("prompt_template", args.prompt_template), ("system_message", args.system_message)):
            if any(m in text for m in self.image_markers):
                raise UsageError(f"{name} contains an image marker ({', '.join(self.image_markers)}); remove it "
                                 "(the job places the image itself)")

    def image_marker_in(self, row: dict[str, Any]) -> bool:
        """Whether a text field of the row contains one of the processor's image markers."""
        return any(isinstance(row.get(f), str) and any(m in row[f] for m in self.image_markers)
                   for f in (ANSWER_FIELD, *self.fields))

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        prompt = self.args.prompt_template.format(**{f: row[f] for f in self.fields})
        msgs: list[dict[str, Any]] = []
        if self.args.system_message:
            msgs.append({"role": "system", "content": [{"type": "text", "text": self.args.system_message}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": prompt}, {"type": "image"}]})
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": row[ANSWER_FIELD]}]})
        return msgs

    def texts(self, row: dict[str, Any]) -> tuple[str, str]:
        """(prompt text with one image placeholder, answer text incl. the end-of-turn)."""
        msgs = self.messages(row)
        prompt = self.processor.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
        full = self.processor.apply_chat_template(msgs, tokenize=False)
        if not full.startswith(prompt):
            raise UsageError("the chat template does not render the prompt as a prefix of the conversation")
        return prompt, full[len(prompt) :]

    def answer_ids(self, answer: str) -> tuple[list[int], list[int]]:
        ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        n_labelled = len(ids)
        if self.end_of_turn_id is not None and self.end_of_turn_id in ids:
            n_labelled = ids.index(self.end_of_turn_id) + 1
        return ids, ids[:n_labelled] + [LABEL_IGNORE] * (len(ids) - n_labelled)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Prompt token ids with the image placeholder expanded as Gemma3Processor does."""
        expanded = prompt.replace(self.boi_token, self.full_image_sequence)
        return self.tokenizer(expanded, add_special_tokens=False)["input_ids"]

    def num_tokens(self, row: dict[str, Any]) -> int:
        """Sequence length of a row, without touching its image."""
        prompt, answer = self.texts(row)
        return len(self.prompt_ids(prompt)) + len(self.answer_ids(answer)[0])

    def encode(self, row: dict[str, Any]) -> tuple[list[int], list[int]]:
        """(token ids, labels) of one row."""
        prompt, answer = self.texts(row)
        p_ids = self.prompt_ids(prompt)
        a_ids, a_labels = self.answer_ids(answer)
        return list(p_ids) + a_ids, [LABEL_IGNORE] * len(p_ids) + a_labels

    def batch(self, encoded: list[tuple[list[int], list[int]]], images: list[Any] | None,
              pixel_values: Any = None) -> dict[str, Any]:
        """Pads encoded rows into one micro-batch with their images' pixels (`pixel_values`: the image processor's
        output for them, made elsewhere: the streaming path's CPU stage)."""
        import torch

        seqs, labels = [ids for ids, _ in encoded], [lab for _, lab in encoded]
        width = max(len(s) for s in seqs)
        if self.args.use_gpu:  # few distinct shapes: Triton kernels specialise on 16-divisible sizes
            width = -(-width // GPU_PAD_MULTIPLE) * GPU_PAD_MULTIPLE
        pad = self.tokenizer.pad_token_id
        batch = {
            "input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in seqs]),
            "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
            "labels": torch.tensor([lab + [LABEL_IGNORE] * (width - len(lab)) for lab in labels]),
            "pixel_values": torch.from_numpy(pixel_values) if pixel_values is not None else
            self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"],
        }
        # Gemma 3 attends bidirectionally within an image: token_type_ids marks its soft tokens.
        batch["token_type_ids"] = (batch["input_ids"] == self.soft_token_id).long()
        return batch


