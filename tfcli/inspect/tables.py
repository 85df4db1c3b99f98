"""Terminal views of the logit lens, head ablation and activation patching: grids of layers down and
positions (or heads) across, each cell coloured by its value. Token text goes through `rich.text.Text` only
(already escaped by `tokenizer.show.visible`), so markup or control characters in a token print as
themselves. A text wider than the screen is windowed; the output says which positions are shown.

The PNG and HTML forms of the same three views are here too (about 460 lines in all): each view's
terminal, PNG and HTML renderings read the same fields and labels, and a change to one is seen beside the
others."""

from __future__ import annotations

import html
import math
import secrets
from collections.abc import Callable, Sequence

import numpy as np
from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tfcli.errors import TfcliError
from tfcli.inspect import palette, png
from tfcli.inspect.terminal import _colour, _short, fit
from tfcli.tokenizer.show import SPACE_MARK, visible

CELL = 7  # columns per position or head


def _on(colour: str, light: bool) -> str:
    return f"{'black' if light else 'white'} on {colour}"


def _signed(value: float, scale: float) -> str:
    """A diverging colour: red for a rise, blue for a fall, stronger with |value| / scale."""
    f = 0.0 if scale <= 0 or not math.isfinite(value) else min(abs(value) / scale, 1.0) ** 0.5
    base = (255, 80, 60) if value > 0 else (70, 120, 255)
    r, g, b = (round(40 + (c - 40) * f) for c in base)
    return f"rgb({r},{g},{b})"


def _signed_light(value: float, scale: float) -> tuple[str, bool]:
    """The page's diverging colour (white at 0, red for a rise, blue for a fall: RdBu's ends, as the PNGs'
    signed maps) and whether it is dark."""
    f = 0.0 if scale <= 0 or not math.isfinite(value) else min(abs(value) / scale, 1.0) ** 0.5
    base = (178, 24, 43) if value > 0 else (33, 102, 172)
    r, g, b = (round(255 + (c - 255) * f) for c in base)
    return f"rgb({r},{g},{b})", f > 0.6


