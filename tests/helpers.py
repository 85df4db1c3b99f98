"""Helpers the tests share that the library has no use for."""

from __future__ import annotations

import base64
import zlib

import numpy as np


def unpack_weights(data: list[str], shape: tuple[int, int, int, int], causal: bool) -> np.ndarray:
    """The inverse of `tfcli.inspect.html.pack_weights` (what the page does): float32 [L, H, T, S]."""
    _, H, T, S = shape
    out = np.zeros(shape, dtype=np.float32)
    rows, cols = np.tril_indices(T)
    for layer, chunk in enumerate(data):
        raw = np.frombuffer(zlib.decompress(base64.b64decode(chunk)), dtype=np.uint8).astype(np.float32) / 255.0
        raw = raw * raw
        if causal and T == S:
            out[layer][:, rows, cols] = raw.reshape(H, -1)
        else:
            out[layer] = raw.reshape(H, T, S)
    return out
