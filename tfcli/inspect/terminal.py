"""Attention for a terminal, drawn with rich: one head as a labelled heatmap, many heads as a grid of small
maps, one token's attention as bars per head, a head summary and a "which heads changed" table.

Everything is built to a given width (80 columns is the design point) and every piece of token text goes
through `rich.text.Text`, so markup in a token prints as itself and control characters are already escaped
by `tokenizer.show.visible`. Long texts are windowed (one head) or aggregated into bins (a grid), and the
output says so. About 400 lines because every view here shares the colour scale, the windowing and the
label fitting above; split apart, each part would import the others'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from rich.cells import cell_len, set_cell_size
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tfcli.errors import TfcliError
from tfcli.inspect import palette
from tfcli.inspect.labels import kind_label
from tfcli.inspect.stats import HeadChange, HeadSummary

# Shade by the weight, drawn on a colour scale (viridis); with colour off the characters still tell.
SHADES = ((0.01, "·"), (0.12, "░"), (0.36, "▒"), (0.72, "▓"), (1.01, "█"))
LEGEND = "· <1%  ░ <12%  ▒ <36%  ▓ <72%  █ ≥72%  blank: masked"
_BAR_EIGHTHS = " ▏▎▍▌▋▊▉█"


def _colour(w: float) -> str:
    """The views' one colour map (`palette`: viridis on a square-root scale) for weight w."""
    return palette.css(w)


def cell(w: float, cw: int) -> Text:
    """One heatmap cell `cw` columns wide. Example: cell(0.5, 2) -> "▓▓" in a yellow-green; cell(0, 2) -> "  " """
    if w <= 0.0:
        return Text(" " * cw)
    char = next(c for limit, c in SHADES if w < limit)
    if char == "·":
        return Text("·".ljust(cw), style="dim")
    return Text(char * cw, style=_colour(w))


def _short(label: str) -> str:
    """A token's label for tight places: surrounding spaces dropped; a blank token shows as ␣."""
    stripped = label.strip()
    return stripped if stripped else "␣"


def fit(label: str, width: int, *, right: bool = False) -> str:
    """Crop or pad `label` to exactly `width` terminal cells (… marks a crop)."""
    if cell_len(label) > width:
        label = set_cell_size(label, max(width - 1, 0)) + "…" if width > 1 else set_cell_size(label, width)
    pad = width - cell_len(label)
    return " " * pad + label if right else label + " " * pad


def _column_chars(label: str, depth: int, cw: int) -> list[str]:
    """A column label written downwards: `depth` pieces, each exactly `cw` cells."""
    out = []
    for ch in list(_short(label))[:depth]:
        width = cell_len(ch)
        if width == 0:
            ch = "◌"
        elif width > cw:
            ch = "▪"
        out.append(ch + " " * (cw - cell_len(ch)))
    return out + [" " * cw] * (depth - len(out))


