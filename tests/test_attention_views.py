"""The attention views a learner reaches for: the model view and the neuron view driven in a real browser
(Playwright over headless Chromium), the neuron view's numbers against a direct computation from the run's
weights, the tutorial notebook executed by nbclient (its outputs hold the pages, two views keep their own
state), and every PNG the inspect commands write, at 12 and 200 tokens, with its labels whole and a colour bar."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import missing_tool
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.inspect import palette
from tfcli.inspect.capture import capture_attention
from tfcli.inspect.hooks import Hooks
from tfcli.inspect.neuron import capture_query_keys, neuron_view
from tfcli.inspect.terminal import _short
from tfcli.model.config import preset
from tfcli.model.transformer import HIDDEN, Transformer
from tfcli.tokenizer.core import TextTokenizer

REPO = Path(__file__).resolve().parents[1]
TEXT = "The fox saw the ball and the fox ran after the ball."
STORIES = (REPO / "sample_data" / "corpus" / "stories.txt").read_text(encoding="utf-8")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """Tiny random runs: the tutorial's shape, a rotary grouped-query one, a 12 x 12 one with 256 positions."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    root = tmp_path_factory.mktemp("views")

    def save(name: str, **overrides) -> Path:
        torch.manual_seed(0)
        config = preset(
            "tiny", vocab_size=tokenizer.vocab_size, **{"block_size": 64, "n_layers": 2, "n_heads": 4, "d_model": 32, "d_ff": 64, "init_std": 0.2, **overrides}
        )
        save_checkpoint(root / name, Transformer(config), tokenizer)
        return root / name

    return {
        "decoder": save("decoder"),
        "rotary": save("rotary", positions="rotary", n_kv_heads=2),
        "big": save("big", n_layers=12, n_heads=12, d_model=48, block_size=256),
        "long": save("long", block_size=256),
        # Gemma 3's and Qwen3's options: QK-norm without rotary (hook_q is before the norm), its own score scale, a local layer
        "gemma": save("gemma", qk_norm=True, attn_scale=0.3, sliding_window=3, local_layers=[0]),
    }


