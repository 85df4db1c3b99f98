"""The one colour map of every attention view: viridis (colour-blind safe, readable in grey) on a square-root
scale, so small weights stay visible. The terminal, the HTML pages and the PNGs (matplotlib's own viridis
with `PowerNorm(0.5)`) all draw weights with it; a test holds these stops equal to matplotlib's."""

from __future__ import annotations

import math

# matplotlib's viridis at 0, 1/16, ..., 1 (0-255 RGB); colours between stops are interpolated linearly
VIRIDIS: tuple[tuple[int, int, int], ...] = (
    (68, 1, 84), (72, 24, 106), (71, 45, 123), (66, 64, 134), (59, 82, 139), (51, 99, 141), (44, 114, 142), (38, 130, 142), (33, 145, 140),
    (31, 160, 136), (40, 174, 128), (63, 188, 115), (94, 201, 98), (132, 212, 75), (173, 220, 48), (216, 226, 25), (253, 231, 37),
)  # fmt: skip
MASKED = (238, 238, 238)  # keys a causal query may not see


def rgb(weight: float) -> tuple[int, int, int]:
    """The colour of an attention weight (or probability) in 0..1, on the square-root scale.

    Example: rgb(0.0) -> (68, 1, 84); rgb(1.0) -> (253, 231, 37); rgb(0.25) is the middle stop (33, 145, 140)
    """
    v = min(max(math.sqrt(max(weight, 0.0)), 0.0), 1.0) * (len(VIRIDIS) - 1)
    i = min(int(v), len(VIRIDIS) - 2)
    f = v - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(VIRIDIS[i], VIRIDIS[i + 1]))
    return r, g, b


def css(weight: float) -> str:
    """rgb(weight) as a CSS (and rich) colour. Example: css(1.0) -> 'rgb(253,231,37)'"""
    return "rgb({},{},{})".format(*rgb(weight))


def dark(weight: float) -> bool:
    """Whether text on rgb(weight) should be white (viridis' dark end)."""
    return math.sqrt(max(weight, 0.0)) < 0.6
