"""The files `tfcli inspect-attention` writes: a self-contained HTML page (parsed, every piece of text
escaped, its script, the package's assets/page.js, run under node against a stand-in DOM when node is
installed), PNG images, JSON."""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from tests.helpers import browse, needs_chromium, needs_node, unpack_weights
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.inspect import palette
from tfcli.inspect.capture import capture_attention
from tfcli.inspect.html import json_for_script, pack_weights, token_pieces
from tfcli.inspect.session import StreamedArray, write_document
from tfcli.model.config import preset
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.show import TokenView, token_views

HOSTILE = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "</script><script>alert(2)</script>", "&lt;b&gt; \u2028 \u2029 <!-- x -->"]
TEXT = "The fox " + " ".join(HOSTILE) + " ran."


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    tokenizer = TextTokenizer.load(trained_tokenizer)
    root = tmp_path_factory.mktemp("inspect-out")
    out = {}
    for name, overrides in (
        ("decoder", {}),
        ("decoder2", {}),
        ("seq2seq", {"arch": "encoder-decoder", "positions": "sinusoidal"}),
        ("long", {"block_size": 512}),
    ):
        torch.manual_seed(len(out))
        config = preset(
            "tiny", vocab_size=tokenizer.vocab_size, **{"block_size": 128, "n_layers": 2, "n_heads": 4, "d_model": 32, "d_ff": 64, "init_std": 0.3, **overrides}
        )
        save_checkpoint(root / name, Transformer(config), tokenizer)
        out[name] = root / name
    return out


