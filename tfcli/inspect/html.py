"""One self-contained HTML page of attention: a layer/head picker with a thumbnail of every head, a
heatmap, and the text's tokens, where hovering a token colours what it attends to and what attends to it.

No network: the weights travel inside the page, rounded to one byte each on a square-root scale (fine
steps where attention is small), only the causal lower triangle when the rest is masked, deflated and
base64-encoded layer by layer; the browser inflates them with its built-in `DecompressionStream`.

Untrusted text never becomes markup: the header is `html.escape`d, and everything else is JSON inside
`<script type="application/json">` with `<`, `>`, `&`, U+2028 and U+2029 escaped, put on the page with
`textContent` only. The page holds exactly two script elements: that data and the code.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfcli.inspect.capture import AttentionCapture
from tfcli.inspect.stats import HeadChange, HeadSummary
from tfcli.inspect.terminal import kind_label

PAGE_FORMAT = 1


def json_for_script(data: Any) -> str:
    """JSON safe to place inside a <script> element: no `<`, `>`, `&`, U+2028, U+2029 left raw.

    Example: json_for_script({"t": "</script>"}) -> '{"t": "\\u003c/script\\u003e"}'
    """
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
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
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(len(weights), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda layer: _pack_layer(layer, causal, level), weights))


def unpack_weights(data: list[str], shape: tuple[int, int, int, int], causal: bool) -> np.ndarray:
    """The inverse of pack_weights (what the page does), for tests: float32 [L, H, T, S]."""
    L, H, T, S = shape
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


def page_data(captures: Sequence[AttentionCapture], titles: Sequence[str], *, layer: int, head: int,
              focus: Sequence[int] | None = None, summary: Sequence[HeadSummary] | None = None,
              changes: Sequence[HeadChange] | None = None) -> dict[str, Any]:
    """focus: the --token query position in each capture (each text has its own)."""
    first = captures[0]
    panels = []
    for index, (capture, title) in enumerate(zip(captures, titles)):
        panels.append({
            "title": title,
            "focus": None if focus is None else focus[index],
            "queries": [v.text for v in capture.queries],
            "keys": None if capture.self_attention else [v.text for v in capture.keys],
            "causal": bool(capture.causal and capture.weights.shape[2] == capture.weights.shape[3]),
            "shape": list(capture.weights.shape),
            "data": pack_weights(capture.weights, capture.causal),
        })
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
    }


def render_page(captures: Sequence[AttentionCapture], titles: Sequence[str], *, layer: int = 0, head: int = 0,
                focus: Sequence[int] | None = None, summary: Sequence[HeadSummary] | None = None,
                changes: Sequence[HeadChange] | None = None) -> str:
    """The whole page as a string."""
    first = captures[0]
    heading = f"attention of {first.run}"
    about = [f"{kind_label(first)}, {first.n_layers} layers x {first.n_heads} heads"]
    for capture, title in zip(captures, titles):
        about.append(f"{title}: {len(capture.queries)} tokens" + ("" if capture.self_attention else f" over {len(capture.keys)} source tokens"))
        about.extend(capture.notes)
    data = page_data(captures, titles, layer=layer, head=head, focus=focus, summary=summary, changes=changes)
    fields = {
        "TITLE": html.escape(heading, quote=True),
        "ABOUT": "".join(f"<li>{html.escape(line, quote=True)}</li>" for line in about),
        "DATA": json_for_script(data),
        "STYLE": _STYLE,
        "SCRIPT": _SCRIPT,
    }
    return re.sub(r"@@(TITLE|ABOUT|DATA|STYLE|SCRIPT)@@", lambda m: fields[m.group(1)], _TEMPLATE)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>@@TITLE@@</title>
<style>@@STYLE@@</style>
</head>
<body>
<header>
<h1>@@TITLE@@</h1>
<ul class="about">@@ABOUT@@</ul>
</header>
<nav id="controls">
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<span class="hint">hover a token (or the map) to see what it attends to and what attends to it; click to hold it</span>
</nav>
<section id="thumbs" aria-label="every head of this layer"></section>
<section id="extra"></section>
<main id="panels"></main>
<p id="problem" hidden></p>
<script type="application/json" id="tfcli-data">@@DATA@@</script>
<script>@@SCRIPT@@</script>
</body>
</html>
"""

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.2em; color: #1f2430; background: #fff; }
h1 { font-size: 1.25em; margin: 0 0 .3em; word-break: break-all; }
ul.about { margin: 0 0 .8em; padding-left: 1.2em; color: #555; }
nav { position: sticky; top: 0; background: #fff; padding: .4em 0; border-bottom: 1px solid #ddd; z-index: 2; }
nav label { margin-right: 1em; }
.hint { color: #777; font-size: .9em; }
#thumbs { display: flex; flex-wrap: wrap; gap: 6px; margin: .6em 0; }
.thumb { text-align: center; font-size: 11px; cursor: pointer; border: 2px solid transparent; padding: 2px; }
.thumb.on { border-color: #2563eb; }
.thumb canvas { display: block; width: 72px; height: 72px; image-rendering: pixelated; background: #f4f4f4; }
#panels { display: flex; flex-wrap: wrap; gap: 2em; }
.panel { flex: 1 1 520px; min-width: 320px; }
.panel h2 { font-size: 1.05em; margin: .4em 0; word-break: break-all; }
.map { image-rendering: pixelated; border: 1px solid #ccc; cursor: crosshair; max-width: 100%; }
.status { font-family: ui-monospace, monospace; min-height: 1.5em; white-space: pre-wrap; word-break: break-all; }
.tokens { font-family: ui-monospace, monospace; line-height: 2; margin: .3em 0 1em; }
.tokens span { white-space: pre; padding: 1px 0; border-radius: 3px; cursor: pointer; }
.tokens span.focus { outline: 2px solid #111; }
.tokens h3 { font: 600 .9em system-ui, sans-serif; margin: .2em 0; }
table.small { border-collapse: collapse; font-size: 12px; margin: .5em 0; }
table.small td, table.small th { padding: 1px 8px; text-align: right; }
table.small tr { cursor: pointer; }
table.small tr:hover { background: #eef; }
#problem { color: #b00; font-weight: 600; }
"""

_SCRIPT = r"""
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("tfcli-data").textContent);
  const $ = (id) => document.getElementById(id);
  const make = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  };
  // the focus (query q, key k) is per panel; panels over the same tokens (one text, two runs) share it
  const state = { layer: DATA.layer, head: DATA.head, held: DATA.focus !== null };

  async function inflate(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i !== bin.length; i++) bytes[i] = bin.charCodeAt(i);
    if (typeof DecompressionStream === "undefined") throw new Error("this browser has no DecompressionStream; open the page in a current Firefox, Chrome or Safari");
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  function Panel(spec, layers) {
    const [L, H, T, S] = spec.shape;
    this.spec = spec; this.layers = layers; this.T = T; this.S = S; this.H = H;
    this.causal = spec.causal;
    this.perHead = spec.causal ? T * (T + 1) / 2 : T * S;
    this.queries = spec.queries;
    this.keys = spec.keys || spec.queries;
    this.q = spec.focus !== null && spec.focus < T ? spec.focus : null;
    this.k = DATA.self_attention && this.q !== null ? this.q : null;  // the focus token is a query
  }
  // sqrt-scaled byte of (query q, key k) in the current head: 0..255
  Panel.prototype.level = function (q, k) {
    if (this.causal && k > q) return 0;
    const base = state.head * this.perHead;
    return this.layers[state.layer][base + (this.causal ? q * (q + 1) / 2 + k : q * this.S + k)];
  };
  Panel.prototype.weight = function (q, k) { const v = this.level(q, k) / 255; return v * v; };

  function colour(v) {  // v = sqrt(weight) in 0..1: white to deep blue
    return [Math.round(255 - v * 225), Math.round(255 - v * 175), Math.round(255 - v * 95)];
  }

  function drawMap(panel, canvas, layer, head, size) {
    const T = panel.T, S = panel.S;
    const w = size ? Math.min(size, S) : S, h = size ? Math.min(size, T) : T;
    canvas.width = w; canvas.height = h;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(w, h);
    const saved = [state.layer, state.head];
    state.layer = layer; state.head = head;
    for (let y = 0; y !== h; y++) {
      const q = Math.floor(y * T / h);
      for (let x = 0; x !== w; x++) {
        const k = Math.floor(x * S / w);
        const c = colour(panel.level(q, k) / 255);
        const i = (y * w + x) * 4;
        img.data[i] = c[0]; img.data[i + 1] = c[1]; img.data[i + 2] = c[2]; img.data[i + 3] = 255;
      }
    }
    [state.layer, state.head] = saved;
    ctx.putImageData(img, 0, 0);
  }

  const panels = [];

  function paintTokens() {
    for (const p of panels) {
      const q = p.q, k = p.k;
      p.keySpans.forEach((span, i) => {
        const v = (q === null || q >= p.T) ? 0 : p.level(q, i) / 255;
        span.style.background = v ? "rgba(37,99,235," + v.toFixed(3) + ")" : "";
        span.style.color = v > 0.65 ? "#fff" : "";
        span.classList.toggle("focus", DATA.self_attention ? i === q : i === k);
      });
      p.querySpans.forEach((span, i) => {
        const v = (k === null || k >= p.S) ? 0 : p.level(i, k) / 255;
        span.style.background = v ? "rgba(234,88,12," + v.toFixed(3) + ")" : "";
        span.style.color = v > 0.65 ? "#fff" : "";
        span.classList.toggle("focus", DATA.self_attention ? i === k : i === q);
      });
      const qLabel = q === null ? null : p.queries[q], kLabel = k === null ? null : p.keys[k];
      p.toTitle.textContent = qLabel === null || qLabel === undefined ? "what a token attends to (hover one)" : "what \u201c" + qLabel + "\u201d (" + q + ") attends to";
      p.byTitle.textContent = kLabel === null || kLabel === undefined ? "what attends to a token" : "what attends to \u201c" + kLabel + "\u201d (" + k + ")";
    }
  }

  function setFocus(panel, q, k, hold) {
    if (state.held && !hold) return;
    for (const p of panels) {
      if (p === panel || DATA.same_tokens) { p.q = q; p.k = k; }
    }
    paintTokens();
  }

  function tokenBlock(panel, labels, title, role) {
    const box = make("div", null, "tokens");
    const heading = make("h3", title);
    box.appendChild(heading);
    const spans = labels.map((label, i) => {
      const span = make("span", label);
      span.title = "#" + i;
      const focus = () => DATA.self_attention ? [i, i] : (role === "key" ? [panel.q, i] : [i, panel.k]);
      span.addEventListener("mouseenter", () => { const f = focus(); setFocus(panel, f[0], f[1], false); });
      span.addEventListener("click", () => {
        const f = focus();
        const same = state.held && panel.q === f[0] && panel.k === f[1];
        state.held = false;
        setFocus(panel, f[0], f[1], true);
        state.held = !same;
      });
      box.appendChild(span);
      return span;
    });
    return [box, spans, heading];
  }

  function buildPanel(panel) {
    const root = make("section", null, "panel");
    root.appendChild(make("h2", panel.spec.title));
    const canvas = make("canvas", null, "map");
    const n = Math.max(panel.T, panel.S);
    const scale = n >= 560 ? 560 / n : Math.max(1, Math.floor(560 / n));
    canvas.style.width = Math.round(panel.S * scale) + "px";
    canvas.style.height = Math.round(panel.T * scale) + "px";
    root.appendChild(canvas);
    const status = make("div", "", "status");
    root.appendChild(status);
    canvas.addEventListener("mousemove", (ev) => {
      const r = canvas.getBoundingClientRect();
      const k = Math.min(panel.S - 1, Math.floor((ev.clientX - r.left) / r.width * panel.S));
      const q = Math.min(panel.T - 1, Math.floor((ev.clientY - r.top) / r.height * panel.T));
      status.textContent = "\u201c" + panel.queries[q] + "\u201d (" + q + ") \u2192 \u201c" + panel.keys[k] + "\u201d (" + k + "): " + (100 * panel.weight(q, k)).toFixed(1) + "%";
      setFocus(panel, q, DATA.self_attention ? q : k, false);
    });
    canvas.addEventListener("click", () => { state.held = !state.held; });
    const to = tokenBlock(panel, panel.keys, "", "key");
    const by = tokenBlock(panel, panel.queries, "", "query");
    root.appendChild(to[0]); root.appendChild(by[0]);
    panel.canvas = canvas; panel.keySpans = to[1]; panel.toTitle = to[2]; panel.querySpans = by[1]; panel.byTitle = by[2];
    $("panels").appendChild(root);
  }

  function drawThumbs() {
    const box = $("thumbs");
    box.textContent = "";
    for (let h = 0; h !== DATA.heads; h++) {
      const cell = make("div", null, "thumb" + (h === state.head ? " on" : ""));
      const c = make("canvas");
      drawMap(panels[0], c, state.layer, h, 72);
      cell.appendChild(c);
      cell.appendChild(make("div", "head " + h));
      cell.addEventListener("click", () => select(state.layer, h));
      box.appendChild(cell);
    }
  }

  function select(layer, head) {
    state.layer = layer; state.head = head;
    $("layer").value = String(layer); $("head").value = String(head);
    for (const p of panels) drawMap(p, p.canvas, layer, head, 0);
    drawThumbs();
    paintTokens();
  }

  function smallTable(title, columns, rows, pick) {
    const box = make("div");
    box.appendChild(make("h3", title));
    const table = make("table", null, "small");
    const head = make("tr");
    columns.forEach((c) => head.appendChild(make("th", c)));
    table.appendChild(head);
    rows.forEach((row) => {
      const tr = make("tr");
      row.cells.forEach((c) => tr.appendChild(make("td", c)));
      tr.addEventListener("click", () => select(row.layer, row.head));
      table.appendChild(tr);
    });
    box.appendChild(table);
    return box;
  }

  async function start() {
    for (let l = 0; l !== DATA.layers; l++) $("layer").appendChild(make("option", String(l))).value = String(l);
    for (let h = 0; h !== DATA.heads; h++) $("head").appendChild(make("option", String(h))).value = String(h);
    $("layer").addEventListener("change", (e) => select(Number(e.target.value), state.head));
    $("head").addEventListener("change", (e) => select(state.layer, Number(e.target.value)));
    for (const spec of DATA.panels) {
      const panel = new Panel(spec, await Promise.all(spec.data.map(inflate)));
      panels.push(panel);
      buildPanel(panel);
    }
    const fmt = (v) => v === null ? "-" : Number(v).toFixed(3);
    if (DATA.changes) {
      $("extra").appendChild(smallTable("heads that changed most (click to show)", ["layer", "head", "JS divergence", "total variation"],
        DATA.changes.map((c) => ({ layer: c.layer, head: c.head, cells: [c.layer, c.head, fmt(c.js_bits), fmt(c.total_variation)] }))));
    }
    if (DATA.summary) {
      $("extra").appendChild(smallTable("head summary (click to show)", ["layer", "head", "entropy", "distance", "pattern", "score"],
        DATA.summary.map((s) => ({ layer: s.layer, head: s.head, cells: [s.layer, s.head, fmt(s.entropy_bits), fmt(s.mean_distance), s.pattern, fmt(s.score)] }))));
    }
    select(state.layer, state.head);
  }

  start().catch((err) => { const p = $("problem"); p.hidden = false; p.textContent = "could not show the weights: " + err.message; });
})();
"""