def heatmap(
    weights: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str],
    *,
    width: int = 80,
    start: int = 0,
    key_start: int = 0,
    self_attention: bool = True,
    causal: bool = False,
    label_depth: int = 4,
) -> tuple[Text, str | None]:
    """One head's weights (T, S) as rows of queries over columns of keys, labels on both axes.

    Returns the drawing and, when the text did not fit, a note saying which window is shown. The window
    starts at query `start` and at that key for self-attention, at key `key_start` for cross-attention
    (whose keys are another text); a "…" column sums the weight that falls on keys outside the window,
    so every row still accounts for all of its attention.
    """
    T, S = weights.shape
    lw = min(12, max(3, max(cell_len(_short(q)) for q in queries) if queries else 3))
    cw = 2
    room = max(width - lw - 1, 4)
    if room // cw < min(S, 6):
        cw = 1
    n_keys = room // cw
    n_keys = min(S, n_keys) if S <= n_keys else n_keys - 2  # keep room for the "…" columns
    n_keys = max(n_keys, 1)
    start = max(0, min(start, T - 1))
    n_rows = min(T - start, max(n_keys, 1))
    q0, q1 = start, start + n_rows
    k0 = min(start if self_attention else key_start, max(S - n_keys, 0))
    k1 = min(S, k0 + n_keys)
    before, after = k0 > 0, k1 < S and not (causal and q1 <= k1)  # causal: keys after the last query are masked
    lines: list[Text] = []
    columns = ([("…", None)] if before else []) + [(keys[k], k) for k in range(k0, k1)] + ([("…", None)] if after else [])
    depth = min(label_depth, max(len(_short(label)) for label, _ in columns))
    stacks = [_column_chars(label, depth, cw) for label, _ in columns]
    for row in range(depth):
        line = Text(" " * (lw + 1))
        for stack, (_, k) in zip(stacks, columns):
            line.append(stack[row], style="bold" if k is None else "")
        lines.append(line)
    for q in range(q0, q1):
        line = Text(fit(_short(queries[q]), lw, right=True) + " ")
        row_weights = weights[q]
        if before:
            line.append_text(cell(float(row_weights[:k0].sum()), cw))
        for k in range(k0, k1):
            line.append_text(cell(float(row_weights[k]), cw))
        if after:
            line.append_text(cell(float(row_weights[k1:].sum()), cw))
        lines.append(line)
    note = None
    if (q0, q1) != (0, T) or (k0, k1) != (0, S):
        what = f"queries {q0}-{q1 - 1}" + (f" and keys {k0}-{k1 - 1}" if (k0, k1) != (0, S) else "")
        more = f"--start {q1} for more" if q1 < T else "the last ones"
        moves = more if self_attention else "--start N moves the rows, --key-start N the columns"
        note = (
            f"{what} of {T} tokens shown"
            + (f" ({S} keys)" if S != T else "")
            + f"; {moves}"
            + ("; … sums the weight on keys outside it" if before or after else "")
        )
    return Text("\n").join(lines), note


def aggregate(weights: np.ndarray, bins: int) -> np.ndarray:
    """(T, S) -> (≤bins, ≤bins): query bins averaged, key bins summed, so each row still sums to 1.

    Example: aggregate([[1, 0, 0, 0], [.5, .5, 0, 0], [0, 0, 1, 0], [0, 0, .5, .5]], 2) -> [[1, 0], [0, 1]]
    """
    T, S = weights.shape
    q_edges = np.unique(np.linspace(0, T, min(bins, T) + 1).round().astype(int))
    k_edges = np.unique(np.linspace(0, S, min(bins, S) + 1).round().astype(int))
    summed = np.add.reduceat(np.asarray(weights, dtype=np.float64), k_edges[:-1], axis=1)  # (T, kb)
    counts = np.diff(q_edges)[:, None]
    return np.add.reduceat(summed, q_edges[:-1], axis=0) / counts  # (qb, kb)


