"""ImageDecoder: decode an encoded image (PNG, JPEG, BMP, TIFF, WebP, PNM...) with Pillow.

Pillow is an optional dependency, imported when the first image is decoded; without it the
node fails with a message saying how to install it. As the spec says, a stream that cannot be
decoded gives an empty image rather than an error.
"""

from __future__ import annotations

import io

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError, ModelError

__all__ = ["image_decoder"]

_MODES = {"RGB": ("RGB", 3), "BGR": ("RGB", 3), "Grayscale": ("L", 1)}


@kernel("ImageDecoder", since=20)
def image_decoder(encoded: np.ndarray, *, pixel_format: str = "RGB") -> np.ndarray:
    if pixel_format not in _MODES:
        raise ModelError(
            f"ImageDecoder: pixel_format must be RGB, BGR or Grayscale, got {pixel_format!r}"
        )
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise KernelError(
            "ImageDecoder needs Pillow, an optional dependency: pip install Pillow"
        ) from None
    mode, channels = _MODES[pixel_format]
    data = np.asarray(encoded, dtype=np.uint8).tobytes()
    try:
        with Image.open(io.BytesIO(data)) as img:
            pixels = np.asarray(img.convert(mode), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError):
        return np.zeros((0, 0, channels), dtype=np.uint8)
    if channels == 1:
        pixels = pixels[..., None]
    elif pixel_format == "BGR":
        pixels = pixels[..., ::-1]
    return np.ascontiguousarray(pixels)