def window(count: int, start: int, width: int, label_width: int, extra: int = 0, cell: int = CELL) -> tuple[int, int]:
    """The first and one-past-last column of a window of `cell`-wide cells that fits in `width` terminal columns."""
    if start < 0 or (count and start >= count):
        raise TfcliError(f"--start {start} is out of range: there are {count} positions (0 to {count - 1})")
    fits = max(1, (width - label_width - extra) // (cell + 1))
    return start, min(count, start + fits)


def cell_width(texts: Sequence[str], least: int = 4) -> int:
    """As narrow as the widest text needs, between `least` and CELL: short tokens leave room for more positions.

    Example: cell_width(["the", "fox", "a"]) -> 4; cell_width(["because"]) -> 7
    """
    return max(least, min(CELL, max((cell_len(t) for t in texts), default=least)))


def _grid(
    title: str,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    cell: Callable[[int, int], Text],
    extra: Sequence[tuple[str, Callable[[int], Text]]] = (),
    label_width: int = 10,
    cell_size: int = CELL,
) -> Group:
    table = Table(box=None, padding=(0, 1, 0, 0), show_edge=False, pad_edge=False)
    table.add_column("", width=label_width, no_wrap=True)
    for label in col_labels:
        table.add_column(Text(fit(label, cell_size)), width=cell_size, no_wrap=True)
    for name, _ in extra:
        table.add_column(Text(name, style="bold"), width=CELL, no_wrap=True, justify="right")
    for r, label in enumerate(row_labels):
        table.add_row(Text(fit(label, label_width)), *[cell(r, c) for c in range(len(col_labels))], *[fn(r) for _, fn in extra])
    return Group(Text(title, style="bold"), table)


def _window_note(first: int, last: int, count: int, what: str = "positions") -> Text | None:
    """Which window of a long text is shown, and the --start that pages on.

    Example: _window_note(0, 8, 26) -> "positions 0-7 of 26 shown; --start 8 for more"
    """
    if first == 0 and last == count:
        return None
    more = f"--start {last} for more" if last < count else "the last ones"
    back = f", --start {max(0, first - (last - first))} for the ones before" if first else ""
    return Text(f"{what} {first}-{last - 1} of {count} shown; {more}{back}", style="dim")


def lens_view(lens, *, width: int = 80, start: int = 0) -> list[RenderableType]:
    """Layers down, positions across: each layer's top-1 token, on a colour scale of its probability; the
    last row the token each position should predict, the right column each layer's loss."""
    positions = lens.positions
    texts = [_short(lens.tokens[p].label) for p in positions] + [_short(lens.label(*cell.top[0][:2])) for row in lens.cells for cell in row]
    size = cell_width(texts)
    first, last = window(len(positions), start, width, 11, CELL + 1 if lens.losses[0] is not None else 0, size)
    columns = list(range(first, last))
    col_labels = [_short(lens.tokens[positions[c]].label) for c in columns]

    def cell(r: int, c: int) -> Text:
        if r == len(lens.cells):  # the target row
            target = lens.targets[columns[c]]
            return Text(fit(_short(_target_label(lens, columns[c])), size) if target is not None else " " * size, style="bold")
        token_id, text, p = lens.cells[r][columns[c]].top[0]
        style = _on(_colour(p), p >= 0.3)
        hit = lens.targets[columns[c]] is not None and lens.cells[r][columns[c]].target_rank == 1
        return Text(fit(_short(lens.label(token_id, text)), size), style=style + (" bold underline" if hit else ""))

    has_targets = any(t is not None for t in lens.targets)
    rows = list(lens.layers) + (["next" if lens.arch == "decoder" else ""] if has_targets else [])
    extra = []
    if lens.losses[0] is not None:
        extra = [("loss", lambda r: Text(f"{lens.losses[r]:.3f}" if r < len(lens.losses) else ""))]
    title = "what each layer predicts (logit lens): top-1 token, coloured by its probability"
    out: list[RenderableType] = [_grid(title, rows, col_labels, cell, extra, label_width=10, cell_size=size)]
    note = _window_note(first, last, len(positions))
    if note:
        out.append(note)
    legend = Text("probability ")
    for p in (0.01, 0.1, 0.3, 0.6, 0.9):
        legend.append(f" {p:.2f} ", style=_on(_colour(p), p >= 0.3))
    out.append(legend)
    if has_targets:
        out.append(Text("underlined: the right next token; loss: each layer's mean cross-entropy (nats) on the next tokens", style="dim"))
    return out


def _target_text(lens, target: int) -> str:
    for row in lens.cells:
        for cell in row:
            for token_id, text, _ in cell.top:
                if token_id == target:
                    return lens.label(token_id, text)
    return next((v.label for v in lens.tokens if v.id == target), str(target))


def _target_label(lens, i: int) -> str:
    """The token position i should predict: where it is the text's next token, as the text shows it there (a
    piece of a character as that character, as the header row has it), else as a prediction names it."""
    target = lens.targets[i]
    if target is None:
        return ""
    after = lens.positions[i] + 1
    if after < len(lens.tokens) and lens.tokens[after].id == target:
        return lens.tokens[after].label
    return _target_text(lens, target)


def ablation_view(ablation, *, top: int = 10) -> list[RenderableType]:
    out: list[RenderableType] = []
    where = f"position {ablation.position} ('{_short(ablation.tokens[ablation.position].label)}')"
    mode = "zeroed" if ablation.mode == "zero" else "replaced by their mean output over " + ("the reference text" if ablation.reference else "the text")
    if ablation.heads is not None:
        names = ", ".join(f"{l}.{h}" for l, h in ablation.heads)
        delta = float(ablation.delta[0])
        out.append(Text(f"heads {names} {mode}"))
        out.append(Text(f"loss on the text {ablation.base_loss:.4f} -> {float(ablation.loss[0]):.4f} ({delta:+.4f} nats)"))
        out.append(Text(f"next token at {where} (KL {float(ablation.kl[0]):.4f} nats)", style="bold"))
        table = Table(box=None, padding=(0, 2, 0, 0), show_edge=False)
        table.add_column("before")
        table.add_column("p", justify="right")
        table.add_column("after")
        table.add_column("p", justify="right")
        for (i, a, pa), (j, b, pb) in zip(ablation.base_top, ablation.top or []):
            table.add_row(Text(ablation.label(i, a)), f"{pa:.3f}", Text(ablation.label(j, b)), f"{pb:.3f}")
        out.append(table)
        return out
    delta = ablation.delta
    scale = float(np.abs(delta).max()) or 1.0

    def cell(r: int, c: int) -> Text:
        value = float(delta[r, c])
        return Text(f"{value:+.3f}"[:CELL].rjust(CELL), style=_on(_signed(value, scale), False))

    L, nh = delta.shape
    out.append(
        _grid(
            f"change in loss on the text when one head is {mode} (base {ablation.base_loss:.4f} nats)",
            [f"layer {l}" for l in range(L)],
            [f"head {h}" for h in range(nh)],
            cell,
        )
    )
    order = np.argsort(-np.abs(delta), axis=None)[:top]
    out.append(Text(f"the heads that matter most (KL: how the next-token distribution at {where} changes)", style="bold"))
    ranked = Table(box=None, padding=(0, 2, 0, 0), show_edge=False)
    for name in ("head", "loss change", "KL"):
        ranked.add_column(name, justify="right")
    for flat in order:
        l, h = divmod(int(flat), nh)
        ranked.add_row(f"{l}.{h}", f"{float(delta[l, h]):+.4f}", f"{float(ablation.kl[l, h]):.4f}")
    out.append(ranked)
    return out


def _patching_titles(patching) -> tuple[str, str]:
    """The residual-stream map's and the heads' titles, which say how the numbers were found."""
    if patching.method == "attribution":
        marked = ", * exact (--verify)" if patching.verified or patching.head_verified else ""
        how = f"estimated by attribution patching (first order){marked}"
        return (
            f"fraction restored, {how}: the clean residual stream before each block, one position at a time",
            f"fraction restored, {how}: one head's clean output",
        )
    return (
        "fraction restored by patching in the clean residual stream (before each block), one position at a time",
        "fraction restored by patching in one head's clean output (every position)",
    )


def _restored_text(value: float, exact: bool) -> str:
    return f"{round(value, 2) + 0.0:.2f}" + ("*" if exact else "")  # + 0.0: no "-0.00"


def _pair(clean: str, corrupt: str) -> str:
    """The labels of a clean and a corrupted token at one position, their shared space mark written once.

    Example: ("␣fox", "␣dog") -> "␣fox/dog"; ("The", "The") -> "The"; ("a", "␣b") -> "a/␣b"
    """
    if clean == corrupt:
        return clean
    shared = min(len(clean) - len(clean.lstrip(SPACE_MARK)), len(corrupt) - len(corrupt.lstrip(SPACE_MARK)))
    return f"{clean}/{corrupt[shared:]}"


def patching_view(patching, *, width: int = 80, start: int = 0) -> list[RenderableType]:
    restored = patching.restored
    L, T = restored.shape
    checked = {(l, p) for l, p, _, _ in patching.verified}
    checked_heads = {(l, h) for l, h, _, _ in patching.head_verified}
    title, head_title = _patching_titles(patching)

    def label(c: int) -> str:
        return _pair(_short(patching.clean_tokens[c].label), _short(patching.corrupt_tokens[c].label))

    values = [_restored_text(float(restored[r, c]), (r, c) in checked) for r in range(L) for c in range(T)]
    size = cell_width([label(c) for c in range(T)] + values, least=5)
    first, last = window(T, start, width, 11, cell=size)
    columns = list(range(first, last))

    def cell(r: int, c: int) -> Text:
        value = float(restored[r, columns[c]])
        return Text(_restored_text(value, (r, columns[c]) in checked)[:size].rjust(size), style=_on(_signed(value, 1.0), False))

    out: list[RenderableType] = [
        Text(
            f"logit difference '{patching.answer[1]}' - '{patching.wrong[1]}' at the last position: "
            f"clean {patching.clean_diff:+.3f}, corrupted {patching.corrupt_diff:+.3f}"
        ),
        _grid(title, [f"block {l}" for l in range(L)], [label(c) for c in columns], cell, cell_size=size),
    ]
    note = _window_note(first, last, T)
    if note:
        out.append(note)
    if patching.head_restored is not None:
        heads = patching.head_restored

        def head_cell(r: int, c: int) -> Text:
            value = float(heads[r, c])
            return Text(_restored_text(value, (r, c) in checked_heads)[:CELL].rjust(CELL), style=_on(_signed(value, 1.0), False))

        out.append(_grid(head_title, [f"layer {l}" for l in range(heads.shape[0])], [f"head {h}" for h in range(heads.shape[1])], head_cell))
    out.append(Text("1.00: the clean answer comes back entirely; 0.00: no change; tokens shown clean/corrupted where they differ", style="dim"))
    return out


# ---- PNG -----------------------------------------------------------------------------------------------


def lens_png(lens) -> bytes:
    values = np.array([[cell.top[0][2] for cell in row] for row in lens.cells], dtype=np.float32)  # (layers, positions)
    texts = [[_short(lens.label(*cell.top[0][:2])) for cell in row] for row in lens.cells]
    columns = [_short(lens.tokens[p].label) for p in lens.positions]
    return png.value_grid_png(
        "logit lens: each layer's top-1 token, coloured by its probability",
        values,
        lens.layers,
        columns,
        texts=texts,
        colour_label="probability",
        xlabel="position (the token read)",
    )


def ablation_png(ablation) -> bytes:
    if ablation.heads is not None:
        raise TfcliError("the png shows every head's loss change", hint="drop --heads, or use the terminal or --json for chosen heads")
    L, nh = ablation.delta.shape
    return png.value_grid_png(
        f"change in loss when one head is {'zeroed' if ablation.mode == 'zero' else 'mean-ablated'} (base {ablation.base_loss:.4f} nats)",
        ablation.delta.astype(np.float32),
        [f"layer {l}" for l in range(L)],
        [f"head {h}" for h in range(nh)],
        diverging=True,
        colour_label="loss change (nats)",
    )


def patching_png(patching) -> bytes:
    columns = [_pair(_short(x.label), _short(y.label)) for x, y in zip(patching.clean_tokens, patching.corrupt_tokens)]
    how = "patching the residual stream" if patching.method == "exact" else "the residual stream, estimated by attribution patching"
    checked = {(l, p) for l, p, _, _ in patching.verified}
    texts = [[_restored_text(float(v), (l, p) in checked) for p, v in enumerate(row)] for l, row in enumerate(patching.restored)]
    return png.value_grid_png(
        f"fraction of the logit difference '{patching.answer[1]}' - '{patching.wrong[1]}' restored by {how}" + (" (* exact)" if checked else ""),
        patching.restored.astype(np.float32),
        [f"block {l}" for l in range(patching.restored.shape[0])],
        columns,
        texts=texts,
        diverging=True,
        colour_label="fraction restored",
        xlabel="position (clean/corrupted)",
    )


def across_view(across, pattern: str, layers: Sequence[int], heads: Sequence[int], *, width: int = 80) -> list[RenderableType]:
    """Checkpoints down (by step), heads across: one detector score per cell, on the colour scale."""
    pairs = [(l, h) for l in layers for h in heads]
    fits = max(1, (width - 11) // (CELL + 1))
    shown = pairs[:fits]
    values = across.scores[pattern]

    def cell(r: int, c: int) -> Text:
        layer, head = shown[c]
        value = float(values[r, layer, head])
        if math.isnan(value):  # not scored
            return Text("-".rjust(CELL), style="dim")
        return Text(f"{value:.2f}".rjust(CELL), style=_on(_colour(value), value >= 0.3))

    out: list[RenderableType] = [
        _grid(f"{pattern} score of each head at each kept checkpoint", [f"step {s}" for s in across.steps], [f"{l}.{h}" for l, h in shown], cell)
    ]
    if len(shown) < len(pairs):
        out.append(Text(f"{len(shown)} of {len(pairs)} heads shown; --layer L (or --head H) picks others", style="dim"))
    where = "a repeated random sequence" if pattern in ("duplicate", "induction") else "the text"
    out.append(Text(f"scored on {where}; --pattern picks previous-token, first-token, duplicate or induction", style="dim"))
    return out


# ---- HTML: one static, self-contained page; no script, no network ----------------------------------

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
</head>
<body style="margin: 1.5em">
{view}
</body></html>
"""

# scoped to the view's own element: several views (or a notebook's own style) on one page never meet
_VIEW = """<div class="tfcli-tables" id="{uid}">
<style>
#{uid} {{ font: 14px system-ui, sans-serif; color: #222; background: #fff; }}
#{uid} h1 {{ font-size: 1.2em; }} #{uid} p.note {{ color: #666; }}
#{uid} .scroll {{ overflow: auto; max-width: 100%; }}
#{uid} table {{ border-collapse: collapse; }}
#{uid} th, #{uid} td {{ padding: 3px 6px; border: 1px solid #fff; white-space: pre; font-family: ui-monospace, monospace; font-size: 12px; }}
#{uid} th {{ background: #f3f3f3; font-weight: normal; }} #{uid} th.row {{ text-align: left; position: sticky; left: 0; }}
#{uid} td {{ text-align: center; }}
#{uid} .legend {{ display: flex; align-items: flex-start; gap: .6em; font-size: 11px; color: #444; margin: .6em 0; }}
#{uid} .legend .bar {{ position: relative; width: 240px; height: 26px; }}
#{uid} .legend .ramp {{ height: 10px; border: 1px solid #999; }}
#{uid} .legend .tick {{ position: absolute; top: 12px; transform: translateX(-50%); }}
</style>
<h1>{title}</h1>
{notes}
{legend}
{tables}
</div>"""


def legend_html(label: str, *, signed: float | None = None) -> str:
    """A colour bar with its scale: the views' one map (viridis, square-root scale) from 0 to 1, or with
    `signed` the red-blue map from -signed to +signed (blue a fall, red a rise)."""
    if signed is None:
        stops = ", ".join(f"rgb{palette.VIRIDIS[i]} {100 * i / (len(palette.VIRIDIS) - 1):.1f}%" for i in range(len(palette.VIRIDIS)))
        ticks = [(f"{w:g}", 100 * math.sqrt(w)) for w in (0, 0.05, 0.25, 0.5, 1)]
    else:
        colours = [_signed_light(v, 1.0)[0] for v in (-1, -0.5, -0.25, -0.05, 0, 0.05, 0.25, 0.5, 1)]
        stops = ", ".join(f"{c} {50 + 50 * math.copysign(math.sqrt(abs(v)), v):.1f}%" for c, v in zip(colours, (-1, -0.5, -0.25, -0.05, 0, 0.05, 0.25, 0.5, 1)))
        ticks = [(f"{v * signed:+.3g}" if v else "0", 50 + 50 * math.copysign(math.sqrt(abs(v)), v)) for v in (-1, -0.25, 0, 0.25, 1)]
    marks = "".join(f'<span class="tick" style="left:{x:.1f}%">{_escape(t)}</span>' for t, x in ticks)
    return f'<div class="legend"><span>{_escape(label)}</span><div class="bar"><div class="ramp" style="background: linear-gradient(to right, {stops})"></div>{marks}</div><span>square-root scale; hover a cell for its numbers</span></div>'


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def html_table(
    title: str,
    rows: Sequence[str],
    columns: Sequence[str],
    cells: Sequence[Sequence[tuple[str, str, bool, str]]],
    extra: Sequence[tuple[str, Sequence[str]]] = (),
) -> str:
    """A table of coloured cells: each (text, CSS colour made here from a number, dark background?, tooltip).
    Every piece of text is escaped; colours never come from text."""
    head = "".join(f"<th>{_escape(c)}</th>" for c in columns) + "".join(f"<th>{_escape(name)}</th>" for name, _ in extra)
    body = []
    for r, label in enumerate(rows):
        tds = "".join(
            f'<td style="background:{colour};color:{"#fff" if dark else "#000"}" title="{_escape(tip)}">{_escape(text)}</td>'
            for text, colour, dark, tip in cells[r]
        )
        tds += "".join(f"<td>{_escape(values[r])}</td>" for _, values in extra)
        body.append(f'<tr><th class="row">{_escape(label)}</th>{tds}</tr>')
    return f'<h2>{_escape(title)}</h2><div class="scroll"><table><tr><th></th>{head}</tr>{"".join(body)}</table></div>'


def html_page(title: str, notes: Sequence[str], tables: Sequence[str], *, legend: str = "", fragment: bool = False) -> str:
    """The page (or with `fragment`, the view alone, for a notebook); the title and notes (user text: the
    run's path, the texts) shown with control and bidirectional characters escaped (`visible`), so none
    can act or reorder the page."""
    notes_html = "".join(f'<p class="note">{_escape(visible(n))}</p>' for n in notes)
    view = _VIEW.format(uid=f"tfcli-tables-{secrets.token_hex(6)}", title=_escape(visible(title)), notes=notes_html, legend=legend, tables="\n".join(tables))
    return view if fragment else _PAGE.format(title=_escape(visible(title)), view=view)


def lens_html(lens, *, fragment: bool = False) -> str:
    columns = [lens.tokens[p].label for p in lens.positions]
    cells = []
    for row in lens.cells:
        line = []
        for i, cell in enumerate(row):
            token_id, text, p = cell.top[0]
            tip = "; ".join(f"{lens.label(i, t)!r} {q:.3f}" for i, t, q in cell.top)
            if cell.target_rank is not None:
                tip += f" | next {_target_label(lens, i)!r}: rank {cell.target_rank}, p {cell.target_probability:.4f}"
            line.append((lens.label(token_id, text), _colour(p), p < 0.3, tip))
        cells.append(line)
    extra = []
    if lens.losses[0] is not None:
        extra = [("loss", [f"{x:.3f}" for x in lens.losses])]
    tables = [html_table("each layer's top-1 token, coloured by its probability (hover: the top tokens)", lens.layers, columns, cells, extra)]
    if any(t is not None for t in lens.targets):
        tables.append(
            html_table(
                "the token each position should predict",
                ["next"],
                columns,
                [[(_target_label(lens, i), "#fff", False, "") for i in range(len(lens.targets))]],
            )
        )
    return html_page(f"logit lens · {lens.run}", [f"text: {lens.text}"], tables, legend=legend_html("probability"), fragment=fragment)


def ablation_html(ablation, *, fragment: bool = False) -> str:
    mode = "zeroed" if ablation.mode == "zero" else "mean-ablated"
    if ablation.heads is not None:
        rows = ["before", "after"]
        cells = [[(f"{ablation.label(i, t)} {p:.3f}", _colour(p), p < 0.3, "") for i, t, p in tops] for tops in (ablation.base_top, ablation.top or [])]
        return html_page(
            f"ablation · {ablation.run}",
            [
                f"text: {ablation.text}",
                f"heads {', '.join(f'{l}.{h}' for l, h in ablation.heads)} {mode}: loss {ablation.base_loss:.4f} -> {float(ablation.loss[0]):.4f}",
            ],
            [html_table(f"next token at position {ablation.position}", rows, [str(i + 1) for i in range(len(cells[0]))], cells)],
            legend=legend_html("probability"),
            fragment=fragment,
        )
    delta = ablation.delta
    scale = float(np.abs(delta).max()) or 1.0
    cells = [
        [
            (f"{float(delta[l, h]):+.4f}", *_signed_light(float(delta[l, h]), scale), f"KL at position {ablation.position}: {float(ablation.kl[l, h]):.4f}")
            for h in range(delta.shape[1])
        ]
        for l in range(delta.shape[0])
    ]
    return html_page(
        f"ablation · {ablation.run}",
        [f"text: {ablation.text}", f"base loss {ablation.base_loss:.4f} nats"],
        [
            html_table(
                f"change in loss when one head is {mode}", [f"layer {l}" for l in range(delta.shape[0])], [f"head {h}" for h in range(delta.shape[1])], cells
            )
        ],
        legend=legend_html("loss change (nats)", signed=scale),
        fragment=fragment,
    )


def patching_html(patching, *, fragment: bool = False) -> str:
    columns = [_pair(a.label, b.label) for a, b in zip(patching.clean_tokens, patching.corrupt_tokens)]
    title, head_title = _patching_titles(patching)

    def cells(values, verified) -> list:
        checked = {(r, c): estimate for r, c, estimate, _ in verified}
        tip = "" if patching.method == "exact" else "attribution estimate"
        return [
            [
                (
                    _restored_text(float(v), (r, c) in checked),
                    *_signed_light(float(v), 1.0),
                    f"exact; estimated {checked[r, c]:.2f}" if (r, c) in checked else tip,
                )
                for c, v in enumerate(row)
            ]
            for r, row in enumerate(values)
        ]

    tables = [html_table(title, [f"block {l}" for l in range(patching.restored.shape[0])], columns, cells(patching.restored, patching.verified))]
    if patching.head_restored is not None:
        heads = patching.head_restored
        rows = [f"layer {l}" for l in range(heads.shape[0])]
        tables.append(html_table(head_title, rows, [f"head {h}" for h in range(heads.shape[1])], cells(heads, patching.head_verified)))
    method = "exact activation patching" if patching.method == "exact" else "attribution patching (first-order estimates)"
    return html_page(
        f"activation patching · {patching.run}",
        [
            f"clean: {patching.clean}",
            f"corrupted: {patching.corrupt}",
            f"logit difference {patching.answer[1]!r} - {patching.wrong[1]!r}: clean {patching.clean_diff:+.3f}, corrupted {patching.corrupt_diff:+.3f}",
            f"method: {method}",
        ],
        tables,
        legend=legend_html("fraction restored", signed=1.0),
        fragment=fragment,
    )