def _tokens(run: Path, count: int) -> str:
    """A text of at least `count` tokens from the sample stories (cropped to the block by --crop)."""
    tokenizer = TextTokenizer.load(run)
    words = STORIES.split()
    for n in range(count // 2, len(words), 16):
        text = " ".join(words[:n])
        if len(tokenizer.encode(text)) >= count:
            return text
    raise AssertionError("the stories are too short")


# ---- the neuron view's numbers -------------------------------------------------------------------------


def test_neuron_view_equals_a_direct_computation_from_the_weights(cli, runs):
    """Layer 0 by hand from model.safetensors (embeddings, layer norm, the qkv projection); layer 1 from the
    residual stream entering it. q, k, q∘k, q·k/√d and the softmax all within 1e-5."""
    run = runs["decoder"]
    weights = load_file(str(run / "model.safetensors"))
    ids = TextTokenizer.load(run).encode(TEXT)
    T, d, H = len(ids), 32, 4
    hs = d // H
    checkpoint = load_checkpoint(run)
    with Hooks() as hooks, torch.inference_mode():
        stream = hooks.residual_stream(checkpoint.model.decoder)
        checkpoint.model(torch.tensor([ids]), head=HIDDEN)
    for layer, head, query in ((0, 1, 7), (1, 3, T - 1)):
        if layer == 0:
            x = weights["tok_emb.weight"][ids].double() + weights["pos_emb.weight"][:T].double()  # (T, d)
        else:
            x = stream[layer][0].double()  # (T, d): the input of block `layer`
        prefix = f"decoder.blocks.{layer}."
        h = torch.nn.functional.layer_norm(x, (d,), weights[prefix + "attn_norm.weight"].double(), weights[prefix + "attn_norm.bias"].double(), 1e-5)
        qkv = h @ weights[prefix + "attn.qkv.weight"].double().T + weights[prefix + "attn.qkv.bias"].double()  # (T, 3d)
        q = qkv[query, head * hs : (head + 1) * hs]  # (hs,)
        k = qkv[:, d + head * hs : d + (head + 1) * hs]  # (T, hs)
        scores = (k @ q) / math.sqrt(hs)
        scores[query + 1 :] = -math.inf  # causal
        expected = torch.softmax(scores, dim=0)

        result = cli("inspect-attention", run, "--text", TEXT, "--neuron", f"{layer}.{head}", "--query", str(query), "--format", "json")
        assert result.code == 0, result.stderr
        doc = json.loads(result.stdout)
        assert (doc["format"], doc["layer"], doc["head"], doc["head_dim"], doc["query"]["position"]) == ("tfcli-neuron-view", layer, head, hs, query)
        np.testing.assert_allclose(doc["query"]["q"], q.numpy(), atol=1e-5)
        keys = doc["keys"]
        assert len(keys) == T and [key["masked"] for key in keys] == [i > query for i in range(T)]
        np.testing.assert_allclose([key["k"] for key in keys], k.numpy(), atol=1e-5)
        np.testing.assert_allclose([key["q_times_k"] for key in keys], (k * q).numpy(), atol=1e-5)
        np.testing.assert_allclose([key["score"] for key in keys[: query + 1]], scores[: query + 1].numpy(), atol=1e-5)
        assert all(key["score"] is None for key in keys[query + 1 :])
        np.testing.assert_allclose([key["weight"] for key in keys], expected.numpy(), atol=1e-5)
        assert abs(doc["scale"] - 1 / math.sqrt(hs)) < 1e-12


def test_neuron_view_of_rotary_grouped_query_heads_is_the_models_own_softmax(runs):
    """With rotary positions and 2 key heads for 4 query heads, every head and query's softmax(q·k/√d)
    equals the weights the model's explicit attention path gives."""
    checkpoint = load_checkpoint(runs["rotary"])
    capture = capture_attention(checkpoint, TEXT)
    qk = capture_query_keys(checkpoint.model, capture)
    assert qk.q.shape[1] == 4 and qk.k.shape[1] == 2  # grouped-query: q heads 0, 1 read k head 0
    for layer in range(capture.n_layers):
        for head in range(capture.n_heads):
            for query in range(len(capture.queries)):
                view = neuron_view(capture, qk, layer, head, query)
                np.testing.assert_allclose(view.weights, capture.weights[layer, head, query], atol=1e-5)


def test_neuron_view_follows_qk_norm_the_score_scale_and_a_local_window(runs):
    checkpoint = load_checkpoint(runs["gemma"])
    capture = capture_attention(checkpoint, TEXT)
    qk = capture_query_keys(checkpoint.model, capture)
    assert qk.scales == [0.3, 0.3] and qk.windows == [3, None]
    for layer in range(capture.n_layers):
        for query in range(len(capture.queries)):
            view = neuron_view(capture, qk, layer, 1, query)
            np.testing.assert_allclose(view.weights, capture.weights[layer, 1, query], atol=1e-5)
            assert view.to_json()["scale"] == 0.3
    last = len(capture.queries) - 1
    local = neuron_view(capture, qk, 0, 1, last)
    assert local.masked.tolist() == [i <= last - 3 for i in range(last + 1)]  # the local layer sees the last 3 keys


def test_neuron_view_in_the_terminal_and_its_mistakes(cli, runs, tmp_path):
    run = runs["decoder"]
    shown = cli("inspect-attention", run, "--text", TEXT, "--neuron", "1.2", "--query", "4")
    assert shown.code == 0 and "neuron view: layer 1, head 2, query 4" in shown.stdout and "softmax" in shown.stdout
    assert len([line for line in shown.stdout.splitlines() if re.match(r"\s*\d+ ", line)]) == 5  # keys 0..4: the rest are masked
    keys = json.loads(cli("inspect-attention", run, "--text", TEXT, "--neuron", "1.2", "--query", "4", "--format", "json").stdout)["keys"]
    spaced = [key for key in keys[:5] if key["text"].startswith(" ")]
    assert spaced and all(key["label"] == "␣" + key["text"][1:] for key in spaced)  # JSON text unmarked, labels as every view
    assert all(key["label"] in shown.stdout for key in spaced)
    for args, message in (
        (["--neuron", "1"], "is not LAYER.HEAD"),
        (["--neuron", "5.0"], "--neuron 5.0: layer 5 is out of range"),
        (["--query", "3"], "--query picks the neuron view's query token"),
        (["--neuron", "0.0", "--query", "99"], "--query 99 is out of range"),
        (["--neuron", "0.0", "-o", str(tmp_path / "n.png")], "the neuron view is numbers"),
    ):
        result = cli("inspect-attention", run, "--text", TEXT, *args)
        assert result.code == 2 and message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "n.png").exists()


