"use strict";
// The attention page's code: inlined into every page by tfcli/inspect/html.py, run under node by the tests.
// Every piece of text reaches the page through textContent or a text node: nothing is parsed as markup.
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
  const state = { layer: DATA.layer, head: DATA.head, held: DATA.focus !== null, cell: 0 };
  // map cell sizes in CSS pixels that the zoom buttons step through; a long text starts at MIN_CELL and scrolls
  const ZOOMS = [1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64];
  const MIN_CELL = 8, FIT = 560, LABEL_ROOM = 80, LABEL_FONT = 11;

  async function inflate(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i !== bin.length; i++) bytes[i] = bin.charCodeAt(i);
    if (typeof DecompressionStream === "undefined") throw new Error("this browser has no DecompressionStream; open the page in a current Firefox, Chrome or Safari");
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // A token is a list of pieces: plain text, or [kind, text, tooltip] for what must stand out
  // ("c": an invisible or acting character as a badge, "p": part of a character a later token completes,
  // "pc": part of a badged one, "x": a byte that is not UTF-8).
  const PIECE_CLASS = { c: "badge", p: "part", pc: "badge part", x: "byte" };
  function fill(el, pieces, blank) {
    if (blank && pieces.length === 1 && typeof pieces[0] === "string" && !pieces[0].trim()) {
      el.appendChild(document.createTextNode("\u2423".repeat(pieces[0].length)));  // an axis label of spaces: ␣
      return el;
    }
    for (const piece of pieces) {
      if (typeof piece === "string") { el.appendChild(document.createTextNode(piece)); continue; }
      const mark = make("span", piece[1], PIECE_CLASS[piece[0]] || "badge");
      mark.title = piece[2];
      el.appendChild(mark);
    }
    return el;
  }
  const tokenNode = (pieces) => fill(make("span", null, "tok"), pieces || [], true);
  // a line of text and tokens: say(el, ["what ", pieces, " attends to"])
  function say(el, parts) {
    el.textContent = "";
    for (const part of parts) el.appendChild(typeof part === "string" ? document.createTextNode(part) : tokenNode(part));
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
    this.pointK = null;  // the key under the pointer while it is over the map
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
      const qLabel = q === null ? undefined : p.queries[q], kLabel = k === null ? undefined : p.keys[k];
      if (qLabel === undefined) say(p.toTitle, ["what a token attends to (hover one)"]);
      else say(p.toTitle, ["what \u201c", qLabel, "\u201d (" + q + ") attends to"]);
      if (kLabel === undefined) say(p.byTitle, ["what attends to a token"]);
      else say(p.byTitle, ["what attends to \u201c", kLabel, "\u201d (" + k + ")"]);
      markAxes(p);
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
      const span = fill(make("span"), label, false);
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

  // ---- the map: a canvas of T x S cells, token labels on both axes, in its own scroll area -------------

  function defaultCell(panel) {
    const n = Math.max(panel.T, panel.S);
    return Math.max(MIN_CELL, Math.min(64, Math.floor(FIT / n)));
  }

  // every `step`-th token is labelled so that labels never overlap; the hovered row and column always are
  const labelStep = (cell) => Math.max(1, Math.ceil((LABEL_FONT + 1) / cell));

  function axisLabel(pieces, cls) {
    const label = make("div", null, "lab " + cls);
    label.appendChild(tokenNode(pieces));
    return label;
  }

  function layoutMap(panel) {
    const cell = state.cell, step = labelStep(cell), band = step * cell;
    panel.canvas.style.width = panel.S * cell + "px";
    panel.canvas.style.height = panel.T * cell + "px";
    panel.plot.style.width = panel.S * cell + "px";
    panel.plot.style.height = panel.T * cell + "px";
    panel.xAxis.style.width = panel.S * cell + "px";
    panel.yAxis.style.height = panel.T * cell + "px";
    panel.xAxis.textContent = ""; panel.yAxis.textContent = "";
    const font = Math.min(LABEL_FONT, Math.max(band - 1, 6)) + "px";
    for (let k = 0; k < panel.S; k += step) {
      const label = axisLabel(panel.keys[k], "x");
      Object.assign(label.style, { left: k * cell + "px", width: band + "px", lineHeight: band + "px", fontSize: font });
      panel.xAxis.appendChild(label);
    }
    for (let q = 0; q < panel.T; q += step) {
      const label = axisLabel(panel.queries[q], "y");
      Object.assign(label.style, { top: q * cell + "px", height: band + "px", lineHeight: band + "px", fontSize: font });
      panel.yAxis.appendChild(label);
    }
    panel.hotX = panel.xAxis.appendChild(make("div", null, "lab x hot"));
    panel.hotY = panel.yAxis.appendChild(make("div", null, "lab y hot"));
    markAxes(panel);
  }

  // the focused query's row and key's column (the key under the pointer, on the map): a band over the map
  // and its label, whatever the zoom
  function markAxes(p) {
    if (!p.hotX) return;
    const cell = state.cell, hot = Math.max(cell, LABEL_FONT + 4);
    const key = p.pointK !== null ? p.pointK : p.k;
    const k = key !== null && key < p.S ? key : null, q = p.q !== null && p.q < p.T ? p.q : null;
    p.hotX.hidden = k === null; p.colBand.hidden = k === null;
    p.hotY.hidden = q === null; p.rowBand.hidden = q === null;
    if (k !== null) {
      p.hotX.textContent = ""; p.hotX.appendChild(tokenNode(p.keys[k]));
      Object.assign(p.hotX.style, { left: k * cell + cell / 2 - hot / 2 + "px", width: hot + "px", lineHeight: hot + "px" });
      Object.assign(p.colBand.style, { left: k * cell + "px", width: cell + "px" });
    }
    if (q !== null) {
      p.hotY.textContent = ""; p.hotY.appendChild(tokenNode(p.queries[q]));
      Object.assign(p.hotY.style, { top: q * cell + cell / 2 - hot / 2 + "px", height: hot + "px", lineHeight: hot + "px" });
      Object.assign(p.rowBand.style, { top: q * cell + "px", height: cell + "px" });
    }
  }

  function setZoom(cell) {
    state.cell = cell;
    $("zoom-size").textContent = cell + " px per token";
    for (const p of panels) {
      layoutMap(p);
      // keep the focused cell in view
      if (p.q !== null && p.box.clientHeight) p.box.scrollTop = Math.max(0, (p.q + 0.5) * cell - p.box.clientHeight / 2);
      if (p.k !== null && p.box.clientWidth) p.box.scrollLeft = Math.max(0, (p.k + 0.5) * cell - p.box.clientWidth / 2);
    }
  }

  function zoomStep(direction) {
    const cell = state.cell;
    const next = direction > 0 ? ZOOMS.find((z) => z > cell) : ZOOMS.slice().reverse().find((z) => z < cell);
    if (next !== undefined) setZoom(next);
  }

  function buildPanel(panel) {
    const root = make("section", null, "panel");
    root.appendChild(make("h2", panel.spec.title));
    const box = make("div", null, "mapbox");
    const grid = make("div", null, "mapgrid");
    const corner = make("div", "keys \u2192\nqueries \u2193", "corner");
    const xAxis = make("div", null, "xaxis"), yAxis = make("div", null, "yaxis");
    const plot = make("div", null, "plot");
    const canvas = make("canvas", null, "map");
    const rowBand = make("div", null, "band row"), colBand = make("div", null, "band col");
    plot.appendChild(canvas); plot.appendChild(rowBand); plot.appendChild(colBand);
    grid.appendChild(corner); grid.appendChild(xAxis); grid.appendChild(yAxis); grid.appendChild(plot);
    box.appendChild(grid);
    root.appendChild(box);
    const status = make("div", "", "status");
    root.appendChild(status);
    canvas.addEventListener("mousemove", (ev) => {
      const r = canvas.getBoundingClientRect();
      const k = Math.max(0, Math.min(panel.S - 1, Math.floor((ev.clientX - r.left) / r.width * panel.S)));
      const q = Math.max(0, Math.min(panel.T - 1, Math.floor((ev.clientY - r.top) / r.height * panel.T)));
      say(status, ["\u201c", panel.queries[q], "\u201d (" + q + ") \u2192 \u201c", panel.keys[k], "\u201d (" + k + "): " + (100 * panel.weight(q, k)).toFixed(1) + "%"]);
      if (!state.held) panel.pointK = k;
      setFocus(panel, q, DATA.self_attention ? q : k, false);
    });
    canvas.addEventListener("mouseleave", () => { panel.pointK = null; markAxes(panel); });
    canvas.addEventListener("click", () => { state.held = !state.held; });
    const to = tokenBlock(panel, panel.keys, "", "key");
    const by = tokenBlock(panel, panel.queries, "", "query");
    root.appendChild(to[0]); root.appendChild(by[0]);
    Object.assign(panel, { root, canvas, box, plot, xAxis, yAxis, rowBand, colBand, status });
    panel.keySpans = to[1]; panel.toTitle = to[2]; panel.querySpans = by[1]; panel.byTitle = by[2];
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

  function smallTable(title, columns, rows) {
    const box = make("div");
    box.appendChild(make("h3", title));
    const table = make("table", null, "small");
    const head = make("tr");
    columns.forEach((c) => head.appendChild(make("th", c)));
    table.appendChild(head);
    rows.forEach((row) => {
      const tr = make("tr");
      row.cells.forEach((c) => tr.appendChild(make("td", c)));
      tr.addEventListener("click", () => row.panel !== undefined ? panels[row.panel].root.scrollIntoView() : select(row.layer, row.head));
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
    $("zoom-in").addEventListener("click", () => zoomStep(1));
    $("zoom-out").addEventListener("click", () => zoomStep(-1));
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
    if (DATA.table) {  // a row per panel (e.g. a head's scores at each checkpoint): click to scroll to it
      $("extra").appendChild(smallTable(DATA.table.title, DATA.table.columns, DATA.table.rows.map((cells, i) => ({ panel: i, cells }))));
    }
    setZoom(Math.min(...panels.map(defaultCell)));
    select(state.layer, state.head);
  }

  start().catch((err) => { const p = $("problem"); p.hidden = false; p.textContent = "could not show the weights: " + err.message; });
})();
