"use strict";
// The attention page's code: inlined into every page by tfcli/inspect/html.py, run under node by the tests.
// Every piece of text reaches the page through textContent or a text node: nothing is parsed as markup.
// Several views can share one document (a notebook): each script finds its own view (the element around
// it) and every part of it inside that view, by data-part, so no two views read or draw each other's.
(function (script) {
  const root = script.closest(".tfcli-view");
  const $ = (part) => root.querySelector('[data-part="' + part + '"]');
  const DATA = JSON.parse($("data").textContent);
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
  // As a label (`label`: an axis, a title), a space at either end of a token shows as ␣, as tables and
  // pictures show it (tokenizer.show.label_text); the text's own token strip shows the text as it reads.
  const spaces = (run) => "\u2423".repeat(run.length);
  function fill(el, pieces, label) {
    const last = pieces.length - 1;
    for (const [i, piece] of pieces.entries()) {
      if (typeof piece === "string") {
        let text = piece;
        if (label && i === 0) text = text.replace(/^ +/, spaces);
        if (label && i === last) text = text.replace(/ +$/, spaces);
        el.appendChild(document.createTextNode(text));
        continue;
      }
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
    return el;
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

  // v = sqrt(weight) in 0..1 -> [r, g, b] on the page's colour map (viridis, the PNGs' map, sent with the data)
  const STOPS = DATA.palette;
  function colour(v) {
    const x = Math.min(Math.max(v, 0), 1) * (STOPS.length - 1), i = Math.min(Math.floor(x), STOPS.length - 2), f = x - i;
    const a = STOPS[i], b = STOPS[i + 1];
    return [Math.round(a[0] + (b[0] - a[0]) * f), Math.round(a[1] + (b[1] - a[1]) * f), Math.round(a[2] + (b[2] - a[2]) * f)];
  }
  const css = (c) => "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")";
  const dark = (v) => v < 0.6;  // viridis' dark end: white text on it
  const percent = (w) => Number((100 * w).toPrecision(3)) + "%";

  const MASKED = [238, 238, 238];  // keys a causal query may not see: light grey, as in the PNGs

  // one head's map at one pixel per cell
  function drawMap(panel, canvas, layer, head) {
    const T = panel.T, S = panel.S;
    canvas.width = S; canvas.height = T;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(S, T);
    const saved = [state.layer, state.head];
    state.layer = layer; state.head = head;
    for (let q = 0; q !== T; q++) {
      for (let k = 0; k !== S; k++) {
        const c = panel.causal && k > q ? MASKED : colour(panel.level(q, k) / 255);
        const i = (q * S + k) * 4;
        img.data[i] = c[0]; img.data[i + 1] = c[1]; img.data[i + 2] = c[2]; img.data[i + 3] = 255;
      }
    }
    [state.layer, state.head] = saved;
    ctx.putImageData(img, 0, 0);
  }

  // a thumbnail `size` pixels across: each pixel the largest weight of the cells it covers, so a thin
  // diagonal (a previous-token head) stays visible at 512 tokens
  function drawThumb(panel, canvas, layer, head, size) {
    const T = panel.T, S = panel.S, w = Math.min(size, S), h = Math.min(size, T);
    canvas.width = w; canvas.height = h;
    const top = new Int16Array(w * h).fill(-1);
    const bytes = panel.layers[layer], base = head * panel.perHead;
    for (let q = 0; q !== T; q++) {
      const y = Math.floor(q * h / T), row = panel.causal ? base + q * (q + 1) / 2 : base + q * S, end = panel.causal ? q + 1 : S;
      for (let k = 0; k !== end; k++) {
        const at = y * w + Math.floor(k * w / S), v = bytes[row + k];
        if (v > top[at]) top[at] = v;
      }
    }
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(w, h);
    for (let at = 0; at !== w * h; at++) {
      const c = top[at] < 0 ? MASKED : colour(top[at] / 255);
      img.data[at * 4] = c[0]; img.data[at * 4 + 1] = c[1]; img.data[at * 4 + 2] = c[2]; img.data[at * 4 + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  // the colour bar: the map from 0 to 1 on its square-root scale, with ticks at the weights they stand for
  function drawLegend() {
    const box = $("legend");
    box.textContent = "";
    box.appendChild(make("span", "attention weight"));
    const bar = make("span", null, "bar");
    const canvas = make("canvas");
    canvas.width = 110; canvas.height = 1;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(110, 1);
    for (let x = 0; x !== 110; x++) {
      const c = colour(x / 109);
      img.data.set([c[0], c[1], c[2], 255], x * 4);
    }
    ctx.putImageData(img, 0, 0);
    bar.appendChild(canvas);
    for (const w of [0, 0.05, 0.25, 0.5, 1]) {
      const tick = make("span", String(w), "tick");
      tick.style.left = (Math.sqrt(w) * 100).toFixed(1) + "%";
      bar.appendChild(tick);
    }
    box.appendChild(bar);
    box.title = "viridis on a square-root scale (small weights stay visible); grey: masked";
  }

  const panels = [];

  function paintTokens() {
    for (const p of panels) {
      const q = p.q, k = p.k;
      const paint = (span, i, v, on) => {
        span.style.background = v ? css(colour(v)) : "";
        span.style.color = v && dark(v) ? "#fff" : "";
        span.title = "#" + i + (on ? ": " + percent(v * v) : "");
      };
      p.keySpans.forEach((span, i) => {
        const on = q !== null && q < p.T && !(p.causal && i > q);
        paint(span, i, on ? p.level(q, i) / 255 : 0, on);
        span.classList.toggle("focus", DATA.self_attention ? i === q : i === k);
      });
      p.querySpans.forEach((span, i) => {
        const on = k !== null && k < p.S && !(p.causal && k > i);
        paint(span, i, on ? p.level(i, k) / 255 : 0, on);
        span.classList.toggle("focus", DATA.self_attention ? i === k : i === q);
      });
      const qLabel = q === null ? undefined : p.queries[q], kLabel = k === null ? undefined : p.keys[k];
      if (qLabel === undefined) say(p.toTitle, ["what a token attends to (hover one)"]);
      else say(p.toTitle, ["what \u201c", qLabel, "\u201d (" + q + ") attends to"]);
      if (kLabel === undefined) say(p.byTitle, ["what attends to a token"]);
      else say(p.byTitle, ["what attends to \u201c", kLabel, "\u201d (" + k + ")"]);
      markAxes(p);
    }
    drawNeuron();
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

  // ---- model view: every layer x head as a thumbnail, each drawn once it scrolls into view ------------

  const THUMB = 64;
  const SHORT = { "previous-token": "prev", "first-token": "first", duplicate: "dup", induction: "induct" };
  const labelOf = (layer, head) => DATA.labels ? DATA.labels[layer * DATA.heads + head] : null;

  function buildModelView() {
    const box = $("model");
    box.appendChild(make("h3", "model view: every layer \u00d7 head (click a head, or move with the arrow keys and press Enter, to open it below)"));
    const grid = make("div", null, "mgrid");
    grid.style.gridTemplateColumns = "4.5em repeat(" + DATA.heads + ", minmax(40px, " + THUMB + "px))";
    grid.setAttribute("role", "grid");
    grid.appendChild(make("div", "", "collab"));
    for (let h = 0; h !== DATA.heads; h++) grid.appendChild(make("div", "head " + h, "collab"));
    const status = make("div", "", "mstatus");
    state.thumbs = [];
    const draw = (cell) => {
      if (cell.drawn) return;
      cell.drawn = true; cell.div.dataset.drawn = "1";
      drawThumb(panels[0], cell.canvas, cell.layer, cell.head, THUMB);
    };
    const observer = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver((entries) => {
      for (const e of entries) if (e.isIntersecting) { draw(e.target.cell); observer.unobserve(e.target); }
    }, { rootMargin: "200px" });
    for (let l = 0; l !== DATA.layers; l++) {
      grid.appendChild(make("div", "layer " + l, "rowlab"));
      for (let h = 0; h !== DATA.heads; h++) {
        const div = make("div", null, "mthumb");
        div.tabIndex = -1;
        div.setAttribute("role", "gridcell");
        div.dataset.layer = String(l); div.dataset.head = String(h);
        const canvas = div.appendChild(make("canvas"));
        const found = labelOf(l, h);
        let tip = "layer " + l + ", head " + h;
        if (found) {
          tip += ": " + (found.pattern === "none" ? "no known pattern" : found.pattern) + " (best score " + Number(found.score).toFixed(2) + ")";
          if (found.pattern !== "none") div.appendChild(make("span", SHORT[found.pattern] || found.pattern, "tag"));
        }
        div.title = tip;
        const cell = { div, canvas, layer: l, head: h, drawn: false };
        div.cell = cell;
        div.addEventListener("click", () => open(l, h));
        div.addEventListener("mouseenter", () => { status.textContent = tip; });
        div.addEventListener("keydown", (ev) => {
          const moves = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
          if (moves[ev.key]) {
            const nl = Math.min(Math.max(l + moves[ev.key][0], 0), DATA.layers - 1), nh = Math.min(Math.max(h + moves[ev.key][1], 0), DATA.heads - 1);
            const next = state.thumbs[nl * DATA.heads + nh];
            div.tabIndex = -1; next.div.tabIndex = 0; next.div.focus(); status.textContent = next.div.title;
            ev.preventDefault();
          } else if (ev.key === "Enter" || ev.key === " ") { open(l, h); ev.preventDefault(); }
        });
        state.thumbs.push(cell);
        grid.appendChild(div);
        if (observer) observer.observe(div); else draw(cell);
      }
    }
    box.appendChild(grid);
    box.appendChild(status);
  }

  function open(layer, head) {
    select(layer, head);
    const target = panels[0].root;
    if (target.scrollIntoView) target.scrollIntoView({ block: "nearest" });
  }

  function markThumbs() {
    for (const cell of state.thumbs || []) {
      const on = cell.layer === state.layer && cell.head === state.head;
      cell.div.classList.toggle("on", on);
      if (on) cell.div.tabIndex = 0; else cell.div.tabIndex = -1;
    }
  }

  function select(layer, head) {
    state.layer = layer; state.head = head;
    $("layer").value = String(layer); $("head").value = String(head);
    for (const p of panels) drawMap(p, p.canvas, layer, head);
    markThumbs();
    paintTokens();
  }

  // ---- neuron view: softmax(q·k/√d) for the focused query of the first panel, with the actual numbers ---

  function signed(v, scale) {  // blue below 0, white at 0, red above (RdBu, as the PNGs' signed maps)
    const f = scale > 0 ? Math.min(Math.abs(v) / scale, 1) : 0, base = v > 0 ? [178, 24, 43] : [33, 102, 172];
    return base.map((c) => Math.round(255 + (c - 255) * f));
  }

  function strip(values, rows, cols, scale, describe, status) {
    const canvas = make("canvas", null, "strip");
    canvas.width = cols; canvas.height = rows;
    canvas.style.width = cols * 6 + "px"; canvas.style.height = rows * 16 + "px";
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(cols, rows);
    for (let i = 0; i !== rows * cols; i++) img.data.set([...signed(values[i], scale), 255], i * 4);
    ctx.putImageData(img, 0, 0);
    canvas.addEventListener("mousemove", (ev) => {
      const r = canvas.getBoundingClientRect();
      const c = Math.max(0, Math.min(cols - 1, Math.floor((ev.clientX - r.left) / r.width * cols)));
      const row = Math.max(0, Math.min(rows - 1, Math.floor((ev.clientY - r.top) / r.height * rows)));
      say(status, describe(row, c, values[row * cols + c]));
    });
    return canvas;
  }

  function drawNeuron() {
    const box = $("neuron"), spec = DATA.neuron;
    if (!box || !panels.length) return;
    box.textContent = "";
    box.appendChild(make("h3", "neuron view: how layer " + state.layer + ", head " + state.head + " weighs each key for one query"));
    const key = state.layer + "." + state.head;
    if (!spec || !spec.q[key]) {
      box.appendChild(make("p", spec ? "this page carries the query and key vectors of " + Object.keys(spec.q).join(", ") + " only (to stay small); --neuron LAYER.HEAD picks the head" : "no query and key vectors in this page", "nnote"));
      return;
    }
    const p = panels[0], d = spec.head_dim, q = p.q === null ? p.T - 1 : p.q;
    const Q = spec.q[key], K = spec.k[key];
    const qv = Q.slice(q * d, q * d + d), n = p.causal ? q + 1 : p.S;
    const products = new Float64Array(n * d), scores = new Float64Array(n);
    for (let j = 0; j !== n; j++) {
      let sum = 0;
      for (let i = 0; i !== d; i++) { const v = qv[i] * K[j * d + i]; products[j * d + i] = v; sum += v; }
      scores[j] = sum * spec.scale;
    }
    const top = Math.max(...scores), exps = Array.from(scores, (s) => Math.exp(s - top)), total = exps.reduce((a, b) => a + b, 0);
    const weights = exps.map((e) => e / total);
    box.appendChild(say(make("p", null, "nnote"), ["query \u201c", p.queries[q], "\u201d (" + q + "; hover a token above or click it to hold another): weight = softmax(q\u00b7k / \u221a" + d + "), q\u00b7k = \u03a3 q\u1d62k\u1d62" + (p.causal && n < p.S ? "; the " + (p.S - n) + " later keys are masked" : "")]));
    const status = make("div", "hover the strips for their numbers (blue below 0, red above)", "nstatus");
    const grid = make("div", null, "ngrid");
    const strips = Math.max(d * 6, 48) + "px ";
    grid.style.gridTemplateColumns = "auto " + strips + strips + "auto auto auto";
    ["key", "k", "q \u2218 k", "q\u00b7k", "q\u00b7k/\u221ad", "softmax"].forEach((t) => grid.appendChild(make("div", t, "nh")));
    const kScale = Math.max(1e-12, ...Array.from(K.slice(0, n * d), Math.abs)), pScale = Math.max(1e-12, ...Array.from(products, Math.abs));
    grid.appendChild(make("div", "q", "nk"));
    const qCanvas = strip(qv, 1, d, Math.max(1e-12, ...qv.map(Math.abs)), (r, c, v) => ["q[" + c + "] = " + v.toFixed(5)], status);
    const qCell = make("div"); qCell.appendChild(qCanvas); grid.appendChild(qCell);
    for (let t = 0; t < 4; t++) grid.appendChild(make("div", ""));
    const kCell = make("div"), pCell = make("div");
    kCell.style.gridRow = pCell.style.gridRow = "3 / span " + n; kCell.style.gridColumn = "2"; pCell.style.gridColumn = "3";
    kCell.style.height = pCell.style.height = n * 16 + "px";
    kCell.appendChild(strip(K.slice(0, n * d), n, d, kScale, (r, c, v) => ["k" + r + "[" + c + "] = " + v.toFixed(5) + " (key \u201c", p.keys[r], "\u201d)"], status));
    pCell.appendChild(strip(products, n, d, pScale, (r, c, v) => ["q[" + c + "]\u00b7k" + r + "[" + c + "] = " + qv[c].toFixed(5) + " \u00d7 " + K[r * d + c].toFixed(5) + " = " + v.toFixed(5)], status));
    grid.appendChild(kCell); grid.appendChild(pCell);
    for (let j = 0; j !== n; j++) {
      const label = tokenNode(p.keys[j]), kl = make("div", null, "nk");
      kl.appendChild(label); kl.appendChild(document.createTextNode(" " + j));
      kl.style.gridColumn = "1"; kl.style.gridRow = String(j + 3);
      grid.appendChild(kl);
      const cells = [(scores[j] / spec.scale).toFixed(4), scores[j].toFixed(4)];
      cells.forEach((text, c) => { const e = make("div", text, "num"); e.style.gridColumn = String(4 + c); e.style.gridRow = String(j + 3); grid.appendChild(e); });
      const w = make("div", null, "num nw"), barEl = make("span", null, "wbar");
      barEl.style.width = Math.max(1, Math.round(60 * weights[j])) + "px"; barEl.style.background = css(colour(Math.sqrt(weights[j])));
      w.appendChild(barEl); w.appendChild(document.createTextNode(weights[j].toFixed(5)));
      w.style.gridColumn = "6"; w.style.gridRow = String(j + 3);
      grid.appendChild(w);
    }
    box.appendChild(grid);
    box.appendChild(status);
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
    drawLegend();
    buildModelView();
    setZoom(Math.min(...panels.map(defaultCell)));
    select(state.layer, state.head);
    root.dataset.ready = "1";  // drawn: what a test (or a notebook's reader) can wait for
    if (typeof performance !== "undefined" && performance.mark) performance.mark("tfcli-view-drawn");
  }

  start().catch((err) => { const p = $("problem"); p.hidden = false; p.textContent = "could not show the weights: " + err.message; });
})(document.currentScript);
