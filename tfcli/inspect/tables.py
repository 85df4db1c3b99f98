"""Terminal views of the logit lens, head ablation and activation patching: grids of layers down and
positions (or heads) across, each cell coloured by its value. Token text goes through `rich.text.Text` only
(already escaped by `tokenizer.show.visible`), so markup or control characters in a token print as
themselves. A text wider than the screen is windowed; the output says which positions are shown."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tfcli.errors import TfcliError
from tfcli.inspect.terminal import _colour, _short, fit

CELL = 7  # columns per position or head


def _on(colour: str, light: bool) -> str:
    return f"{'black' if light else 'white'} on {colour}"


def _signed(value: float, scale: float) -> str:
    """A diverging colour: red for a rise, blue for a fall, stronger with |value| / scale."""
    f = 0.0 if scale <= 0 or not math.isfinite(value) else min(abs(value) / scale, 1.0) ** 0.5
    base = (255, 80, 60) if value > 0 else (70, 120, 255)
    r, g, b = (round(40 + (c - 40) * f) for c in base)
    return f"rgb({r},{g},{b})"


def window(count: int, start: int, width: int, label_width: int, extra: int = 0) -> tuple[int, int]:
    """The first and one-past-last column of a window of cells that fits in `width` terminal columns."""
    if start < 0 or (count and start >= count):
        raise TfcliError(f"--start {start} is out of range: there are {count} positions (0 to {count - 1})")
    fits = max(1, (width - label_width - extra) // (CELL + 1))
    return start, min(count, start + fits)


def _grid(title: str, row_labels: Sequence[str], col_labels: Sequence[str], cell: Callable[[int, int], Text],
          extra: Sequence[tuple[str, Callable[[int], Text]]] = (), label_width: int = 10) -> Group:
    table = Table(box=None, padding=(0, 1, 0, 0), show_edge=False, pad_edge=False)
    table.add_column("", width=label_width, no_wrap=True)
    for label in col_labels:
        table.add_column(Text(fit(label, CELL)), width=CELL, no_wrap=True)
    for name, _ in extra:
        table.add_column(Text(name, style="bold"), width=CELL, no_wrap=True, justify="right")
    for r, label in enumerate(row_labels):
        table.add_row(Text(fit(label, label_width)), *[cell(r, c) for c in range(len(col_labels))], *[fn(r) for _, fn in extra])
    return Group(Text(title, style="bold"), table)


def _window_note(first: int, last: int, count: int, what: str = "positions") -> Text | None:
    if first == 0 and last == count:
        return None
    return Text(f"{what} {first} to {last - 1} of {count} shown; --start N moves the window", style="dim")


def lens_view(lens, *, width: int = 80, start: int = 0) -> list[RenderableType]:
    """Layers down, positions across: each layer's top-1 token, on a colour scale of its probability; the
    last row the token each position should predict, the right column each layer's loss."""
    positions = lens.positions
    first, last = window(len(positions), start, width, 11, CELL + 1 if lens.losses[0] is not None else 0)
    columns = list(range(first, last))
    col_labels = [_short(lens.tokens[positions[c]].text) for c in columns]

    def cell(r: int, c: int) -> Text:
        if r == len(lens.cells):  # the target row
            target = lens.targets[columns[c]]
            return Text(fit(_short(_target_text(lens, target)), CELL) if target is not None else " " * CELL, style="bold")
        _, text, p = lens.cells[r][columns[c]].top[0]
        style = _on(_colour(p), p >= 0.3)
        hit = lens.targets[columns[c]] is not None and lens.cells[r][columns[c]].target_rank == 1
        return Text(fit(_short(text), CELL), style=style + (" bold underline" if hit else ""))

    has_targets = any(t is not None for t in lens.targets)
    rows = list(lens.layers) + (["next" if lens.arch == "decoder" else ""] if has_targets else [])
    extra = []
    if lens.losses[0] is not None:
        extra = [("loss", lambda r: Text(f"{lens.losses[r]:.3f}" if r < len(lens.losses) else ""))]
    title = "what each layer predicts (logit lens): top-1 token, coloured by its probability"
    out: list[RenderableType] = [_grid(title, rows, col_labels, cell, extra, label_width=10)]
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
                    return text
    return next((v.text for v in lens.tokens if v.id == target), str(target))


def ablation_view(ablation, *, top: int = 10) -> list[RenderableType]:
    out: list[RenderableType] = []
    where = f"position {ablation.position} ('{_short(ablation.tokens[ablation.position].text)}')"
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
        for (_, a, pa), (_, b, pb) in zip(ablation.base_top, ablation.top or []):
            table.add_row(Text(f"'{a}'"), f"{pa:.3f}", Text(f"'{b}'"), f"{pb:.3f}")
        out.append(table)
        return out
    delta = ablation.delta
    scale = float(np.abs(delta).max()) or 1.0

    def cell(r: int, c: int) -> Text:
        value = float(delta[r, c])
        return Text(f"{value:+.3f}"[:CELL].rjust(CELL), style=_on(_signed(value, scale), False))

    L, nh = delta.shape
    out.append(_grid(f"change in loss on the text when one head is {mode} (base {ablation.base_loss:.4f} nats)",
                     [f"layer {l}" for l in range(L)], [f"head {h}" for h in range(nh)], cell))
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


