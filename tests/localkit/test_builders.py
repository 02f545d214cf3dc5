"""The offline tiny Gemma 3 and the sample dataset behave like the real ones where it matters."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from PIL import Image

from localkit import sample_data, tiny_model


@pytest.fixture(scope="module")
def processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model.build_tiny_gemma3())


def test_tokenizer_ids_are_the_gguf_vocabulary(processor) -> None:
    tokens, _, _ = tiny_model._gguf_vocab(tiny_model.gguf_path())
    tok = processor.tokenizer
    for piece in ("<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "\n\n"):
        assert tok.convert_tokens_to_ids(piece) == tokens.index(piece), piece
    # Text is segmented into real multi-character pieces that round-trip.
    ids = tok("The Amazon product: shoes", add_special_tokens=False).input_ids
    assert len(ids) < 8
    assert tok.decode(ids) == "The Amazon product: shoes"
    # The image soft token is new, right after the text vocabulary, as in gemma-3-4b-it.
    assert tok.image_token_id == len(tokens)


def test_processor_expands_one_image_into_soft_tokens(processor) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model.build_tiny_gemma3())
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A digit."}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False)
    assert text.startswith("<bos><start_of_turn>user\nsys\n\n<start_of_image>")
    batch = processor(text=[text], images=[[Image.new("RGB", (20, 30))]], add_special_tokens=False,
                      return_tensors="pt")
    ids = batch["input_ids"][0].tolist()
    assert ids.count(config.image_token_index) == config.mm_tokens_per_image
    assert ids.count(processor.tokenizer.bos_token_id) == 1
    assert int(batch["token_type_ids"].sum()) == config.mm_tokens_per_image


def test_sample_dataset_schema_and_learnable_text(tmp_path) -> None:
    path = sample_data.build_sample_dataset(tmp_path, n_rows=30, seed=3)
    table = pq.read_table(path)
    assert table.column_names == ["Product Name", "Category", "image", "description"]
    rows = table.to_pylist()
    again = pq.read_table(sample_data.build_sample_dataset(tmp_path / "again", n_rows=30, seed=3)).to_pylist()
    assert rows == again  # deterministic per seed
    for row in rows:
        word = row["description"].split()[2]
        assert word in sample_data.DIGIT_WORDS
        assert word.capitalize() in row["Product Name"]
        img = Image.open(__import__("io").BytesIO(row["image"]["bytes"]))
        assert img.size == (sample_data.IMAGE_SIDE, sample_data.IMAGE_SIDE)
