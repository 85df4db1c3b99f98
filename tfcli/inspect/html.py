"""One self-contained HTML page of attention: a model view (a thumbnail of every layer and head, labelled
with the pattern it matches), a heatmap, the text's tokens, where hovering a token colours what it attends
to and what attends to it, a colour bar, and a neuron view (q, k, q∘k, q·k/√d and the softmax of one head
and query). The same view, without the document around it, is what a notebook shows (`fragment`): its
parts are found inside its own element, so several on one notebook page never meet.

No network: the weights travel inside the page, rounded to one byte each on a square-root scale (fine
steps where attention is small), only the causal lower triangle when the rest is masked, deflated and
base64-encoded layer by layer; the browser inflates them with its built-in `DecompressionStream`.

Untrusted text never becomes markup: the header is `html.escape`d, and everything else is JSON inside
`<script type="application/json">` with `<`, `>`, `&`, U+2028 and U+2029 escaped, put on the page with
`textContent` only. The view holds exactly two script elements: that data and the code.

The view's markup, style and code are package data (`assets/page.html`, `page.css`, `page.js`; the
document around it `assets/document.html`), inlined when the page is written, so the one file needs
nothing beside it.
"""

from __future__ import annotations

import base64
import functools
import html
import os
import re
import secrets
import unicodedata
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

import numpy as np

from tfcli.inspect import palette
from tfcli.inspect.capture import AttentionCapture
from tfcli.inspect.labels import excerpts, kind_label
from tfcli.inspect.stats import HeadChange, HeadSummary
from tfcli.jsontext import dumps_json
from tfcli.tokenizer.show import NEWLINE_MARK, TokenView

PAGE_FORMAT = 3  # 2: tokens as pieces (characters, badges), not escaped text; 3: palette, head labels, q and k
NEURON_BUDGET = 150_000  # numbers of q and k a page carries for every head (about 1.3 MB); past it, only the chosen head's