# ---- the page in a real browser ------------------------------------------------------------------------


def _browser(playwright):
    """Headless Chromium through Playwright; under CI a missing browser fails the test, elsewhere skips it."""
    found = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(found).exists():
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed (CI needs it: apt-get install chromium)")
        missing_tool("Chromium is not installed")
    return playwright.chromium.launch(executable_path=found, args=BROWSER_ARGS)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("playwright is not installed (it is in the test extra)")
        missing_tool("playwright is not installed")
    with sync_playwright() as playwright:
        launched = _browser(playwright)
        yield launched
        launched.close()


MODEL_VIEW = """(view) => {
  const root = document.querySelector(view);
  const thumbs = Array.from(root.querySelectorAll(".mthumb"));
  const rect = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  return {
    thumbs: thumbs.length, drawn: thumbs.filter((t) => t.dataset.drawn).length,
    tags: thumbs.map((t) => (t.querySelector(".tag") || {}).textContent || null),
    titles: thumbs.map((t) => t.title), on: thumbs.filter((t) => t.classList.contains("on")).map((t) => [t.dataset.layer, t.dataset.head]),
    layer: root.querySelector('[data-part="layer"]').value, head: root.querySelector('[data-part="head"]').value,
    legend: root.querySelector('[data-part="legend"]').textContent, legendRect: rect(root.querySelector('[data-part="legend"] canvas')),
    first: rect(thumbs[0]), last: rect(thumbs[thumbs.length - 1]), viewport: [window.innerWidth, window.innerHeight],
    pageWidth: document.documentElement.scrollWidth,
    neuronRows: root.querySelectorAll('[data-part="neuron"] .nw').length, neuron: root.querySelector('[data-part="neuron"] .nnote') ? root.querySelector('[data-part="neuron"] .nnote').textContent : "",
    thumbPixel: Array.from(thumbs[0].querySelector("canvas").getContext("2d").getImageData(0, 0, 1, 1).data),
  };
}"""


