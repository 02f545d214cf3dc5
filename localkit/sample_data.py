"""A small, real image→text dataset in the tutorial's schema, built offline.

The tutorial fine-tunes on ``philschmid/amazon-product-descriptions-vlm``: columns ``Product Name``,
``Category``, ``image`` and ``description``. This module builds the same schema from real images that
ship in a registry package: the handwritten digits scanned for scikit-learn (1,797 8×8 grey-scale
scans, UCI "Optical Recognition of Handwritten Digits"). Each row is a "print" product of one scanned
digit; its description names the digit in words and the category's use, so a model can learn it
from the image and the prompt, and a held-out split measures that it did.

The ``image`` column is stored as Hugging Face ``datasets`` writes an ``Image`` feature to parquet:
a struct of PNG ``bytes`` and a ``path``.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Category → (product name pattern, what the description says about its use).
CATEGORIES = {
    "Home & Kitchen | Wall Art": ("Handwritten {word} Wall Print", "framed for a calm wall"),
    "Office Products | Flash Cards": ("Number {word} Flash Card", "made for quick counting drills"),
    "Toys & Games | Learning & Education": ("Learn the {word} Puzzle Card", "a playful first step into numbers"),
}
# Scanned digits are 8×8; Gemma 3 processors resize anyway, so store a modest RGB PNG.
IMAGE_SIDE = 64


def _png(pixels, side: int) -> bytes:
    """A 0..16 grey-scale scan as an RGB PNG (dark ink on white), scaled to ``side``×``side``."""
    import numpy as np
    from PIL import Image

    grey = (255 - (np.asarray(pixels, dtype=np.float32) * (255.0 / 16.0))).clip(0, 255).astype("uint8")
    img = Image.fromarray(grey, mode="L").resize((side, side), Image.Resampling.BILINEAR).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# The 1,797 handwritten digits (8x8 scans, 0..16) of the UCI "Optical Recognition of Handwritten Digits" set
# (CC BY 4.0), the bytes scikit-learn ships as sklearn/datasets/data/digits.csv.gz: one row per scan, 64 pixels
# then the digit. Bundled so that the test venv needs no scikit-learn (the trainer image has none; with it
# installed, every Ray worker of the tests imported it through transformers: ~1 s each).
DIGITS_FILE = Path(__file__).resolve().parent / "data" / "digits.csv.gz"


def digits():
    """(images, targets): the scans as an (n, 8, 8) float array and their digits, as load_digits() gives them."""
    import numpy as np

    table = np.loadtxt(DIGITS_FILE, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def rows(n_rows: int, seed: int = 0) -> list[dict]:
    """``n_rows`` product rows, deterministic for a seed."""
    import numpy as np

    images, targets = digits()
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(images), size=n_rows, replace=n_rows > len(images))
    categories = list(CATEGORIES)
    out = []
    for i, idx in enumerate(picks):
        label = int(targets[idx])
        word = DIGIT_WORDS[label]
        category = categories[int(rng.integers(len(categories)))]
        name_pattern, use = CATEGORIES[category]
        out.append(
            {
                "Product Name": name_pattern.format(word=word.capitalize()),
                "Category": category,
                "image": {"bytes": _png(images[idx], IMAGE_SIDE), "path": f"digit-{i:05d}.png"},
                "description": f"The number {word} in bold handwriting, {use}.",
            }
        )
    return out


def build_sample_dataset(out_dir: Path, n_rows: int = 240, seed: int = 0) -> Path:
    """Write ``n_rows`` rows to ``out_dir/products.parquet`` (HF ``datasets`` Image feature) and return it."""
    from datasets import Dataset, Features, Image, Value

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "products.parquet"
    features = Features(
        {
            "Product Name": Value("string"),
            "Category": Value("string"),
            "image": Image(),
            "description": Value("string"),
        }
    )
    data = rows(n_rows, seed)
    ds = Dataset.from_list(data, features=features)
    tmp = target.with_suffix(".parquet.tmp")
    ds.to_parquet(str(tmp))
    tmp.rename(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("--n_rows", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_sample_dataset(args.out_dir, args.n_rows, args.seed))


if __name__ == "__main__":
    main()
