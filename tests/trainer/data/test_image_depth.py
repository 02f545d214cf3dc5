"""16-bit images are scaled to 8 bits, not clipped (#21): grayscale I;16 (PNG) and I;16B (TIFF), and 16-bit
RGB (a PNG written here byte by byte), each decoded as the collator and the scan do and compared with an
independent conversion: the high byte of every 16-bit sample (numpy `>> 8`)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from trainer.data.dataset import decode_image

SIDE = 64
# A ramp over the whole 16-bit range: clipped to 255 (as before #21) nearly every pixel is white.
RAMP = (np.arange(SIDE * SIDE, dtype=np.uint32).reshape(SIDE, SIDE) * 65535 // (SIDE * SIDE - 1)).astype(np.uint16)


def encoded(mode: str, fmt: str) -> bytes:
    dtype = ">u2" if mode == "I;16B" else "<u2"
    out = io.BytesIO()
    Image.frombytes(mode, (SIDE, SIDE), RAMP.astype(dtype).tobytes()).save(out, format=fmt)
    return out.getvalue()


def png_rgb16(rgb: np.ndarray) -> bytes:
    """A 16-bit-per-channel RGB PNG, written from the spec (IHDR bit depth 16, colour type 2, filter 0)."""
    height, width, _ = rgb.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + rgb[y].astype(">u2").tobytes() for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@pytest.mark.parametrize(("mode", "fmt"), [("I;16", "PNG"), ("I;16B", "TIFF")])
def test_16_bit_grayscale_is_scaled_to_8_bits(mode: str, fmt: str) -> None:
    data = encoded(mode, fmt)
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode.startswith("I;16"), im.mode  # what PIL opens: a 16-bit mode
    got = np.asarray(decode_image(data))
    expected = (RAMP >> 8).astype(np.uint8)
    assert got.shape == (SIDE, SIDE, 3)
    for channel in range(3):
        assert np.array_equal(got[..., channel], expected)
    assert abs(got.mean() - 127.5) < 1  # clipped it was ~254 (99% of the pixels 255)


def test_16_bit_rgb_is_scaled_to_8_bits() -> None:
    rgb = np.stack([RAMP, RAMP // 3, 65535 - RAMP], axis=-1)
    got = np.asarray(decode_image(png_rgb16(rgb)))
    assert np.array_equal(got, (rgb >> 8).astype(np.uint8))