def test_the_model_view_of_a_12_by_12_model_at_256_tokens_in_a_browser(cli, runs, tmp_path, browser, capsys):
    run = runs["big"]
    out = tmp_path / "big.html"
    result = cli("inspect-attention", run, "--text", _tokens(run, 300), "--crop", "-o", out)
    assert result.code == 0, result.stderr
    size = out.stat().st_size
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    began = time.perf_counter()
    page.goto(out.resolve().as_uri())
    page.wait_for_selector(".tfcli-view[data-ready]", timeout=60_000)
    loaded = time.perf_counter() - began
    timing = page.evaluate(
        """() => ({ paint: (performance.getEntriesByName("first-contentful-paint")[0] || {}).startTime,
                   drawn: (performance.getEntriesByName("tfcli-view-drawn")[0] || {}).startTime })"""
    )
    seen = page.evaluate(MODEL_VIEW, ".tfcli-view")
    with capsys.disabled():  # reported: the page's size and its time to first paint
        print(
            f"\n12 x 12 heads at 256 tokens: page {size / 1e6:.2f} MB, first paint {timing['paint']:.0f} ms, drawn {timing['drawn']:.0f} ms, load {loaded:.1f} s"
        )
    assert not errors, errors
    assert seen["thumbs"] == 144 and seen["layer"] == "0" and seen["head"] == "0" and seen["on"] == [["0", "0"]]
    assert 0 < seen["drawn"] <= 144  # drawn as they come into view
    assert seen["titles"][13].startswith("layer 1, head 1")
    summary = json.loads(cli("inspect-attention", run, "--text", _tokens(run, 300), "--crop", "--summary", "--json").stdout)["captures"][0]["summary"]
    short = {"previous-token": "prev", "first-token": "first", "duplicate": "dup", "induction": "induct", "none": None}
    assert seen["tags"] == [short[s["pattern"]] for s in summary]  # the detectors' labels on the thumbnails
    assert seen["first"][2] == pytest.approx(seen["first"][3], abs=1) and seen["first"][2] >= 40  # square thumbnails, big enough to click
    assert seen["pageWidth"] <= seen["viewport"][0]  # twelve heads across fit the window
    assert "attention weight" in seen["legend"] and seen["legendRect"][2] > 100  # a colour bar with its scale
    first_pixel = seen["thumbPixel"][:3]
    assert min(abs(a - b) for a, b in zip(first_pixel, palette.rgb(1.0))) <= 60 or first_pixel != [255, 255, 255]
    assert timing["paint"] is not None and timing["paint"] < 10_000

    # scroll to the bottom: every thumbnail is drawn; click one: the map below shows that head
    page.mouse.wheel(0, 5000)
    page.wait_for_function("() => document.querySelectorAll('.mthumb[data-drawn]').length === 144", timeout=30_000)
    page.click('.mthumb[data-layer="7"][data-head="5"]')
    seen = page.evaluate(MODEL_VIEW, ".tfcli-view")
    assert (seen["layer"], seen["head"], seen["on"]) == ("7", "5", [["7", "5"]])
    # the keys: move right and open
    page.focus('.mthumb[data-layer="7"][data-head="5"]')
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    seen = page.evaluate(MODEL_VIEW, ".tfcli-view")
    assert (seen["layer"], seen["head"]) == ("8", "6")

    # hover a token: the strips colour by the weights of layer 8, head 6, each with its value on hover
    weights = capture_attention(load_checkpoint(run), _tokens(run, 300), crop=True).weights
    hover = 40
    hovered = _hover(page, hover)
    shown = [float(t.split(": ")[1].rstrip("%")) / 100 for t in hovered["titles"][: hover + 1]]
    np.testing.assert_allclose(shown, weights[8, 6, hover, : hover + 1], atol=2 * 1 / 255 + 1e-3)  # values on hover
    assert hovered["titles"][hover + 1] == f"#{hover + 1}"  # a masked key: no value
    assert hovered["colours"][0].startswith("rgb(")
    # a page this size carries q and k of the head it opened on only: the neuron view says how to get another
    assert hovered["rows"] == 0 and "--neuron LAYER.HEAD" in hovered["neuron"] and "0.0" in hovered["neuron"]
    page.click('.mthumb[data-layer="0"][data-head="0"]')
    hovered = _hover(page, hover)
    assert f"({hover};" in hovered["neuron"] and hovered["rows"] == hover + 1  # the keys query 40 may see, with their numbers
    shot = tmp_path / "model-view.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    page.close()


def _hover(page, position: int) -> dict:
    """Hover key token `position` of the first panel; what the strips and the neuron view then show."""
    page.locator(".panel .tokens").first.locator(f":scope > span:nth-of-type({position + 1})").hover()
    return page.evaluate(
        """(q) => { const spans = Array.from(document.querySelector(".panel .tokens").children).slice(1);
                    const note = document.querySelector('[data-part="neuron"] .nnote');
                    return { titles: spans.slice(0, q + 2).map((s) => s.title), colours: spans.slice(0, q + 2).map((s) => s.style.background),
                             neuron: note ? note.textContent : "", rows: document.querySelectorAll('[data-part="neuron"] .nw').length }; }""",
        position,
    )


# ---- the notebook ----------------------------------------------------------------------------------------


