"""The demo's and the tests' sample rows come from the bundled digit scans (localkit/data/digits.csv.gz), with no
scikit-learn: the same 1,797 scans load_digits() gives, deterministic rows for a seed."""

from __future__ import annotations

import hashlib

import numpy as np

from localkit import sample_data

# sha256 of sklearn/datasets/data/digits.csv.gz (scikit-learn 1.x), the file bundled here.
DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"


def test_the_bundled_scans_are_load_digits_bytes() -> None:
    assert hashlib.sha256(sample_data.DIGITS_FILE.read_bytes()).hexdigest() == DIGITS_SHA256
    images, targets = sample_data.digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.float64
    assert (images.min(), images.max()) == (0.0, 16.0)
    assert np.bincount(targets).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_rows_are_deterministic_and_name_the_digit_shown() -> None:
    a, b = sample_data.rows(12, seed=3), sample_data.rows(12, seed=3)
    assert a == b and a != sample_data.rows(12, seed=4)
    assert all(r["image"]["bytes"].startswith(b"\x89PNG") for r in a)
    assert all(r["description"].startswith("The number ") for r in a)

