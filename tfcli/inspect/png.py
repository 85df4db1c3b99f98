"""Attention as PNG images with matplotlib (the Agg canvas, no display, imported only when drawing):
a labelled heatmap per head, a grid of small maps, or one token's attention per head.

Token labels are text, not mathtext: every `$` is escaped, and control characters were already escaped
by `tokenizer.show.visible`. Colour is viridis on a square-root scale (small weights stay visible); masked
cells (exactly 0) are light grey.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence

import numpy as np

MASKED = "#eeeeee"


def _label(text: str, limit: int = 16) -> str:
    if not text.strip():
        text = "␣" * max(len(text), 1)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("$", r"\$")  # a pair of $ would start mathtext


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _norm():
    from matplotlib.colors import PowerNorm

    return PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)


def _cmap():
    import matplotlib

    return matplotlib.colormaps["viridis"].with_extremes(bad=MASKED)


def _ticks(set_ticks, labels: Sequence[str], rotate: bool, fontsize: float) -> None:
    """Label every position, or every k-th when there are more than 80."""
    step = max(1, math.ceil(len(labels) / 80))
    positions = list(range(0, len(labels), step))
    set_ticks(positions, labels=[_label(labels[i]) for i in positions], fontsize=fontsize, rotation=90 if rotate else 0)


def _save(figure, dpi: int) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a glyph missing from the font (an emoji) is drawn as a box
        figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def _weights_image(ax, weights: np.ndarray, aspect: str):
    """Attention weights as an image on `ax`: zeros (masked or never attended) left blank."""
    return ax.imshow(np.ma.masked_equal(weights, 0.0), cmap=_cmap(), norm=_norm(), interpolation="nearest", aspect=aspect)


def _suptitle(figure, suptitle: str) -> None:
    if suptitle:
        figure.suptitle(_label(suptitle, 160), fontsize=11)


def heatmaps_png(items: Sequence[tuple[str, np.ndarray, Sequence[str], Sequence[str]]], suptitle: str = "") -> bytes:
    """One labelled heatmap per item (title, weights (T, S), query labels, key labels), side by side."""
    n = max(max(w.shape) for _, w, _, _ in items)
    side = min(14.0, max(4.5, 1.6 + n * 0.2))
    fontsize = 9 if n <= 40 else 7 if n <= 70 else 6
    figure = _figure(side * len(items) + 1.0, side + (0.4 if suptitle else 0))
    axes = figure.subplots(1, len(items), squeeze=False)[0]
    image = None
    for ax, (title, weights, queries, keys) in zip(axes, items):
        image = _weights_image(ax, weights, "equal")
        ax.set_title(_label(title, 120), fontsize=10)
        _ticks(ax.set_yticks, queries, False, fontsize)
        _ticks(ax.set_xticks, keys, True, fontsize)
        ax.set_xlabel("key (attended to)", fontsize=9)
        ax.set_ylabel("query (attending)", fontsize=9)
        ax.tick_params(length=0)
    figure.colorbar(image, ax=list(axes), shrink=0.6, label="attention weight")
    _suptitle(figure, suptitle)
    return _save(figure, 110 if n <= 60 else 130)


def grid_png(maps: Sequence[tuple[str, np.ndarray]], columns: int, suptitle: str = "") -> bytes:
    """Small unlabelled maps (title, weights (T, S)) in a grid `columns` wide."""
    rows = math.ceil(len(maps) / columns)
    cell = 1.9 if columns <= 8 else 1.4
    figure = _figure(columns * cell + 1.2, rows * (cell + 0.25) + (0.5 if suptitle else 0))
    axes = figure.subplots(rows, columns, squeeze=False)
    image = None
    for index, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if index >= len(maps):
            ax.set_axis_off()
            continue
        title, weights = maps[index]
        image = _weights_image(ax, weights, "equal")
        ax.set_title(_label(title, 40), fontsize=8)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.5, label="attention weight")
    _suptitle(figure, suptitle)
    return _save(figure, 110)


def token_png(items: Sequence[tuple[str, np.ndarray, Sequence[str], Sequence[str]]], suptitle: str = "") -> bytes:
    """Where one token looks: per item (title, weights (heads, keys), head labels, key labels) a strip per
    head across the keys, its values printed in the cells when they fit."""
    n_keys = max(w.shape[1] for _, w, _, _ in items)
    n_rows = max(w.shape[0] for _, w, _, _ in items)
    width = min(16.0, max(5.0, 1.8 + n_keys * 0.32))
    height = min(14.0, max(2.2, 1.4 + n_rows * 0.32))
    fontsize = 9 if n_keys <= 30 else 7 if n_keys <= 60 else 6
    figure = _figure(width, height * len(items) + (0.4 if suptitle else 0))
    axes = figure.subplots(len(items), 1, squeeze=False)[:, 0]
    image = None
    for ax, (title, weights, heads, keys) in zip(axes, items):
        image = _weights_image(ax, weights, "auto")
        ax.set_title(_label(title, 120), fontsize=10)
        _ticks(ax.set_yticks, heads, False, fontsize)
        _ticks(ax.set_xticks, keys, True, fontsize)
        ax.tick_params(length=0)
        if n_keys <= 40 and n_rows <= 24:
            for (r, k), w in np.ndenumerate(weights):
                if w >= 0.05:
                    ax.text(k, r, f"{w:.2f}"[1:] if w < 1 else "1", ha="center", va="center", fontsize=6, color="black" if w > 0.3 else "white")
    figure.colorbar(image, ax=list(axes), shrink=0.8, label="attention weight")
    _suptitle(figure, suptitle)
    return _save(figure, 110)


def value_grid_png(
    title: str,
    values: np.ndarray,
    rows: Sequence[str],
    columns: Sequence[str],
    *,
    texts: Sequence[Sequence[str]] | None = None,
    diverging: bool = False,
    colour_label: str = "",
    ylabel: str = "",
    xlabel: str = "",
) -> bytes:
    """A labelled grid of values (rows, columns): layers x positions or layers x heads. `texts` writes a
    label in each cell (the logit lens's tokens; else the value). Probabilities on viridis (square-root
    scale), signed values (`diverging`) on a red-blue scale centred on 0."""
    from matplotlib.colors import TwoSlopeNorm

    R, C = values.shape
    width = min(40.0, max(5.0, 2.0 + C * (0.75 if texts is not None else 0.55)))
    height = min(30.0, max(2.5, 1.6 + R * 0.45))
    figure = _figure(width, height)
    ax = figure.subplots()
    if diverging:
        limit = float(np.nanmax(np.abs(values))) or 1.0
        norm, cmap = TwoSlopeNorm(vcenter=0.0, vmin=-limit, vmax=limit), "RdBu_r"
    else:
        norm, cmap = _norm(), _cmap()
    image = ax.imshow(values, cmap=cmap, norm=norm, interpolation="nearest", aspect="auto")
    fontsize = 8 if C <= 40 else 6
    if C <= 64 and R <= 64:
        for r in range(R):
            for c in range(C):
                label = _label(texts[r][c], 8) if texts is not None else f"{values[r, c]:.2f}"
                shade = float(norm(values[r, c]))
                dark = abs(shade - 0.5) > 0.3 if diverging else shade < 0.6  # a strong red or blue, or viridis' dark end
                ax.text(c, r, label, ha="center", va="center", fontsize=fontsize, color="white" if dark else "black")
    _ticks(ax.set_yticks, list(rows), False, 9)
    _ticks(ax.set_xticks, list(columns), True, fontsize)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(length=0)
    figure.colorbar(image, ax=ax, shrink=0.8, label=colour_label)
    figure.suptitle(_label(title, 160), fontsize=11)
    return _save(figure, 110)


def scatter_png(points: np.ndarray, labels: Sequence[str], title: str = "", axis_titles: tuple[str, str] = ("", "")) -> bytes:
    """Labelled points (n, 2): a map of tokens (inspect-embeddings --map)."""
    figure = _figure(8.0, 7.0)
    ax = figure.subplots()
    ax.scatter(points[:, 0], points[:, 1], s=14, color="#3b6ea8", alpha=0.8)
    fontsize = 9 if len(labels) <= 60 else 7 if len(labels) <= 150 else 5
    for (x, y), label in zip(points, labels):
        ax.annotate(_label(label, 24), (x, y), xytext=(3, 3), textcoords="offset points", fontsize=fontsize)
    ax.set_xlabel(axis_titles[0])
    ax.set_ylabel(axis_titles[1])
    ax.grid(True, color="#eeeeee")
    _suptitle(figure, title)
    return _save(figure, dpi=120)