class PageParser(HTMLParser):
    """Collects the elements, the script bodies and the text outside scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.text: list[str] = []
        self._in_script: dict | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = dict(attrs)
            self.scripts.append((self._in_script, ""))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = None

    def handle_data(self, data):
        if self._in_script is not None:
            attrs, body = self.scripts[-1]
            self.scripts[-1] = (attrs, body + data)
        else:
            self.text.append(data)


def _shown(pieces: list, parts: bool = True) -> str:
    """The text a token shows on the page: its characters, and each badge's label (`parts`: also the
    faint parts of a character that a later token completes)."""
    return "".join(piece if isinstance(piece, str) else piece[1] for piece in pieces if parts or isinstance(piece, str) or piece[0] not in ("p", "pc"))


def _axis_label(shown: str) -> str:
    """A token's label on the map's axes: a space at either end shows as ␣ (" fox" -> "␣fox")."""
    inner = shown.strip(" ")
    lead = len(shown) - len(shown.lstrip(" "))
    return "␣" * lead + inner + "␣" * (len(shown) - lead - len(inner))


def _parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser


def test_json_for_script_escapes_what_could_end_a_script():
    text = json_for_script({"t": "</script><!-- & \u2028\u2029 >"})
    for raw in ("<", ">", "&", "\u2028", "\u2029"):
        assert raw not in text
    assert json.loads(text) == {"t": "</script><!-- & \u2028\u2029 >"}


@pytest.mark.parametrize("causal", [True, False])
def test_packed_weights_round_trip_within_a_byte(causal):
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(9), size=(2, 3, 9)).astype(np.float32)  # (2, 3, 9, 9)
    if causal:
        w = np.tril(w)
        w /= w.sum(axis=-1, keepdims=True)
    back = unpack_weights(pack_weights(w, causal), w.shape, causal)
    assert np.abs(np.sqrt(back) - np.sqrt(w)).max() <= 0.5 / 255 + 1e-6  # one byte on the square-root scale
    if causal:
        assert np.all(back[..., np.triu_indices(9, 1)[0], np.triu_indices(9, 1)[1]] == 0)


def test_the_page_assets_are_package_data():
    """A non-editable install carries only what pyproject.toml declares: every asset must match a pattern."""
    import fnmatch

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]["tfcli.inspect"]
    assets = sorted(p.relative_to(REPO / "tfcli" / "inspect").as_posix() for p in (REPO / "tfcli" / "inspect" / "assets").iterdir())
    assert {"assets/page.html", "assets/page.css", "assets/page.js"} <= set(assets)
    assert all(any(fnmatch.fnmatch(a, pattern) for pattern in declared) for a in assets), (assets, declared)


def test_html_page_is_self_contained_and_escapes_every_text(cli, runs, tmp_path):
    out = tmp_path / "attention.html"
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare", "<b>bold</b> & co", "-o", out)
    assert result.code == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    parsed = _parse(page)
    assert [t for t, _ in parsed.tags].count("script") == 2 and len(parsed.scripts) == 2
    (data_attrs, data_body), (code_attrs, code_body) = parsed.scripts
    assert data_attrs["type"] == "application/json" and data_attrs["data-part"] == "data" and code_attrs == {}
    assert re.fullmatch(r"tfcli-view-[0-9a-f]{12}-data", data_attrs["id"])  # each view its own id (a notebook holds many)
    for raw in ("<", ">", "&", "\u2028", "\u2029"):
        assert raw not in data_body
    assert "</script" not in code_body.lower() and "<!--" not in code_body and "innerHTML" not in code_body
    assert not any(t in ("img", "iframe", "object", "embed", "link") for t, _ in parsed.tags)  # nothing injected
    assert not any(k.startswith("on") for _, attrs in parsed.tags for k in attrs)  # no inline handlers
    assert not any("src" in attrs or "href" in attrs for _, attrs in parsed.tags)  # nothing fetched
    assert "http://" not in page and "https://" not in page
    data = json.loads(data_body)
    tokenizer = TextTokenizer.load(runs["decoder"])
    labels = [_shown(pieces) for pieces in data["panels"][0]["queries"]]
    assert len(labels) == len(token_views(tokenizer, TEXT))
    whole = "".join(_shown(pieces, parts=False) for pieces in data["panels"][0]["queries"])
    assert whole == TEXT.replace("\u2028", "U+2028").replace("\u2029", "U+2029")  # the characters, separators as badges
    for hostile in HOSTILE[:3]:
        assert hostile in "".join(labels)
    assert data["panels"][1]["title"].startswith("2: <b>bold</b>")  # text as data
    weights = unpack_weights(data["panels"][0]["data"], tuple(data["panels"][0]["shape"]), True)
    expected = capture_attention(load_checkpoint(runs["decoder"]), TEXT).weights
    assert np.abs(np.sqrt(weights) - np.sqrt(expected)).max() <= 0.5 / 255 + 1e-6
    assert (data["layers"], data["heads"], data["layer"], data["head"]) == (2, 4, 0, 0)


def test_html_focus_is_each_texts_own_token(cli, runs, tmp_path):
    out = tmp_path / "c.html"
    result = cli("inspect-attention", runs["decoder"], "--text", "it was here", "--compare", "A big red fox saw it.", "--token", "it", "-o", out)
    assert result.code == 0, result.stderr
    data = json.loads(_parse(out.read_text(encoding="utf-8")).scripts[0][1])
    for panel in data["panels"]:
        assert _shown(panel["queries"][panel["focus"]]).strip() == "it", panel["queries"]
    assert data["panels"][0]["focus"] != data["panels"][1]["focus"]


def test_html_header_text_is_escaped(cli, runs, tmp_path):
    hostile_dir = tmp_path / "<img src=x onerror=alert(1)>"
    shutil.copytree(runs["decoder"], hostile_dir)
    out = tmp_path / "a.html"
    assert cli("inspect-attention", hostile_dir, "--text", "x", "-o", out).code == 0
    parsed = _parse(out.read_text(encoding="utf-8"))
    assert not any(t == "img" for t, _ in parsed.tags)
    assert any("<img src=x onerror=alert(1)>" in chunk for chunk in parsed.text)  # shown as text


HARNESS = r"""
const fs = require("fs");
const page = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
class ClassList { constructor() { this.set = new Set(); } toggle(n, on) { if (on === undefined ? !this.set.has(n) : on) this.set.add(n); else this.set.delete(n); } contains(n) { return this.set.has(n); } }
class Element {
  constructor(tag) { this.tagName = tag; this.children = []; this.listeners = {}; this.style = {}; this.classList = new ClassList(); this._text = ""; this.value = ""; this.hidden = false; this.width = 0; this.height = 0; this.dataset = {}; this.attributes = {}; }
  setAttribute(k, v) { this.attributes[k] = String(v); }
  focus() {}
  appendChild(c) { this.children.push(c); return c; }
  set textContent(t) { this._text = String(t); this.children = []; }
  get textContent() { return this._text + this.children.map((c) => c.textContent).join(""); }
  set innerHTML(v) { throw new Error("innerHTML used"); }
  set outerHTML(v) { throw new Error("outerHTML used"); }
  insertAdjacentHTML() { throw new Error("insertAdjacentHTML used"); }
  set className(v) { this._class = v; } get className() { return this._class; }
  addEventListener(type, fn) { (this.listeners[type] = this.listeners[type] || []).push(fn); }
  fire(type, ev) { (this.listeners[type] || []).forEach((fn) => fn(ev || { target: this })); }
  getContext() { const el = this; return { createImageData: (w, h) => ({ width: w, height: h, data: new Uint8ClampedArray(w * h * 4) }), putImageData: (img) => { el.image = img; } }; }
  closest() { return viewRoot; }
  querySelector(sel) { return byId[/data-part="([^"]+)"/.exec(sel)[1]]; }
  getBoundingClientRect() { return { left: 0, top: 0, width: this.width * 10, height: this.height * 10 }; }
}
const byId = {};
for (const id of ["layer", "head", "model", "legend", "neuron", "extra", "panels", "problem", "zoom-in", "zoom-out", "zoom-size"]) byId[id] = new Element(id === "layer" || id === "head" ? "select" : "div");
byId.problem.hidden = true;
byId.data = new Element("script"); byId.data.textContent = page.data;
const viewRoot = new Element("div");
const textNode = (t) => ({ nodeType: 3, textContent: String(t), children: [] });
global.document = { currentScript: viewRoot, getElementById() { throw new Error("getElementById used: a view finds its parts inside itself"); }, createElement: (tag) => new Element(tag), createTextNode: textNode, write() { throw new Error("document.write used"); } };
function all(el, pred, out = []) { if (pred(el)) out.push(el); el.children.forEach((c) => all(c, pred, out)); return out; }
const alpha = (s) => { const m = /: ([0-9.]+)%$/.exec(s.title || ""); return m ? Math.sqrt(Number(m[1]) / 100) : 0; };  // the weight shown on hover, as sqrt
eval(fs.readFileSync(page.script, "utf8"));
setTimeout(() => {
  const out = { problem: byId.problem.hidden ? null : byId.problem.textContent };
  const panels = byId.panels.children;
  out.panels = panels.length;
  const blocks = all(panels[0], (e) => e._class === "tokens");
  const keySpans = blocks[0].children.slice(1), querySpans = blocks[1].children.slice(1);
  out.keyTexts = keySpans.map((s) => s.textContent);
  out.keyMarks = keySpans.map((s) => s.children.filter((c) => c._class).map((c) => [c._class, c.textContent, c.title]));
  const labels = (cls) => all(panels[0], (e) => e._class === cls).map((e) => e.textContent);
  out.xLabels = labels("lab x"); out.yLabels = labels("lab y");
  out.zoom = byId["zoom-size"].textContent;
  const q = page.hover;
  keySpans[q].fire("mouseenter");
  const hot = (cls) => all(panels[0], (e) => e._class === cls).map((e) => e.hidden ? null : e.textContent)[0];
  out.hotX = hot("lab x hot"); out.hotY = hot("lab y hot");
  out.toTitle = blocks[0].children[0].textContent;
  out.byTitle = blocks[1].children[0].textContent;
  out.keyAlpha = keySpans.map(alpha);
  out.queryAlpha = querySpans.map(alpha);
  out.thumbs = all(byId.model, (e) => e._class === "mthumb").length;
  out.keyColours = keySpans.map((s) => s.style.background);
  out.layerOptions = byId.layer.children.length;
  const canvas = all(panels[0], (e) => e.tagName === "canvas")[0];
  out.mapSize = [canvas.width, canvas.height];
  out.mapWidth = canvas.style.width;
  byId["zoom-in"].fire("click");
  out.mapWidthZoomed = canvas.style.width; out.zoomed = byId["zoom-size"].textContent;
  out.mapPixel = Array.from(canvas.image.data.slice(0, 4));
  byId.layer.fire("change", { target: { value: "1" } });
  byId.head.fire("change", { target: { value: "2" } });
  const status = all(panels[0], (e) => e._class === "status")[0];
  canvas.fire("mousemove", { clientX: 5 + 10 * 0, clientY: 5 + 10 * q });
  out.status = status.textContent;
  out.keyAlphaAfter = keySpans.map(alpha);
  out.extra = byId.extra.textContent;
  out.legend = byId.legend.textContent;
  out.neuron = byId.neuron.textContent;
  console.log(JSON.stringify(out));
}, 200);
"""


PAGE_SCRIPT = Path(str(resources.files("tfcli.inspect") / "assets" / "page.js"))  # the file itself, as installed


def _run_page_script(parsed: PageParser, tmp_path: Path, hover: int) -> dict:
    """Run the package's page.js (the file itself, which the page inlines as it is) under node against a
    stand-in DOM holding the page's data; returns what the harness read off that DOM."""
    assert parsed.scripts[1][1] == PAGE_SCRIPT.read_text(encoding="utf-8")  # the page carries the file unchanged
    spec = tmp_path / "page.json"
    spec.write_text(json.dumps({"data": parsed.scripts[0][1], "script": str(PAGE_SCRIPT), "hover": hover}))
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    done = subprocess.run(["node", str(harness), str(spec)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_node
def test_the_page_script_runs_and_hover_shows_the_weights(cli, runs, tmp_path):
    out = tmp_path / "a.html"
    assert cli("inspect-attention", runs["decoder"], "--text", TEXT, "--summary", "-o", out).code == 0
    parsed = _parse(out.read_text(encoding="utf-8"))
    weights = capture_attention(load_checkpoint(runs["decoder"]), TEXT).weights
    hover = 5
    result = _run_page_script(parsed, tmp_path, hover)
    assert result["problem"] is None and result["panels"] == 1
    data = json.loads(parsed.scripts[0][1])
    labels = [_shown(pieces) for pieces in data["panels"][0]["queries"]]
    assert result["keyTexts"] == labels  # tokens set as text
    T = weights.shape[2]
    # hovering token 5: keys coloured by what it attends to (row 5), queries by what attends to it (column 5)
    assert np.allclose(result["keyAlpha"], np.sqrt(weights[0, 0, hover]), atol=1.5 / 255)
    assert np.allclose(result["queryAlpha"], np.sqrt(weights[0, 0, :, hover]), atol=1.5 / 255)
    assert all(a == 0 for a in result["keyAlpha"][hover + 1 :])  # masked keys uncoloured
    assert result["toTitle"].startswith("what \u201c") and f"({hover}) attends to" in result["toTitle"]
    assert result["thumbs"] == 2 * 4 and result["layerOptions"] == 2 and result["mapSize"] == [T, T]  # the model view: every layer x head
    assert np.abs(np.array(result["mapPixel"][:3]) - palette.rgb(weights[0, 0, 0, 0])).max() <= 2  # the one palette (viridis)
    shade = [int(x) for x in re.findall(r"\d+", result["keyColours"][0])]
    assert np.abs(np.array(shade) - palette.rgb(weights[0, 0, hover, 0])).max() <= 2  # hovered tokens on the same map
    assert "attention weight" in result["legend"] and "0.25" in result["legend"]  # a colour bar with its scale
    assert result["neuron"].startswith("neuron view") and "softmax" in result["neuron"]
    # token labels along both axes of the map: every one that fits, and the hovered row and column
    cell = max(8, min(64, 560 // T))
    step = -(-12 // cell)
    axis = [_axis_label(label) for label in labels]
    assert result["xLabels"] == axis[::step] and result["yLabels"] == axis[::step]
    assert result["hotX"] == axis[hover] and result["hotY"] == axis[hover]
    fox = _run_page_script(parsed, tmp_path, labels.index(" fox"))
    assert fox["hotX"] == fox["hotY"] == "␣fox"  # a word after a space: marked on the axes, as tables mark it
    # a minimum cell size, and a zoom
    assert result["zoom"] == f"{cell} px per token" and result["mapWidth"] == f"{T * cell}px"
    bigger = next(z for z in (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64) if z > cell)
    assert result["zoomed"] == f"{bigger} px per token" and result["mapWidthZoomed"] == f"{T * bigger}px"
    # after picking layer 1, head 2 and moving over the map's cell (hover, 0)
    prefix = f"\u201c{labels[hover]}\u201d ({hover}) \u2192 \u201c{labels[0]}\u201d (0): "
    assert result["status"].startswith(prefix)
    shown = float(result["status"][len(prefix) :].rstrip("%"))
    assert abs(shown - 100 * weights[1, 2, hover, 0]) <= 0.05 + 100 * 2 * np.sqrt(weights[1, 2, hover, 0]) / 255
    assert np.allclose(result["keyAlphaAfter"], np.sqrt(weights[1, 2, hover]), atol=1.5 / 255)
    assert "head summary" in result["extra"]


def _views(chunks: list[bytes]) -> list[TokenView]:
    """Views of byte-level tokens as `views_of_ids` makes them: each token's piece through the decoder."""
    from tfcli.tokenizer.show import views_of_ids

    tokenizer = _byte_tokenizer(chunks)
    ids = [tokenizer.hf.token_to_id(_symbols(chunk)) for chunk in chunks]
    return views_of_ids(tokenizer, ids)


def _symbols(chunk: bytes) -> str:
    from tfcli.tokenizer.fast import byte_of_symbol

    symbol = {b: ch for ch, b in byte_of_symbol().items()}
    return "".join(symbol[b] for b in chunk)


def _byte_tokenizer(chunks: list[bytes]):
    """A byte-level BPE whose vocabulary holds each chunk as one token (GPT-2's symbols)."""
    import tempfile

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tfcli.tokenizer.core import TextTokenizer

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for chunk in chunks:
        vocab.setdefault(_symbols(chunk), len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    folder = Path(tempfile.mkdtemp())
    tokenizer.save(str(folder / "tokenizer.json"))
    return TextTokenizer.load(folder)


def test_token_pieces_show_characters_and_badge_what_would_act():
    rlo = "\u202e".encode()
    pieces = token_pieces(_views([b"a\xf0\x9f", b"\x98", b"\x80" + rlo[:1], rlo[1:] + b"b\n", b"\xff ok"]))
    assert pieces[0] == ["a", ["p", "😀", "part of 😀 (U+1F600), completed by a later token"]]
    assert pieces[1] == [["p", "😀", "part of 😀 (U+1F600), completed by a later token"]]
    assert pieces[2][0] == "😀"  # the token that completes it shows it
    assert pieces[2][1][:2] == ["pc", "U+202E"]  # a part of U+202E: its badge, never the character
    assert pieces[3] == [["c", "U+202E", "RIGHT-TO-LEFT OVERRIDE (U+202E)"], "b", ["c", "↵", "control character (U+000A)"]]
    assert pieces[4] == [["x", "\ufffd", "bytes that are not UTF-8"], " ok"]  # as the decoder writes it
    assert "\u202e" not in json.dumps(pieces, ensure_ascii=False)
    assert token_pieces([TokenView(id=0, token="<|endoftext|>", text="<|endoftext|>")]) == [["<|endoftext|>"]]  # a start token


@needs_node
def test_the_page_shows_characters_not_byte_escapes(cli, runs, tmp_path):
    text = "a fox 😀 saw \u202eevil\u202c and caf\u00e9"
    out = tmp_path / "a.html"
    assert cli("inspect-attention", runs["decoder"], "--text", text, "-o", out).code == 0
    page = out.read_text(encoding="utf-8")
    assert "\u202e" not in page and "\u202c" not in page  # no direction override anywhere on the page, only badges
    result = _run_page_script(_parse(page), tmp_path, 0)
    shown = "".join(result["keyTexts"])
    assert "\\x" not in shown and "😀" in shown and "caf\u00e9" in shown
    marks = [mark for marks in result["keyMarks"] for mark in marks]
    assert ["badge", "U+202E", "RIGHT-TO-LEFT OVERRIDE (U+202E)"] in marks
    assert ["badge", "U+202C", "POP DIRECTIONAL FORMATTING (U+202C)"] in marks
    assert any(kind == "part" and char == "😀" for kind, char, _ in marks)  # the emoji's first bytes, marked


# ---- the page in a browser: headless Chromium at 1400 x 1000, a screenshot and measurements (skipped without it)

LONG_TEXT = " ".join((REPO / "sample_data" / "corpus" / "stories.txt").read_text(encoding="utf-8").split()[:600])  # > 512 tokens

LAYOUT_PROBE = """
  const panel = document.querySelector(".panel"), box = panel.querySelector(".mapbox"), canvas = panel.querySelector("canvas.map");
  const spans = Array.from(panel.querySelector(".tokens").children).slice(1);
  const tops = new Set(spans.map((s) => Math.round(s.getBoundingClientRect().top)));
  const n = canvas.width, r = canvas.getBoundingClientRect();
  const out = {
    viewport: window.innerWidth, pageWidth: document.documentElement.scrollWidth,
    stripRight: Math.max(...spans.map((s) => s.getBoundingClientRect().right)), stripLines: tops.size,
    tokens: n, cell: r.width / n, boxRight: box.getBoundingClientRect().right,
    boxScrolls: box.scrollWidth > box.clientWidth && box.scrollHeight > box.clientHeight,
    xLabels: Array.from(panel.querySelectorAll(".lab.x:not(.hot)")).map((e) => e.textContent),
    yLabels: Array.from(panel.querySelectorAll(".lab.y:not(.hot)")).map((e) => e.textContent),
    labelFont: parseFloat(getComputedStyle(panel.querySelector(".lab.x")).fontSize),
  };
  canvas.dispatchEvent(new MouseEvent("mousemove", { clientX: r.left + 300.5 * out.cell, clientY: r.top + 401.5 * out.cell, bubbles: true }));
  const hot = (sel) => { const e = panel.querySelector(sel); return e.hidden ? null : e.textContent; };
  out.hotX = hot(".lab.x.hot"); out.hotY = hot(".lab.y.hot");
  document.querySelector('[data-part="zoom-in"]').click();
  out.zoomedCell = canvas.getBoundingClientRect().width / n;
  return out;
"""


@needs_chromium
def test_a_512_token_page_in_a_browser(cli, runs, tmp_path):
    """Strips wrap, the map keeps cells big enough to hover (scrolling in its own area), has token labels on
    both axes, and zooms."""
    out = tmp_path / "long.html"
    assert cli("inspect-attention", runs["long"], "--text", LONG_TEXT, "--crop", "-o", out).code == 0
    _, seen = browse(out, LAYOUT_PROBE)
    data = json.loads(_parse(out.read_text(encoding="utf-8")).scripts[0][1])
    labels = [_shown(pieces) for pieces in data["panels"][0]["queries"]]
    assert seen["tokens"] == 512
    assert seen["pageWidth"] <= seen["viewport"]  # nothing runs off the right edge: no page-wide scrollbar
    assert seen["stripRight"] <= seen["viewport"] and seen["stripLines"] > 2  # the strips wrap
    assert seen["cell"] >= 8 and seen["boxScrolls"] and seen["boxRight"] <= seen["viewport"]
    assert seen["zoomedCell"] > seen["cell"]
    assert len(seen["xLabels"]) >= 512 // 2 and len(seen["yLabels"]) >= 512 // 2 and seen["labelFont"] >= 8
    assert seen["xLabels"][:3] == [_axis_label(label) for label in labels[0:6:2]]
    assert (seen["hotX"], seen["hotY"]) == (_axis_label(labels[300]), _axis_label(labels[401]))  # the cell under the pointer


CHARACTERS_PROBE = """
  const strip = document.querySelector(".tokens");
  const badges = Array.from(strip.querySelectorAll(".badge:not(.part)"));
  const r = badges[0].getBoundingClientRect();
  return { text: Array.from(strip.children).slice(1).map((s) => s.textContent).join(""), badges: badges.map((b) => b.textContent),
           badgeSize: [r.width, r.height], override: document.body.innerText.includes("\u202e") };
"""


@needs_chromium
def test_characters_on_the_page_in_a_browser(cli, runs, tmp_path):
    out = tmp_path / "chars.html"
    text = "The fox 😀 saw \u202eevil\u202c ideas in caf\u00e9 Zo\u00eb\ttoo."
    assert cli("inspect-attention", runs["decoder"], "--text", text, "-o", out).code == 0
    _, seen = browse(out, CHARACTERS_PROBE)
    assert "😀 saw" in seen["text"] and "caf\u00e9" in seen["text"] and "\\x" not in seen["text"]
    assert seen["badges"] == ["U+202E", "U+202C", "\\t"] and min(seen["badgeSize"]) > 5  # visible badges
    assert not seen["override"]  # the override is shown, never applied


TITLES_PROBE = """
  return { panels: Array.from(document.querySelectorAll(".panel h2")).map((h) => h.textContent),
           about: Array.from(document.querySelectorAll("ul.about li")).map((li) => li.textContent) };
"""


@needs_chromium
def test_compared_texts_get_different_titles_in_a_browser(cli, runs, tmp_path):
    out = tmp_path / "compare.html"
    first, second = "The animal didn't cross the street because it was too tired", "The animal didn't cross the street because it was too wide"
    assert cli("inspect-attention", runs["decoder"], "--text", first, "--compare", second, "-o", out).code == 0
    _, seen = browse(out, TITLES_PROBE)
    assert seen["panels"] == ["1: …because it was too tired", "2: …because it was too wide"]
    assert seen["about"][1].startswith("1: …because it was too tired") and seen["about"][2].startswith("2: …because it was too wide")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_png_heatmap_grid_and_token_view(cli, runs, tmp_path):
    one = cli("inspect-attention", runs["decoder"], "--text", "The fox $x$ found a $ball$.", "-o", tmp_path / "one.png")
    assert one.code == 0, one.stderr
    width, height = _png_size(tmp_path / "one.png")
    assert width >= 400 and height >= 400
    grid = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--head", "all", "--layer", "all", "--format", "png", "-o", tmp_path / "grid.png")
    assert grid.code == 0 and _png_size(tmp_path / "grid.png")[0] > 400
    token = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--token", "fox", "--compare-run", runs["decoder2"], "-o", tmp_path / "tok.png")
    assert token.code == 0 and _png_size(tmp_path / "tok.png")[1] > 200
    assert "wrote" in token.stderr


def test_json_export_has_every_layer_and_head(cli, runs, tmp_path):
    out = tmp_path / "w.json"
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--token", "fox", "-o", out)
    assert result.code == 0, result.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["format"] == "tfcli-attention" and data["layers"] == [0, 1] and data["heads"] == [0, 1, 2, 3]
    capture = data["captures"][0]
    tokenizer = TextTokenizer.load(runs["decoder"])
    assert [t["id"] for t in capture["queries"]] == tokenizer.encode(TEXT)
    w = np.array(capture["weights"])
    assert w.shape == (2, 4, len(capture["queries"]), len(capture["queries"]))
    assert np.allclose(w.sum(axis=-1), 1.0, atol=1e-4) and np.all(np.triu(w[0, 0], 1) == 0)
    focus = capture["focus"]
    assert capture["queries"][focus["position"]]["text"].strip() == "fox"
    assert np.allclose(np.array(focus["weights"]), w[:, :, focus["position"]])
    stdout = cli("inspect-attention", runs["decoder"], "--text", "The fox ran.", "--json")  # what the screen shows
    assert np.array(json.loads(stdout.stdout)["captures"][0]["weights"]).shape[:2] == (1, 1)
    some = cli("inspect-attention", runs["decoder"], "--text", "The fox ran.", "--format", "json", "--layer", "1", "--head", "all")
    assert json.loads(some.stdout)["layers"] == [1]


# Texts that spell, or nearly spell, the "@@weights-N@@" strings the JSON writer once spliced arrays in by.
MARKERS = [
    "@@weights-0@@",
    '"@@weights-0@@"',
    "@@weights-1@@",
    "@@weights-5@@",
    "@@weights-99@@",
    "@@weights-@@",
    'a "@@weights-0@@", "@@weights-1@@" b',
    '\\"@@weights-0@@\\"',
    "@@weights-0@@\n@@weights-0@@",
]


def _rounded(weights: np.ndarray) -> list:
    return np.round(weights.astype(np.float64), 6).tolist()


@pytest.mark.parametrize("text", MARKERS)
def test_json_text_that_spells_a_weights_marker_stays_text(cli, runs, tmp_path, text):
    run = tmp_path / "@@weights-1@@"
    run.symlink_to(runs["decoder"])
    other = "@@weights-0@@ @@weights-1@@"
    out = tmp_path / "w.json"
    result = cli("inspect-attention", run, "--text", text, "--compare", other, "--format", "json", "-o", out)
    assert result.code == 0, result.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    checkpoint = load_checkpoint(runs["decoder"])
    for entry, source in zip(data["captures"], (text, other), strict=True):
        assert entry["text"] == source and entry["run"] == str(run) and "@@weights-" in entry["title"]
        assert all(isinstance(view["text"], str) for view in entry["queries"])
        assert np.allclose(entry["weights"], _rounded(capture_attention(checkpoint, source).weights), atol=1e-6)
    screen = json.loads(cli("inspect-attention", run, "--text", text, "--json").stdout)  # the terminal's head
    assert screen["captures"][0]["text"] == text
    assert screen["captures"][0]["weights"] == [[data["captures"][0]["weights"][0][0]]]


def test_json_target_that_spells_a_weights_marker_stays_text(cli, runs):
    result = cli("inspect-attention", runs["seq2seq"], "--text", "@@weights-0@@", "--target", '"@@weights-0@@"', "--format", "json")
    assert result.code == 0, result.stderr
    capture = json.loads(result.stdout)["captures"][0]
    assert (capture["text"], capture["target"]) == ("@@weights-0@@", '"@@weights-0@@"')
    expected = capture_attention(load_checkpoint(runs["seq2seq"]), "@@weights-0@@", target='"@@weights-0@@"', kind="cross")
    assert np.allclose(capture["weights"], _rounded(expected.weights), atol=1e-6)


def test_write_document_finds_arrays_by_type_never_by_text():
    rng = np.random.default_rng(0)
    arrays = [rng.random((2, 3, 4, 5)).astype(np.float32), rng.random((1, 1, 2, 2))]
    tokens = [{"id": i, "token": marker, "text": marker} for i, marker in enumerate(MARKERS)]
    document = {
        "text": "@@weights-0@@",
        "@@weights-1@@": MARKERS,
        "captures": [
            {"queries": tokens, "weights": StreamedArray(arrays[0])},
            {"title": '"@@weights-1@@"', "weights": StreamedArray(arrays[1]), "after": "@@weights-0@@"},
        ],
    }
    handle = io.StringIO()
    write_document(handle, document)
    expected = {
        **document,
        "captures": [{**document["captures"][0], "weights": _rounded(arrays[0])}, {**document["captures"][1], "weights": _rounded(arrays[1])}],
    }
    assert json.loads(handle.getvalue()) == expected


_JSON_TEXT = st.one_of(st.text(), st.sampled_from(MARKERS))
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _JSON_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_JSON_TEXT, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_JSON_TEXT, _JSON_VALUES, max_size=5))
def test_write_document_lays_out_json_as_json_dumps_does(document):
    handle = io.StringIO()
    write_document(handle, document)
    assert handle.getvalue() == json.dumps(document, indent=1, ensure_ascii=False) + "\n"


class _RecordingText(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, text: str) -> int:
        self.sizes.append(len(text))
        return super().write(text)


def test_weights_are_streamed_one_head_at_a_time():
    weights = np.random.default_rng(1).random((3, 4, 24, 24)).astype(np.float32)  # (layers, heads, T, S)
    handle = _RecordingText()
    write_document(handle, {"weights": StreamedArray(weights)})
    assert json.loads(handle.getvalue()) == {"weights": _rounded(weights)}
    one_head = max(len(json.dumps(_rounded(head))) for head in weights.reshape(-1, 24, 24))
    assert max(handle.sizes) <= one_head and len(handle.getvalue()) > 10 * one_head


def test_encoder_decoder_outputs(cli, runs, tmp_path):
    base = ("inspect-attention", runs["seq2seq"], "--text", "the fox found a ball", "--target", "a red ball")
    assert cli(*base, "-o", tmp_path / "cross.html").code == 0
    data = json.loads(_parse((tmp_path / "cross.html").read_text(encoding="utf-8")).scripts[0][1])
    panel = data["panels"][0]
    assert data["kind"] == "cross" and not data["self_attention"] and panel["keys"] is not None and not panel["causal"]
    assert panel["shape"][2:] == [len(panel["queries"]), len(panel["keys"])]
    exported = json.loads(cli(*base, "--attention", "decoder", "--format", "json").stdout)
    assert exported["attention"] == "decoder" and exported["causal"]
    assert cli(*base, "--attention", "encoder", "-o", tmp_path / "enc.png").code == 0


@needs_node
def test_the_page_script_for_cross_attention(cli, runs, tmp_path):
    out = tmp_path / "cross.html"
    source, target = "the fox found a red ball in the park", "a red ball"
    assert cli("inspect-attention", runs["seq2seq"], "--text", source, "--target", target, "-o", out).code == 0
    parsed = _parse(out.read_text(encoding="utf-8"))
    weights = capture_attention(load_checkpoint(runs["seq2seq"]), source, target=target, kind="cross").weights
    hover = 3  # a source token: colour the target tokens by how much each attends to it
    result = _run_page_script(parsed, tmp_path, hover)
    assert result["problem"] is None
    T, S = weights.shape[2:]
    assert result["mapSize"] == [S, T] and len(result["keyTexts"]) == S
    assert np.allclose(result["queryAlpha"], np.sqrt(weights[0, 0, :, hover]), atol=1.5 / 255)
    assert all(a == 0 for a in result["keyAlpha"])  # no query picked yet
    assert f"({hover})" in result["byTitle"]
