"""A map of tokens (`inspect-embeddings --map`) for people to look at: a PNG (matplotlib), a self-contained
HTML page (an SVG whose points name their token on hover) and a scatter of characters for a terminal."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from tfcli.inspect.png import scatter_png

PAGE_SIZE = 640  # the SVG's side in pixels
MARGIN = 40


def map_png(points: np.ndarray, labels: Sequence[str], title: str, share: np.ndarray) -> bytes:
    return scatter_png(points, labels, title, (f"PC1 ({share[0]:.0%} of the variance)", f"PC2 ({share[1]:.0%})"))


def _scaled(points: np.ndarray, low: float, high: float) -> np.ndarray:
    """Each axis stretched onto [low, high] (a flat axis sits in the middle)."""
    lo, hi = points.min(0), points.max(0)
    span = np.where(hi > lo, hi - lo, 1.0)
    unit = np.where(hi > lo, (points - lo) / span, 0.5)
    return low + unit * (high - low)


def map_html(points: np.ndarray, labels: Sequence[str], title: str, share: np.ndarray) -> str:
    """One page, no scripts or outside files: each point a circle with its token as a <title> (the hover
    label) and as text beside it. Every label is escaped: token text is data, never markup."""
    xy = _scaled(points, MARGIN, PAGE_SIZE - MARGIN)
    xy[:, 1] = PAGE_SIZE - xy[:, 1]  # SVG's y grows downwards
    marks = []
    for (x, y), label, (px, py) in zip(xy, labels, points):
        text = html.escape(label, quote=True)
        marks.append(
            f'<g class="p"><title>{text} ({px:.3f}, {py:.3f})</title><circle cx="{x:.1f}" cy="{y:.1f}" r="4"/>'
            f'<text x="{x + 6:.1f}" y="{y - 4:.1f}">{text}</text></g>'
        )
    heading = html.escape(title, quote=True)
    axes = html.escape(f"PC1 ({share[0]:.0%} of the variance) across, PC2 ({share[1]:.0%}) up", quote=True)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>'
        + heading
        + "</title><style>body{font-family:system-ui,sans-serif;margin:1.5em}svg{border:1px solid #ddd;background:#fff}"
        "circle{fill:#3b6ea8;opacity:.8}text{font-size:11px;fill:#333}g.p:hover circle{fill:#d9480f;opacity:1}"
        'g.p:hover text{font-weight:bold;fill:#d9480f}</style></head><body>\n<h1 style="font-size:1.1em">'
        + heading
        + f"</h1><p>{axes}; hover a point for its token.</p>\n"
        + f'<svg xmlns="http://www.w3.org/2000/svg" width="{PAGE_SIZE}" height="{PAGE_SIZE}" viewBox="0 0 {PAGE_SIZE} {PAGE_SIZE}">'
        + "".join(marks)
        + "</svg>\n</body></html>\n"
    )


def map_text(points: np.ndarray, labels: Sequence[str], width: int = 80, height: int = 24) -> list[str]:
    """The map as lines of characters: each token's label written at its point (or a line or two off it),
    left to right; a label with no room is shown as a dot. Example: two points far apart -> their labels in opposite corners."""
    width, height = max(width, 20), max(height, 6)
    grid = [[" "] * width for _ in range(height)]
    xy = _scaled(points, 0, 1)
    order = np.argsort(xy[:, 0], kind="stable")
    for i in order:
        label = (labels[i].strip() or "·")[:width]
        column = int(round(xy[i, 0] * (width - 1)))
        row = int(round((1 - xy[i, 1]) * (height - 1)))
        start = min(column, width - len(label))
        for near in (row, row - 1, row + 1, row - 2, row + 2):  # the label may sit a line or two off its point
            if 0 <= near < height and all(c == " " for c in grid[near][start : start + len(label)]):
                grid[near][start : start + len(label)] = list(label)
                break
        else:
            if grid[row][column] == " ":
                grid[row][column] = "·"
    return ["".join(line).rstrip() for line in grid]