def test_the_tutorial_notebook_runs_and_its_views_keep_their_own_state(runs, tmp_path, browser):
    import nbformat
    from nbclient import NotebookClient

    folder = tmp_path / "nb"
    shutil.copytree(runs["decoder"], folder / "runs" / "quickstart" / "model")  # the tutorial reads the quickstart's model
    notebook = nbformat.read(REPO / "docs" / "notebooks" / "attention.ipynb", as_version=4)
    began = time.perf_counter()
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    print(f"\nnotebook executed in {time.perf_counter() - began:.1f} s")
    pages = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", output
            html = output.get("data", {}).get("text/html")
            if html:
                pages.append(html)
    views = [p for p in pages if p.startswith('<div class="tfcli-view"')]
    tables = [p for p in pages if p.startswith('<div class="tfcli-tables"')]
    assert len(views) == 2 and len(tables) == 3  # attention twice; the logit lens, ablation and patching
    assert "logit lens" in tables[0] and "change in loss" in tables[1] and "fraction restored" in tables[2]
    ids = re.findall(r'<div class="tfcli-(?:view|tables)" id="([^"]+)"', "".join(pages))
    assert len(ids) == 5 and len(set(ids)) == 5  # every view its own id
    for page in pages:
        assert "http://" not in page and "https://" not in page and "<link" not in page  # no CDN, no network
        assert "getElementById" not in page  # scoped: a script finds its parts inside its own view
    datas = [json.loads(re.search(r'data-part="data">(.*?)</script>', v, re.DOTALL).group(1)) for v in views]
    assert (datas[0]["layers"], datas[0]["heads"], datas[0]["layer"], datas[0]["head"]) == (2, 4, 0, 0)
    assert (datas[1]["layer"], datas[1]["head"], datas[1]["focus"]) == (0, 1, 3)  # neuron="0.1", query=3
    printed = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert "softmax" in printed and "the model's own weights" in printed

    # the two views on one page, as the notebook shows them: each keeps its own state
    combined = tmp_path / "notebook.html"
    combined.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + "".join(pages) + "</body></html>", encoding="utf-8")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(combined.resolve().as_uri())
    page.wait_for_function("() => document.querySelectorAll('.tfcli-view[data-ready]').length === 2", timeout=60_000)
    first, second = f"#{ids[0]}", f"#{ids[1]}"
    page.click(f'{first} .mthumb[data-layer="1"][data-head="2"]')
    a, b = page.evaluate(MODEL_VIEW, first), page.evaluate(MODEL_VIEW, second)
    assert (a["layer"], a["head"]) == ("1", "2") and (b["layer"], b["head"]) == ("0", "1")  # the second is untouched
    assert "(3;" in b["neuron"]  # its neuron view still holds query 3
    page.locator(f"{second} .panel .tokens").first.locator(":scope > span:nth-of-type(2)").hover()
    b = page.evaluate(MODEL_VIEW, second)
    assert (b["layer"], b["head"]) == ("0", "1") and "(3;" in b["neuron"]  # held: a hover does not move it
    assert not errors, errors
    page.close()


# ---- every PNG: labels whole, a colour bar ---------------------------------------------------------------


def _corrupted(tokenizer: TextTokenizer, text: str) -> str:
    """`text` with its first word swapped for another of as many tokens (patching needs equal lengths)."""
    n = len(tokenizer.encode(text))
    words = text.split(" ")
    for other in ("fox", "dog", "cat", "ball", "the", "a", "and", "was", "it", "he", "she", "day"):
        changed = " ".join([other, *words[1:]])
        if changed != text and len(tokenizer.encode(changed)) == n:
            return changed
    raise AssertionError(f"no swap of {words[0]!r} keeps {n} tokens")


def _figures(monkeypatch) -> list:
    """Every figure the inspect PNG writers save, kept for reading back."""
    from tfcli.inspect import png

    figures: list = []
    original = png._save

    def keep(figure, dpi):
        data = original(figure, dpi)  # drawn: the layout is final
        figures.append(figure)
        return data

    monkeypatch.setattr(png, "_save", keep)
    return figures