def json_for_script(data: Any) -> str:
    """JSON safe to place inside a <script> element: no `<`, `>`, `&`, U+2028, U+2029 left raw.

    Example: json_for_script({"t": "</script>"}) -> '{"t": "\\u003c/script\\u003e"}'
    """
    text = dumps_json(data, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def _pack_layer(weights: np.ndarray, causal: bool, level: int) -> str:
    """One layer [H, T, S] -> base64 of the deflated bytes round(sqrt(w) * 255), head by head, row by row."""
    H, T, S = weights.shape
    if causal and T == S:
        rows, cols = np.tril_indices(T)
        flat = weights[:, rows, cols]  # (H, T * (T + 1) / 2): row q holds keys 0..q
    else:
        flat = weights.reshape(H, T * S)
    scaled = np.sqrt(np.clip(flat, 0.0, 1.0), dtype=np.float32)
    scaled *= 255.0
    scaled += 0.5
    return base64.b64encode(zlib.compress(scaled.astype(np.uint8).tobytes(), level)).decode("ascii")


def pack_weights(weights: np.ndarray, causal: bool, level: int = 1) -> list[str]:
    """[L, H, T, S] float weights -> per layer, base64 of deflated bytes, each round(sqrt(w) * 255).

    Causal square maps keep only the lower triangle; the page reads weight = (byte / 255) ** 2. Layers are
    packed on parallel threads (numpy and zlib release the GIL); level 1 deflate is several times faster
    than the default and barely larger on attention maps.
    """
    workers = max(1, min(len(weights), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda layer: _pack_layer(layer, causal, level), weights))


_NAMED = {"\n": NEWLINE_MARK, "\t": "\\t", "\r": "\\r"}  # a newline as labels show it: ↵


def _invisible(ch: str) -> bool:
    """Characters a page would not show, or that would act instead of showing: controls, format characters
    (zero-width ones, bidi overrides and isolates), line and paragraph separators, surrogates."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def _badge(ch: str) -> list[str]:
    code = ord(ch)
    name = unicodedata.name(ch, "") or ("control character" if code < 0x100 else "character")
    return ["c", _NAMED.get(ch, f"U+{code:04X}"), f"{name} (U+{code:04X})"]


def token_pieces(views: Sequence[TokenView]) -> list[list[str | list[str]]]:
    """What each token shows on the page: the characters it adds to the text, as the tokenizer's decoder
    writes them (`TokenView.piece`).

    A piece is plain text, or [kind, text, tooltip] for what must stand out: "c" a badge for a character
    that is invisible or would act (a control, a bidi override such as U+202E, a zero-width character),
    "p" a character split over tokens, shown faintly on each token before the one that completes it ("pc"
    when that character is one of the badged ones), "x" bytes that are not UTF-8 (the decoder's U+FFFD).
    The browser gets text only (`textContent`), so nothing here can become markup.

    Example: tokens "a" (+ part of 😀), "" (+ part of 😀), "😀" -> [["a", ["p", "😀", ...]], [["p", "😀", ...]], ["😀"]]
    """
    out: list[list[str | list[str]]] = []
    for view in views:
        if not view.piece and not view.part:  # no text behind it (an encoder-decoder's start token): its vocabulary entry
            out.append([view.text] if view.text else [])
            continue
        pieces: list[str | list[str]] = []
        for ch in view.piece:
            if ch == "\ufffd":
                pieces.append(["x", "\ufffd", "bytes that are not UTF-8"])
            elif _invisible(ch):
                pieces.append(_badge(ch))
            elif pieces and isinstance(pieces[-1], str):
                pieces[-1] += ch
            else:
                pieces.append(ch)
        if view.part:
            ch = view.part
            if _invisible(ch):  # never the raw character where it would act: its badge, marked as a part
                pieces.append(["pc", _badge(ch)[1], f"part of {_badge(ch)[2]}, completed by a later token"])
            else:
                pieces.append(["p", ch, f"part of {ch} (U+{ord(ch):04X}), completed by a later token"])
        out.append(pieces)
    return out


def page_data(
    captures: Sequence[AttentionCapture],
    titles: Sequence[str],
    *,
    layer: int,
    head: int,
    focus: Sequence[int] | None = None,
    summary: Sequence[HeadSummary] | None = None,
    changes: Sequence[HeadChange] | None = None,
    labels: Sequence[HeadSummary] | None = None,
    neuron: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """focus: the --token query position in each capture (each text has its own); labels: every head's
    summary of the first capture, for the model view's thumbnails; neuron: `neuron_data`'s q and k."""
    first = captures[0]
    panels = []
    for index, (capture, title) in enumerate(zip(captures, titles)):
        panels.append(
            {
                "title": title,
                "focus": None if focus is None else focus[index],
                "queries": token_pieces(capture.queries),
                "keys": None if capture.self_attention else token_pieces(capture.keys),
                "causal": bool(capture.causal and capture.weights.shape[2] == capture.weights.shape[3]),
                "shape": list(capture.weights.shape),
                "data": pack_weights(capture.weights, capture.causal),
            }
        )
    return {
        "format": PAGE_FORMAT,
        "kind": first.kind,
        "self_attention": first.self_attention,
        "layers": first.n_layers,
        "heads": first.n_heads,
        "layer": layer,
        "head": head,
        "focus": None if focus is None else focus[0],
        "same_tokens": all([v.id for v in c.queries] == [v.id for v in first.queries] for c in captures),
        "panels": panels,
        "summary": None if summary is None else [s.to_json() for s in summary],
        "changes": None if changes is None else [c.to_json() for c in changes[:10]],
        "palette": [list(stop) for stop in palette.VIRIDIS],
        "labels": None if labels is None else [{"pattern": s.pattern, "score": round(s.score, 4)} for s in labels],
        "neuron": neuron,
    }


def neuron_data(qk, heads: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The q and k vectors of `heads` ((layer, head) pairs) for the page's neuron view, flat per head:
    q[T * hs], k[S * hs], keyed "LAYER.HEAD"; float32 values written with 6 significant digits."""

    def flat(a: np.ndarray) -> list[float]:
        return [float(f"{x:.6g}") for x in a.ravel().tolist()]

    return {
        "head_dim": qk.head_dim,
        "scale": 1.0 / float(np.sqrt(qk.head_dim)),
        "q": {f"{l}.{h}": flat(qk.q[l, h]) for l, h in heads},
        "k": {f"{l}.{h}": flat(qk.k[l, qk.key_head(h)]) for l, h in heads},
    }


def neuron_heads(qk, chosen: tuple[int, int]) -> list[tuple[int, int]]:
    """Every head when their q and k fit NEURON_BUDGET numbers, else only `chosen`."""
    L, H, T, hs = qk.q.shape
    if L * H * (T + qk.k.shape[2]) * hs <= NEURON_BUDGET:
        return [(l, h) for l in range(L) for h in range(H)]
    return [chosen]


def render_fragment(
    captures: Sequence[AttentionCapture],
    titles: Sequence[str],
    *,
    layer: int = 0,
    head: int = 0,
    focus: Sequence[int] | None = None,
    summary: Sequence[HeadSummary] | None = None,
    changes: Sequence[HeadChange] | None = None,
    heading: str | None = None,
    about: Sequence[str] | None = None,
    table: dict[str, Any] | None = None,
    labels: Sequence[HeadSummary] | None = None,
    neuron: dict[str, Any] | None = None,
) -> str:
    """The view as one `<div class="tfcli-view">` with its style and scripts: what a notebook shows, and
    what `render_page` puts in a document. `about` replaces the per-capture lines under the heading;
    `table` ({"title", "columns", "rows": a list of cells per panel}) is a small table whose row i shows
    panel i. Each call gets its own element id."""
    first = captures[0]
    heading = heading or f"attention of {first.run}"
    lines = [f"{kind_label(first)}, {first.n_layers} layers x {first.n_heads} heads"]
    if about is not None:
        lines.extend(about)
        lines.append(f"{excerpts([first.text], 80)[0]}: {len(first.queries)} tokens")
    for capture, title in zip(captures, titles) if about is None else ():
        lines.append(f"{title}: {len(capture.queries)} tokens" + ("" if capture.self_attention else f" over {len(capture.keys)} source tokens"))
        lines.extend(capture.notes)
    data = page_data(captures, titles, layer=layer, head=head, focus=focus, summary=summary, changes=changes, labels=labels, neuron=neuron)
    data["table"] = table
    fields = {
        "UID": f"tfcli-view-{secrets.token_hex(6)}",
        "TITLE": html.escape(heading, quote=True),
        "ABOUT": "".join(f"<li>{html.escape(line, quote=True)}</li>" for line in lines),
        "DATA": json_for_script(data),
        "STYLE": asset("page.css"),
        "SCRIPT": asset("page.js"),
    }
    # one pass over the template: a field's text (a title, the data) is never searched for another field
    return re.sub(r"@@(UID|TITLE|ABOUT|DATA|STYLE|SCRIPT)@@", lambda m: fields[m.group(1)], asset("page.html"))


def render_page(captures: Sequence[AttentionCapture], titles: Sequence[str], *, heading: str | None = None, **options: Any) -> str:
    """The whole page as a string: `render_fragment`'s view in a document of its own."""
    view = render_fragment(captures, titles, heading=heading, **options)
    fields = {"TITLE": html.escape(heading or f"attention of {captures[0].run}", quote=True), "VIEW": view}
    return re.sub(r"@@(TITLE|VIEW)@@", lambda m: fields[m.group(1)], asset("document.html"))


@functools.cache
def asset(name: str) -> str:
    """The text of one of the page's package data files (assets/page.html, page.css, page.js, document.html)."""
    return (resources.files("tfcli.inspect") / "assets" / name).read_text(encoding="utf-8")