def patching_view(patching, *, width: int = 80, start: int = 0) -> list[RenderableType]:
    restored = patching.restored
    L, T = restored.shape
    first, last = window(T, start, width, 11)
    columns = list(range(first, last))

    def label(c: int) -> str:
        a, b = _short(patching.clean_tokens[c].text), _short(patching.corrupt_tokens[c].text)
        return a if a == b else f"{a}/{b}"

    def cell(r: int, c: int) -> Text:
        value = round(float(restored[r, columns[c]]), 2) + 0.0  # no "-0.00"
        return Text(f"{value:.2f}"[:CELL].rjust(CELL), style=_on(_signed(value, 1.0), False))

    out: list[RenderableType] = [
        Text(f"logit difference '{patching.answer[1]}' - '{patching.wrong[1]}' at the last position: "
             f"clean {patching.clean_diff:+.3f}, corrupted {patching.corrupt_diff:+.3f}"),
        _grid("fraction restored by patching in the clean residual stream (before each block), one position at a time",
              [f"block {l}" for l in range(L)], [label(c) for c in columns], cell),
    ]
    note = _window_note(first, last, T)
    if note:
        out.append(note)
    if patching.head_restored is not None:
        heads = patching.head_restored

        def head_cell(r: int, c: int) -> Text:
            value = round(float(heads[r, c]), 2) + 0.0
            return Text(f"{value:.2f}"[:CELL].rjust(CELL), style=_on(_signed(value, 1.0), False))

        out.append(_grid("fraction restored by patching in one head's clean output (every position)",
                         [f"layer {l}" for l in range(heads.shape[0])], [f"head {h}" for h in range(heads.shape[1])], head_cell))
    out.append(Text("1.00: the clean answer comes back entirely; 0.00: no change; tokens shown clean/corrupted where they differ", style="dim"))
    return out


# ---- PNG -----------------------------------------------------------------------------------------------

def lens_png(lens) -> bytes:
    from tfcli.inspect import png

    values = np.array([[cell.top[0][2] for cell in row] for row in lens.cells], dtype=np.float32)  # (layers, positions)
    texts = [[_short(cell.top[0][1]) for cell in row] for row in lens.cells]
    columns = [_short(lens.tokens[p].text) for p in lens.positions]
    return png.value_grid_png("logit lens: each layer's top-1 token, coloured by its probability", values, lens.layers, columns,
                              texts=texts, colour_label="probability", xlabel="position (the token read)")


def ablation_png(ablation) -> bytes:
    from tfcli.inspect import png

    if ablation.heads is not None:
        raise TfcliError("the png shows every head's loss change", hint="drop --heads, or use the terminal or --json for chosen heads")
    L, nh = ablation.delta.shape
    return png.value_grid_png(f"change in loss when one head is {'zeroed' if ablation.mode == 'zero' else 'mean-ablated'} (base {ablation.base_loss:.4f} nats)",
                              ablation.delta.astype(np.float32), [f"layer {l}" for l in range(L)], [f"head {h}" for h in range(nh)],
                              diverging=True, colour_label="loss change (nats)")


def patching_png(patching) -> bytes:
    from tfcli.inspect import png

    columns = [a if a == b else f"{a}/{b}" for a, b in ((_short(x.text), _short(y.text)) for x, y in zip(patching.clean_tokens, patching.corrupt_tokens))]
    return png.value_grid_png(f"fraction of the logit difference '{patching.answer[1]}' - '{patching.wrong[1]}' restored by patching the residual stream",
                              patching.restored.astype(np.float32), [f"block {l}" for l in range(patching.restored.shape[0])], columns,
                              diverging=True, colour_label="fraction restored", xlabel="position (clean/corrupted)")


def across_view(across, pattern: str, layers: Sequence[int], heads: Sequence[int], *, width: int = 80) -> list[RenderableType]:
    """Checkpoints down (by step), heads across: one detector score per cell, on the colour scale."""
    pairs = [(l, h) for l in layers for h in heads]
    fits = max(1, (width - 11) // (CELL + 1))
    shown = pairs[:fits]
    values = across.scores[pattern]

    def cell(r: int, c: int) -> Text:
        layer, head = shown[c]
        value = float(values[r, layer, head])
        if value != value:  # NaN: not scored
            return Text("-".rjust(CELL), style="dim")
        return Text(f"{value:.2f}".rjust(CELL), style=_on(_colour(value), value >= 0.3))

    out: list[RenderableType] = [_grid(f"{pattern} score of each head at each kept checkpoint", [f"step {s}" for s in across.steps],
                                       [f"{l}.{h}" for l, h in shown], cell)]
    if len(shown) < len(pairs):
        out.append(Text(f"{len(shown)} of {len(pairs)} heads shown; --layer L (or --head H) picks others", style="dim"))
    where = "a repeated random sequence" if pattern in ("duplicate", "induction") else "the text"
    out.append(Text(f"scored on {where}; --pattern picks previous-token, first-token, duplicate or induction", style="dim"))
    return out
