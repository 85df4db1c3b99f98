"""Attention as PNG images with matplotlib (the Agg canvas, no display, imported only when drawing):
a labelled heatmap per head, a grid of small maps, or one token's attention per head.

Token labels are text, not mathtext: every `$` is escaped, and control characters were already escaped
by `tokenizer.show.visible`. Labels are never cut: a token is written whole (rotated on the key axis, or
smaller in a tight cell), titles wrap to the figure's width, and the constrained layout makes room for
them. Colour is viridis on a square-root scale (small weights stay visible), the one map of every view
(`palette`), with a colour bar on every picture; masked cells (exactly 0) are light grey.
"""

from __future__ import annotations

import io
import math
import textwrap
import warnings
from collections.abc import Sequence

import numpy as np

MASKED = "#eeeeee"


def tick_text(text: str) -> str:
    """A token as a label, whole: a blank one as ␣ per character. Example: tick_text("  ") -> "␣␣" """
    if not text.strip():
        text = "␣" * max(len(text), 1)
    return text.replace("$", r"\$")  # a pair of $ would start mathtext


def _title(text: str, width_inches: float, fontsize: float) -> str:
    """`text` wrapped to lines that fit `width_inches` at `fontsize` (about 0.6 em a character), never cut."""
    per_line = max(20, int(width_inches * 72 / (fontsize * 0.62)))
    return "\n".join(textwrap.wrap(text.replace("$", r"\$"), per_line, break_long_words=True, replace_whitespace=False) or [""])


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
    set_ticks(positions, labels=[tick_text(labels[i]) for i in positions], fontsize=fontsize, rotation=90 if rotate else 0)


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
        figure.suptitle(_title(suptitle, figure.get_figwidth() - 0.3, 11), fontsize=11)


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
        ax.set_title(_title(title, side - 1.0, 10), fontsize=10)
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
        ax.set_title(_title(title, cell, 8), fontsize=8)
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
        ax.set_title(_title(title, width - 1.5, 10), fontsize=10)
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


BAND = 16  # positions per band of a wide grid: a long text's logit lens is stacked bands, not one strip


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
    label in each cell (the logit lens's tokens; else the value), whole: smaller where it is long. More
    than BAND columns are laid out as bands of BAND stacked down the page, so the picture keeps a page's
    shape. Probabilities on viridis (square-root scale), signed values (`diverging`) on a red-blue scale
    centred on 0; one colour bar for all bands."""
    from matplotlib.colors import TwoSlopeNorm

    R, C = values.shape
    bands = [(start, min(C, start + BAND)) for start in range(0, C, BAND)] if C > BAND and R <= 64 else [(0, C)]
    column_width = 0.85 if texts is not None else 0.6
    shown = min(C, BAND) if len(bands) > 1 else C
    width = max(5.0, 2.4 + shown * column_width) if len(bands) > 1 or C <= 64 else min(40.0, 2.0 + C * 0.2)
    label_room = max((len(tick_text(c)) for c in columns), default=1) * 0.07 + 0.6  # rotated key labels below each band
    band_height = 0.5 + R * 0.32 + label_room
    figure = _figure(width, min(60.0, 1.0 + band_height * len(bands)))
    axes = figure.subplots(len(bands), 1, squeeze=False)[:, 0]
    if diverging:
        limit = float(np.nanmax(np.abs(values))) or 1.0
        norm, cmap = TwoSlopeNorm(vcenter=0.0, vmin=-limit, vmax=limit), "RdBu_r"
    else:
        norm, cmap = _norm(), _cmap()
    image = None
    for ax, (first, last) in zip(axes, bands):
        part = values[:, first:last]
        image = ax.imshow(part, cmap=cmap, norm=norm, interpolation="nearest", aspect="auto", extent=(first - 0.5, last - 0.5, R - 0.5, -0.5))
        fontsize = 8 if C <= 40 or len(bands) > 1 else 6
        if last - first <= 64 and R <= 64:
            for r in range(R):
                for c in range(first, last):
                    label = tick_text(texts[r][c]) if texts is not None else f"{values[r, c]:.2f}"
                    size = min(fontsize, column_width * 72 / (0.62 * max(len(label), 1)))  # a long token: smaller, whole
                    shade = float(norm(values[r, c]))
                    dark = abs(shade - 0.5) > 0.3 if diverging else shade < 0.6  # a strong red or blue, or viridis' dark end
                    ax.text(c, r, label, ha="center", va="center", fontsize=size, color="white" if dark else "black")
        ax.set_yticks(range(R), labels=[tick_text(r) for r in rows], fontsize=9)
        step = 1 if len(bands) > 1 else max(1, math.ceil((last - first) / 80))
        ax.set_xticks(range(first, last, step), labels=[tick_text(columns[c]) for c in range(first, last, step)], fontsize=fontsize, rotation=90)
        ax.set_xlim(first - 0.5, first - 0.5 + max(last - first, shown if len(bands) > 1 else 0))
        ax.set_ylabel(ylabel, fontsize=9)
        ax.tick_params(length=0)
    axes[-1].set_xlabel(xlabel + (f" (positions {BAND} to a band)" if len(bands) > 1 else ""), fontsize=9)
    figure.colorbar(image, ax=list(axes), shrink=0.8 if len(bands) == 1 else 0.4, label=colour_label)
    figure.suptitle(_title(title, width - 0.3, 11), fontsize=11)
    return _save(figure, 110)


def scatter_png(points: np.ndarray, labels: Sequence[str], title: str = "", axis_titles: tuple[str, str] = ("", "")) -> bytes:
    """Labelled points (n, 2): a map of tokens (inspect-embeddings --map)."""
    figure = _figure(8.0, 7.0)
    ax = figure.subplots()
    ax.scatter(points[:, 0], points[:, 1], s=14, color="#3b6ea8", alpha=0.8)
    fontsize = 9 if len(labels) <= 60 else 7 if len(labels) <= 150 else 5
    for (x, y), label in zip(points, labels):
        ax.annotate(tick_text(label), (x, y), xytext=(3, 3), textcoords="offset points", fontsize=fontsize)
    ax.set_xlabel(axis_titles[0])
    ax.set_ylabel(axis_titles[1])
    ax.grid(True, color="#eeeeee")
    _suptitle(figure, title)
    return _save(figure, dpi=120)