def _check_figure(figure, expected_labels: list[str]) -> None:
    """Every text artist lies inside the figure; every expected label is a tick label, whole; a colour bar."""
    from tfcli.inspect.png import tick_text

    figure.canvas.draw()  # at the figure's own dpi, so the extents and the figure's box share one scale
    renderer = figure.canvas.get_renderer()
    box = figure.bbox
    texts = [t for t in figure.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_window_extent")) if t.get_visible() and t.get_text().strip()]
    for text in texts:
        extent = text.get_window_extent(renderer)
        if not np.isfinite(extent.get_points()).all():
            continue  # a tick matplotlib does not draw (outside its axis): no place on the picture
        assert extent.x0 >= box.x0 - 1 and extent.y0 >= box.y0 - 1 and extent.x1 <= box.x1 + 1 and extent.y1 <= box.y1 + 1, (text.get_text(), extent, box)
    shown = {t.get_text() for t in texts}
    ticks = [t.get_text() for ax in figure.axes for t in ax.get_xticklabels() + ax.get_yticklabels()] + [t.get_text() for ax in figure.axes for t in ax.texts]
    assert not any("…" in t for t in ticks), [t for t in ticks if "…" in t]  # no label shortened (a title's excerpt of the text may be)
    missing = [label for label in expected_labels if tick_text(label) not in shown]
    assert not missing, missing[:10]
    assert any(hasattr(ax, "_colorbar") for ax in figure.axes), "no colour bar"


@pytest.mark.parametrize("count", [12, 200])
def test_every_inspect_png_has_its_labels_whole_and_a_colour_bar(cli, runs, tmp_path, monkeypatch, count):
    run = runs["long"]
    text = _tokens(run, count)
    tokenizer = TextTokenizer.load(run)
    views = capture_attention(load_checkpoint(run), text, crop=True).queries
    views = views[:count]
    text = tokenizer.decode([v.id for v in views])
    labels = [v.label for v in capture_attention(load_checkpoint(run), text).queries]
    step = max(1, math.ceil(len(labels) / 80))
    ticked = labels[::step]
    figures = _figures(monkeypatch)
    word = max((v.text.strip() for v in views if v.text.strip().isalpha()), key=len)
    commands = [
        (["inspect-attention", run, "--text", text, "-o", tmp_path / "head.png"], ticked),
        (["inspect-attention", run, "--text", text, "--head", "all", "-o", tmp_path / "grid.png"], []),
        (["inspect-attention", run, "--text", text, "--token", word, "-o", tmp_path / "token.png"], ticked),
        (["inspect-logits", run, "--text", text, "-o", tmp_path / "lens.png"], [_short(label) for label in labels]),
        (["inspect-ablate", run, "--text", text, "-o", tmp_path / "ablate.png"], ["layer 0", "head 3"]),
        (
            [
                "inspect-patch",
                run,
                "--clean",
                text,
                "--corrupt",
                _corrupted(tokenizer, text),
                "--answer",
                " it",
                "--method",
                "attribution",
                "-o",
                tmp_path / "patch.png",
            ],
            ["block 1"],
        ),
    ]
    for args, expected in commands:
        result = cli(*args)
        assert result.code == 0, (args, result.stderr)
        _check_figure(figures[-1], expected)
    assert len(figures) == len(commands)
    lens = figures[3]
    if count == 200:
        width, height = lens.get_size_inches()
        assert width < 20 and height / width > 0.5  # laid out in bands down a page, not a 200-column strip


def test_one_palette_for_the_terminal_the_pages_and_the_pngs():
    """The stops the terminal and the pages use are matplotlib's viridis, on the PNGs' square-root scale."""
    import matplotlib

    from tfcli.inspect.png import _cmap, _norm

    viridis = matplotlib.colormaps["viridis"]
    for i, stop in enumerate(palette.VIRIDIS):
        assert stop == tuple(round(255 * c) for c in viridis(i / (len(palette.VIRIDIS) - 1))[:3])
    for weight in (0.0, 0.003, 0.04, 0.25, 0.6, 1.0):
        png_colour = np.array(_cmap()(_norm()(weight))[:3]) * 255
        assert np.abs(png_colour - palette.rgb(weight)).max() <= 3, weight  # the same colour for the same weight


def test_the_model_view_labels_each_head_with_its_pattern_in_a_browser(runs, tmp_path, browser):
    """The detectors' labels reach the thumbnails: heads summarised as previous-token and induction show
    `prev` and `induct` (the summary here is given, so the labels are known whatever the random weights)."""
    from tfcli.inspect.html import render_page
    from tfcli.inspect.stats import HeadSummary

    capture = capture_attention(load_checkpoint(runs["decoder"]), TEXT)
    patterns = {(0, 1): ("previous-token", 0.91), (1, 3): ("induction", 0.62)}
    labels = [
        HeadSummary(
            layer=l, head=h, entropy=1.0, distance=1.0, scores={}, pattern=patterns.get((l, h), ("none", 0.1))[0], score=patterns.get((l, h), ("none", 0.1))[1]
        )
        for l in range(2)
        for h in range(4)
    ]
    out = tmp_path / "labels.html"
    out.write_text(render_page([capture], ["text"], labels=labels), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(out.resolve().as_uri())
    page.wait_for_selector(".tfcli-view[data-ready]")
    seen = page.evaluate(MODEL_VIEW, ".tfcli-view")
    assert seen["tags"] == [None, "prev", None, None, None, None, None, "induct"]
    assert seen["titles"][1] == "layer 0, head 1: previous-token (best score 0.91)" and seen["titles"][0].endswith("no known pattern (best score 0.10)")
    page.close()
