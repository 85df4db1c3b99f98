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