def grid(maps: Sequence[tuple[str, np.ndarray]], *, width: int = 80, bins: int = 12) -> tuple[Group, str | None]:
    """Small maps side by side, each titled (e.g. "L0 H3"), one character per (binned) query and key."""
    if not maps:
        return Group(), None
    T, S = maps[0][1].shape
    binned = [(title, aggregate(w, bins)) for title, w in maps]
    map_w = max(max(w.shape[1] for _, w in binned), max(cell_len(t) for t, _ in binned))
    per_row = max(1, (width + 2) // (map_w + 2))
    rows: list[RenderableType] = []
    for first in range(0, len(binned), per_row):
        chunk = binned[first : first + per_row]
        height = max(w.shape[0] for _, w in chunk)
        lines = [Text() for _ in range(height + 1)]
        for i, (title, w) in enumerate(chunk):
            gap = "  " if i else ""
            lines[0].append(gap + fit(title, map_w), style="bold")
            for r in range(height):
                lines[r + 1].append(gap)
                for k in range(map_w):
                    lines[r + 1].append_text(cell(float(w[r, k]), 1) if r < w.shape[0] and k < w.shape[1] else Text(" "))
        rows.append(Text("\n").join(lines))
    note = "each map: queries down, keys across"
    if max(T, S) > bins:
        qb, kb = binned[0][1].shape
        sizes = f"{T} tokens aggregated into {qb} bins" if T == S else f"{T} queries aggregated into {qb} bins and {S} keys into {kb}"
        note += f"; {sizes} (queries averaged, keys summed)"
    return Group(*rows), note


def _bar(fraction: float, width: int) -> str:
    eighths = round(max(0.0, min(fraction, 1.0)) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (_BAR_EIGHTHS[part] if part else "")).ljust(width)


def token_bars(rows: Sequence[tuple[str, np.ndarray]], keys: Sequence[str], *, width: int = 80, top: int = 3, upto: int | None = None) -> Group:
    """Where one token looks: for each head (title, its weights over the keys), the `top` keys with bars;
    only keys 0..upto for causal attention (the later ones are masked)."""
    keys = keys if upto is None else keys[: upto + 1]
    rows = [(title, row[: len(keys)]) for title, row in rows]
    top = min(top, len(keys))
    title_w = max(cell_len(t) for t, _ in rows) + 1
    value_w, label_w = 4, min(10, max(4, max((cell_len(_short(k)) for k in keys), default=4)))
    top = max(1, min(top, (width - title_w) // (label_w + value_w + 6)))  # each slot: label, bar of 3+, value
    slot = (width - title_w) // top
    bar_w = max(slot - label_w - value_w - 3, 1)
    lines = []
    for title, row in rows:
        line = Text(fit(title, title_w), style="bold")
        best = np.argsort(-row, kind="stable")[:top]
        for k in best:
            w = float(row[k])
            line.append(fit(_short(keys[k]), label_w, right=True) + " ")
            line.append(_bar(w, bar_w), style=_colour(w))
            line.append(f" {w:.2f}"[: value_w + 1].rjust(value_w + 1) + " ")
        lines.append(line)
    return Group(*lines)


def token_distribution(row: np.ndarray, keys: Sequence[str], *, width: int = 80, limit: int = 40, upto: int | None = None) -> tuple[Group, str | None]:
    """One head, one token: a bar for every key it can see (keys 0..upto for causal attention), scaled to
    the largest weight; the `limit` heaviest, in text order, when there are more."""
    n = len(keys) if upto is None else upto + 1
    shown = list(range(n))
    notes = []
    if n > limit:
        shown = sorted(np.argsort(-row[:n], kind="stable")[:limit].tolist())
        notes.append(f"the {limit} keys it attends to most, of {n}, in text order")
    top = max(float(row[shown].max()), 1e-12)
    notes.append(f"bars scaled to the largest weight ({top:.3f})")
    label_w = min(14, max(cell_len(_short(keys[k])) for k in shown))
    pos_w = len(str(n - 1))
    bar_w = max(width - label_w - pos_w - 9, 5)
    lines = []
    for k in shown:
        w = float(row[k])
        line = Text(f"{k:>{pos_w}} ", style="dim")
        line.append(fit(_short(keys[k]), label_w, right=True) + " ")
        line.append(_bar(w / top, bar_w), style=_colour(w))
        line.append(f" {w:.3f}")
        lines.append(line)
    return Group(*lines), "; ".join(notes)


def side_by_side(left: RenderableType, right: RenderableType, titles: tuple[str, str], width: int) -> Table:
    half = max((width - 3) // 2, 10)
    table = Table.grid(padding=(0, 3))
    table.add_column(width=half, no_wrap=True, overflow="crop")
    table.add_column(width=half, no_wrap=True, overflow="crop")
    table.add_row(Text(fit(titles[0], half), style="bold"), Text(fit(titles[1], half), style="bold"))
    table.add_row(left, right)
    return table


def summary_table(summaries: Sequence[HeadSummary], *, self_attention: bool) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name, justify in (
        ("layer", "right"),
        ("head", "right"),
        ("entropy", "right"),
        ("distance", "right"),
        ("pattern", "left"),
        ("score", "right"),
        ("prev", "right"),
        ("first", "right"),
        ("dup", "right"),
        ("induct", "right"),
    ):
        if not self_attention and name not in ("layer", "head", "entropy"):
            continue
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for s in summaries:
        if not self_attention:
            table.add_row(str(s.layer), str(s.head), f"{s.entropy:.2f}")
            continue
        table.add_row(
            str(s.layer),
            str(s.head),
            f"{s.entropy:.2f}",
            num(s.distance),
            Text(s.pattern, style="dim" if s.pattern == "none" else "bold cyan"),
            num(s.score),
            *(num(s.scores[name]) for name in ("previous-token", "first-token", "duplicate", "induction")),
        )
    return table


def changes_table(changes: Sequence[HeadChange], top: int = 10) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("rank", "layer", "head", "JS divergence (bits)", "total variation"):
        table.add_column(name, justify="right")
    for rank, c in enumerate(changes[:top], 1):
        table.add_row(str(rank), str(c.layer), str(c.head), f"{c.js:.4f}", f"{c.l1:.4f}")
    return table


def render_inspection(inspection, *, width: int = 80, start: int = 0, key_start: int = 0) -> list[RenderableType]:
    """Everything the terminal view prints for an `Inspection` (see session.py), top to bottom."""
    first = inspection.first
    notes = list(inspection.notes)
    pairs = [(layer, head) for layer in inspection.layers for head in inspection.heads]
    _check_window(inspection, start, key_start)
    single_map = len(pairs) == 1 and inspection.focus is None and inspection.summaries is None
    if (start or key_start) and not single_map:
        notes.append("--start and --key-start move a single head's map; they change nothing here")
    out: list[RenderableType] = [_header(first)]
    compare = len(inspection.captures) == 2
    out.extend(_head_tables(inspection, compare, notes))
    if inspection.summaries is not None and inspection.focus is None:
        out.extend(Text(note, style="dim") for note in notes)
        return out

    panel_width = width if not compare else max((width - 3) // 2, 10)
    panels: list[RenderableType] = []
    for index, capture in enumerate(inspection.captures):
        focus = None if inspection.focus is None else inspection.focus[index]
        panel, note = _panel(capture, pairs, focus, panel_width, compare, start, key_start)
        panels.append(panel)
        if note and note not in notes:
            notes.append(note)
    if inspection.focus_note:
        notes.append(f"--token: {inspection.focus_note}")
    if compare:
        out.append(side_by_side(panels[0], panels[1], (inspection.titles[0], inspection.titles[1]), width))
    else:
        out.extend(panels)
    if inspection.focus is None:  # the maps' legend; a token's view has none
        notes.append(LEGEND)
    if len(pairs) == 1 and first.n_heads > 1 and inspection.focus is None:
        notes.append(f"--layer 0..{first.n_layers - 1} and --head 0..{first.n_heads - 1} pick another; --head all shows every head")
    out.extend(Text(note, style="dim") for note in notes)
    return out


def _check_window(inspection, start: int, key_start: int) -> None:
    """--start and --key-start must fall inside the texts (--key-start: only a cross-attention map has one)."""
    first = inspection.first
    shortest = min(len(c.queries) for c in inspection.captures)
    if start >= shortest:
        raise TfcliError(f"--start {start} is past the last token (position {shortest - 1})", hint=f"pass 0 to {shortest - 1}")
    if key_start and first.self_attention:
        raise TfcliError("--key-start moves the columns of a cross-attention map", hint="self-attention's window moves with --start")
    if key_start >= len(first.keys):
        raise TfcliError(f"--key-start {key_start} is past the last source token (position {len(first.keys) - 1})", hint=f"pass 0 to {len(first.keys) - 1}")


def _header(first) -> Text:
    header = Text(f"{kind_label(first)} · {first.n_layers} layers × {first.n_heads} heads · {len(first.queries)} tokens", style="bold")
    if not first.self_attention:
        header.append(f" over {len(first.keys)} source tokens", style="bold")
    return header


def _head_tables(inspection, compare: bool, notes: list[str]) -> list[RenderableType]:
    """The tables over heads: the heads that changed most (--compare-step), the head summaries (--summary)."""
    first = inspection.first
    out: list[RenderableType] = []
    if inspection.changes is not None:
        out.append(Text("heads that changed most (mean over queries of the Jensen-Shannon divergence):", style="bold"))
        out.append(changes_table(inspection.changes))
    if inspection.summaries is not None:
        for summaries, title in zip(inspection.summaries, inspection.titles):
            if compare:
                out.append(Text(title, style="bold"))
            out.append(summary_table(summaries, self_attention=first.self_attention))
        if first.self_attention:
            notes.append(
                "entropy in bits; distance in tokens; previous-token and first-token scored on this text, "
                "duplicate and induction on a repeated random sequence; a pattern needs a score ≥ 0.4"
            )
    return out


def _panel(capture, pairs, focus: int | None, width: int, compare: bool, start: int, key_start: int) -> tuple[RenderableType, str | None]:
    """One capture's view and its note: where the token at `focus` looks, else one head's map, else a grid of maps."""
    queries = [v.label for v in capture.queries]
    keys = [v.label for v in capture.keys]
    if focus is not None:
        intro = Text(f"where '{_short(queries[focus])}' (position {focus}) looks", style="bold")
        if len(pairs) == 1:
            layer, head = pairs[0]
            intro.append(f", layer {layer}, head {head}", style="bold")
            body, note = token_distribution(capture.weights[layer, head, focus], keys, width=width, upto=focus if capture.causal else None)
        else:
            rows = [(f"L{layer} H{head}", capture.weights[layer, head, focus]) for layer, head in pairs]
            body = token_bars(rows, keys, width=width, top=3 if not compare else 2, upto=focus if capture.causal else None)
            note = "the keys each head attends to most"
        return Group(intro, body), note
    if len(pairs) == 1:
        layer, head = pairs[0]
        body, note = heatmap(
            capture.weights[layer, head],
            queries,
            keys,
            width=width,
            start=start,
            key_start=key_start,
            self_attention=capture.self_attention,
            causal=capture.causal,
        )
        return Group(Text(f"layer {layer}, head {head}", style="bold"), body), note
    return grid([(f"L{layer} H{head}", capture.weights[layer, head]) for layer, head in pairs], width=width)


def neuron_table(document: dict) -> Group:
    """The neuron view in a terminal: per key (those the query may see) q·k, q·k/√d and the softmax weight,
    coloured on the one scale; the vectors themselves are in --format json and the page."""
    query = document["query"]
    table = Table(box=None, padding=(0, 1, 0, 0), show_edge=False, pad_edge=False)
    for name, justify in (("#", "right"), ("key", "left"), ("q·k", "right"), ("q·k/√d", "right"), ("softmax", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    root = math.sqrt(document["head_dim"])
    for key in document["keys"]:
        if key["masked"]:
            continue
        weight = key["weight"]
        table.add_row(
            str(key["position"]),
            Text(fit(_short(key.get("label", key["text"])), 14)),
            f"{key['score'] * root:.4f}",
            f"{key['score']:.4f}",
            Text(f"{weight:.4f}", style=f"{'white' if palette.dark(weight) else 'black'} on {palette.css(weight)}"),
        )
    title = Text(f"neuron view: layer {document['layer']}, head {document['head']}, query {query['position']} '", style="bold")
    title.append(_short(query.get("label", query["text"])))
    title.append(f"': softmax(q·k/√{document['head_dim']}) over the keys it may see")
    return Group(title, table, Text("the vectors (q, each k, q∘k) with every number: --format json", style="dim"))
