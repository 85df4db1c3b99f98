"""`tfcli inspect-attention`: capture through the model's own weights, the terminal views, encoder-decoder
kinds, comparisons, long texts, and every user mistake as one line with exit code 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.cells import cell_len

from tests.conftest import snapshot
from tests.helpers import heavy_imports_of
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.errors import TfcliError
from tfcli.inspect.capture import capture_attention, find_token, parse_index
from tfcli.inspect.hooks import Hooks
from tfcli.inspect.labels import excerpts
from tfcli.inspect.terminal import _short, fit
from tfcli.model.config import preset
from tfcli.model.transformer import HIDDEN, DecoderInput, Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.show import TokenView

TEXT = "The animal didn't cross the street because it was too tired"
TEXT2 = "The animal didn't cross the street because it was too wide"


def _save(folder: Path, tokenizer: TextTokenizer, seed: int = 0, **overrides) -> Path:
    torch.manual_seed(seed)
    config = preset(
        "tiny", vocab_size=tokenizer.vocab_size, **{"block_size": 64, "n_layers": 2, "n_heads": 4, "d_model": 32, "d_ff": 64, "init_std": 0.2, **overrides}
    )
    save_checkpoint(folder, Transformer(config), tokenizer)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """Tiny random runs: a decoder (and a second seed of it), an encoder, an encoder-decoder, another shape."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    root = tmp_path_factory.mktemp("inspect-runs")
    return {
        "decoder": _save(root / "decoder", tokenizer),
        "decoder2": _save(root / "decoder2", tokenizer, seed=1),
        "encoder": _save(root / "encoder", tokenizer, arch="encoder"),
        "seq2seq": _save(root / "seq2seq", tokenizer, arch="encoder-decoder", positions="sinusoidal", n_decoder_layers=3),
        "wide": _save(root / "wide", tokenizer, n_heads=2),
        "short": _save(root / "short", tokenizer, block_size=16),
    }


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "50")


# ---- capture ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,kind", [("decoder", "decoder"), ("encoder", "encoder"), ("seq2seq", "encoder"), ("seq2seq", "decoder"), ("seq2seq", "cross")])
def test_capture_is_the_models_own_weights(runs, arch, kind):
    checkpoint = load_checkpoint(runs[arch])
    target = "a red ball" if arch == "seq2seq" else None
    capture = capture_attention(checkpoint, TEXT, target=target, kind=kind)
    w = capture.weights
    assert w.dtype == np.float32 and w.shape[:2] == (checkpoint.config.model.n_layers if kind == "encoder" else checkpoint.config.model.decoder_layers, 4)
    assert np.allclose(w.sum(axis=-1), 1.0, atol=1e-5)  # every row a distribution
    T, S = w.shape[2:]
    assert T == len(capture.queries) and S == len(capture.keys)
    if kind == "decoder":
        assert np.all(w[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)  # masked keys exactly 0
        assert np.all(np.diagonal(w, axis1=2, axis2=3) > 0)
    else:
        assert np.all(w > 0)
    # the same numbers as the model's explicit path returns
    src = torch.tensor([capture.source_ids])
    kwargs = {"decoder": DecoderInput(torch.tensor([capture.decoder_ids]))} if capture.decoder_ids is not None else {}
    with torch.no_grad(), Hooks() as hooks:
        patterns = hooks.attention_patterns(checkpoint.model)
        checkpoint.model(src, head=HIDDEN, **kwargs)
    expected = patterns[kind]
    assert np.array_equal(w, torch.cat(expected).numpy())


def test_encoder_decoder_layout(runs):
    checkpoint = load_checkpoint(runs["seq2seq"])
    tokenizer = checkpoint.tokenizer
    cross = capture_attention(checkpoint, "the fox found a ball", target="a red ball", kind="cross")
    assert [v.id for v in cross.keys] == tokenizer.encode("the fox found a ball")
    assert [v.id for v in cross.queries] == [tokenizer.special_ids["eos"]] + tokenizer.encode("a red ball")  # start token first
    assert cross.weights.shape == (3, 4, len(cross.queries), len(cross.keys)) and not cross.causal
    decoder = capture_attention(checkpoint, "the fox found a ball", target="a red ball", kind="decoder")
    assert decoder.causal and decoder.queries == decoder.keys == cross.queries


def test_text_longer_than_the_block_is_an_error_or_cropped(runs):
    checkpoint = load_checkpoint(runs["short"])
    long_text = TEXT * 3
    with pytest.raises(TfcliError, match=r"longer than the model's block size \(16\).*--crop"):
        capture_attention(checkpoint, long_text)
    capture = capture_attention(checkpoint, long_text, crop=True)
    assert capture.weights.shape[2:] == (16, 16)
    assert [v.id for v in capture.queries] == checkpoint.tokenizer.encode(long_text)[:16]
    assert "cropped to its first 16" in capture.notes[0]


def _views(*texts: str) -> list[TokenView]:
    return [TokenView(id=i, token=t, text=t, piece=t) for i, t in enumerate(texts)]


def test_find_token():
    views = _views("The", " anim", "al", " saw", " it", ".", " It", " ran", " with", " it")
    assert find_token(views, "it") == (4, "occurrence 1 of 2 (--occurrence picks another)")
    assert find_token(views, "it", 2)[0] == 9
    assert find_token(views, "It")[0] == 6  # case matters while something matches exactly
    assert find_token(views, "RAN")[0] == 7  # then case is ignored
    assert find_token(views, "animal") == (2, "2 tokens; showing the last")  # the token that has read all of it
    assert find_token(views, "ani")[0] == 1  # a piece of a word, when no whole word matches
    with pytest.raises(TfcliError, match="not in the text"):
        find_token(views, "zebra")
    with pytest.raises(TfcliError, match="occurs 2 times"):
        find_token(views, "it", 3)


def test_find_token_reads_characters_split_over_byte_tokens():
    from tfcli.tokenizer.show import visible

    # "Hi 世界\n" as byte-level tokens "Hi", " \xe4", "\xb8\x96\xe7", "\x95\x8c", "\n" read through the decoder: a
    # character belongs to the token that completes it, the tokens before hold a part of it
    pieces, parts = ["Hi", " ", "世", "界", "\n"], ["", "世", "界", "", ""]
    views = [TokenView(id=i, token="", text=visible(p + part), piece=p, part=part) for i, (p, part) in enumerate(zip(pieces, parts))]
    assert find_token(views, "世界") == (3, "2 tokens; showing the last")
    assert find_token(views, "世")[0] == 2  # the token that completes the character
    with pytest.raises(TfcliError) as error:
        find_token(views, "zebra")
    assert "'␣世'" in error.value.message and "'↵'" in error.value.message  # labels: a space marked ␣, a newline ↵
    assert "\\" not in error.value.message  # no escape, doubled or not


def test_excerpts_of_two_texts_never_look_the_same():
    assert excerpts([TEXT, TEXT2]) == ["…because it was too tired", "…because it was too wide"]
    assert excerpts([TEXT]) == ["The animal didn't cross the street because it w…"]  # one text: its beginning
    assert excerpts(["A short one", "A short two"]) == ["A short one", "A short two"]  # whole when they fit
    assert excerpts(["x " * 40, "x " * 40 + "y"], 20) == ["…x x x", "…x x x y"]  # one is the beginning of the other
    assert excerpts(["a  b\n", "a b\n"]) == ["a  b\\n", "a b\\n"]  # only whitespace differs: kept (and escaped)
    long_word = "w" * 60
    first, second = excerpts([long_word + " one", long_word + " two"], 30)
    assert first != second and len(first) <= 30 and first.endswith("one") and second.endswith("two")


def test_compared_titles_differ_in_the_png(cli, runs, tmp_path, monkeypatch):
    from tfcli.inspect import png

    seen = {}
    for name in ("heatmaps_png", "grid_png"):
        monkeypatch.setattr(png, name, lambda *args, _name=name, **kwargs: seen.setdefault(_name, (args, kwargs)) and b"\x89PNG")
    assert cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare", TEXT2, "-o", tmp_path / "a.png").code == 0
    titles = [item[0] for item in seen["heatmaps_png"][0][0]]
    assert titles == ["1: …because it was too tired · layer 0, head 0", "2: …because it was too wide · layer 0, head 0"]
    assert cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare", TEXT2, "--head", "all", "-o", tmp_path / "b.png").code == 0
    assert seen["grid_png"][1]["suptitle"] == "decoder self-attention · 1: …because it was too tired  |  2: …because it was too wide"


def test_parse_index():
    assert parse_index("all", 3, "layer") == [0, 1, 2]
    assert parse_index("-1", 3, "layer") == [2]
    assert parse_index(None, 3, "head") == [0]
    assert parse_index(None, 3, "head", default=None) == [0, 1, 2]
    with pytest.raises(TfcliError, match="out of range"):
        parse_index("3", 3, "head")
    with pytest.raises(TfcliError, match="a number or 'all'"):
        parse_index("two", 3, "head")


# ---- the terminal ---------------------------------------------------------------------------------


def _lines(stdout: str) -> list[str]:
    return stdout.rstrip("\n").splitlines()


def _fits(stdout: str, width: int = 80) -> bool:
    return all(cell_len(line) <= width for line in _lines(stdout))


def test_heatmap_of_one_head(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--layer", "1", "--head", "2")
    assert result.code == 0, result.stderr
    assert _fits(result.stdout)
    assert "layer 1, head 2" in result.stdout and "decoder self-attention" in result.stdout
    assert "blank: masked" in result.stdout  # the legend
    capture = capture_attention(load_checkpoint(runs["decoder"]), TEXT)
    labels = [_short(v.label) for v in capture.queries]
    width = min(12, max(cell_len(label) for label in labels))
    lines = _lines(result.stdout)
    first = next(i for i, line in enumerate(lines) if line.startswith(fit(labels[0], width, right=True) + " "))
    for q, label in enumerate(labels):  # a row per token, labelled, then its cells: masked ones blank
        row = lines[first + q]
        assert row.startswith(fit(label, width, right=True) + " ")
        cells = row[width + 1 :]
        assert cells[2 * q : 2 * q + 2].strip() != "" and cells[2 * q + 2 :].strip() == ""
    depth = min(4, max(len(label) for label in labels))
    column_labels = [line.ljust(80) for line in lines[first - depth : first]]  # the keys, written downwards
    assert labels[17] == "␣the"  # a word after a space: its label marks the space
    assert "".join(line[width + 1 + 2 * 17] for line in column_labels).strip() == "␣the"


def test_long_text_is_windowed_and_says_so(cli, runs):
    text = "Once upon a time a little fox found a red ball in the park, and then it ran."
    n = len(TextTokenizer.load(runs["decoder"]).encode(text))
    assert n > 40
    result = cli("inspect-attention", runs["decoder"], "--text", text)
    assert result.code == 0 and _fits(result.stdout)
    found = re.search(rf"queries 0-(\d+) and keys 0-\1 of {n} tokens shown; --start (\d+) for more", " ".join(result.stdout.split()))
    assert found and int(found.group(2)) == int(found.group(1)) + 1  # the --start that pages on
    moved = cli("inspect-attention", runs["decoder"], "--text", text, "--start", "20")
    assert moved.code == 0 and _fits(moved.stdout)
    assert "queries 20-" in moved.stdout
    assert "… sums the weight" in " ".join(moved.stdout.split())  # earlier keys summed into a column


def test_grid_of_every_head_and_layer(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--head", "all", "--layer", "all")
    assert result.code == 0 and _fits(result.stdout)
    for layer in (0, 1):
        for head in range(4):
            assert f"L{layer} H{head}" in result.stdout
    assert "aggregated into 12 bins" in " ".join(result.stdout.split())


def test_token_bars_per_head(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--token", "it", "--layer", "1")
    assert result.code == 0 and _fits(result.stdout)
    assert "where '␣it' (position" in result.stdout
    assert all(f"L1 H{h}" in result.stdout for h in range(4))
    one = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--token", "it", "--layer", "1", "--head", "0")
    assert one.code == 0 and _fits(one.stdout)
    checkpoint = load_checkpoint(runs["decoder"])
    capture = capture_attention(checkpoint, TEXT)
    position = find_token(capture.queries, "it")[0]
    row = capture.weights[1, 0, position]
    for k in range(position + 1):  # a bar per visible key with its weight; later keys (masked) not listed
        assert f"{row[k]:.3f}" in one.stdout
    assert len([line for line in _lines(one.stdout) if re.match(r"\s*\d+ .* \d\.\d{3}$", line)]) == position + 1


def test_token_text_never_reaches_the_terminal_raw(cli, runs):
    text = "[bold]x[/bold] \x1b]0;pwned\x07 <script>alert(1)</script> done"
    result = cli("inspect-attention", runs["decoder"], "--text", text)
    assert result.code == 0
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "[bold" in result.stdout or "[" in result.stdout  # markup printed as text, not applied
    grid = cli("inspect-attention", runs["decoder"], "--text", text, "--token", "pwned")
    assert grid.code == 0 and "\x1b" not in grid.stdout


def test_summary_table_and_json(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--summary")
    assert result.code == 0 and _fits(result.stdout)
    for column in ("entropy", "distance", "pattern", "prev", "first", "dup", "induct"):
        assert column in result.stdout
    data = json.loads(cli("inspect-attention", runs["decoder"], "--text", TEXT, "--summary", "--json").stdout)
    summary = data["captures"][0]["summary"]
    assert len(summary) == 8 and {"layer", "head", "entropy_bits", "mean_distance", "pattern", "score", "scores"} <= set(summary[0])
    assert "weights" not in data["captures"][0]  # the summary's data, not megabytes of maps
    assert all(0 <= s["scores"]["induction"] <= 1 for s in summary)
    only = json.loads(cli("inspect-attention", runs["decoder"], "--text", TEXT, "--summary", "--json", "--layer", "1").stdout)
    assert {s["layer"] for s in only["captures"][0]["summary"]} == {1}


def test_compare_two_texts_side_by_side(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare", TEXT2, "--layer", "1", "--head", "3")
    assert result.code == 0 and _fits(result.stdout)
    assert "1: …because it was too tired" in result.stdout and "2: …because it was too wide" in result.stdout  # never alike
    assert sum(line.count("layer 1, head 3") for line in _lines(result.stdout)) == 2  # two maps on the same lines
    bars = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare", TEXT2, "--token", "it")
    assert bars.code == 0 and _fits(bars.stdout)
    missing = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare", "no such word", "--token", "it")
    assert missing.code == 2 and "second text" in missing.stderr


def test_compare_run_ranks_changed_heads(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare-run", runs["decoder2"])
    assert result.code == 0 and _fits(result.stdout)
    assert "heads that changed most" in result.stdout and "JS divergence" in result.stdout
    data = json.loads(cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare-run", runs["decoder2"], "--json").stdout)
    changes = data["changes"]
    assert len(changes) == 8 and changes == sorted(changes, key=lambda c: -c["js_bits"])
    a = capture_attention(load_checkpoint(runs["decoder"]), TEXT).weights
    b = capture_attention(load_checkpoint(runs["decoder2"]), TEXT).weights
    top = changes[0]
    assert f"layer {top['layer']}, head {top['head']}" in result.stdout  # the most changed head is shown
    assert np.abs(a - b).sum() > 0
    same = json.loads(cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare-run", runs["decoder"], "--json").stdout)
    assert all(c["js_bits"] == 0 for c in same["changes"])


@pytest.mark.parametrize("other,message", [("wide", "differ in shape"), ("encoder", "differ in shape"), ("short", "differ in shape")])
def test_compare_run_refuses_another_shape(cli, runs, other, message):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare-run", runs[other])
    assert result.code == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_compare_run_refuses_another_tokenizer(cli, runs, tmp_path, tiny_corpus):
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    train_tokenizer(resolve_corpus([tiny_corpus]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=320, lowercase=True))
    other = _save(tmp_path / "run", TextTokenizer.load(tmp_path / "tok"))
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--compare-run", other)
    assert result.code == 2 and "different tokenizers" in result.stderr


def test_encoder_decoder_from_the_command_line(cli, runs):
    base = ("inspect-attention", runs["seq2seq"], "--text", "the fox found a ball", "--target", "a red ball")
    tokenizer = TextTokenizer.load(runs["seq2seq"])
    cross = cli(*base)  # cross-attention by default
    assert cross.code == 0 and _fits(cross.stdout)
    assert (
        f"cross-attention · 3 layers × 4 heads · {len(tokenizer.encode('a red ball')) + 1} tokens over "
        f"{len(tokenizer.encode('the fox found a ball'))} source tokens" in cross.stdout
    )
    for kind in ("encoder", "decoder", "cross"):
        result = cli(*base, "--attention", kind, "--head", "all")
        assert result.code == 0, result.stderr
        assert (f"{kind} self-attention" if kind != "cross" else "cross-attention") in result.stdout
    summary = cli(*base, "--attention", "cross", "--summary")
    assert summary.code == 0 and "entropy" in summary.stdout and "induct" not in summary.stdout
    no_target = cli("inspect-attention", runs["seq2seq"], "--text", "the fox")
    assert no_target.code == 2 and "--target" in no_target.stderr
    encoder_only = cli("inspect-attention", runs["seq2seq"], "--text", "the fox found a ball", "--attention", "encoder", "--summary")
    assert encoder_only.code == 0 and "encoder self-attention" in encoder_only.stdout  # the encoder reads no target
    assert cli("inspect-attention", runs["decoder"], "--text", "the fox", "--target", "x").code == 2
    wrong = cli("inspect-attention", runs["decoder"], "--text", "the fox", "--attention", "cross")
    assert wrong.code == 2 and "no cross attention" in wrong.stderr


def test_a_long_cross_attention_source_windows_its_columns(cli, runs):
    source = "Once upon a time a little fox found a red ball in the park, and then it ran home to its mother."
    n_source = len(TextTokenizer.load(runs["seq2seq"]).encode(source))
    assert n_source > 40
    base = ("inspect-attention", runs["seq2seq"], "--text", source, "--target", "a red ball")
    first = cli(*base)
    assert first.code == 0 and _fits(first.stdout)
    flat = " ".join(first.stdout.split())
    assert re.search(r"keys 0-\d+ of", flat) and "--key-start N the columns" in flat
    moved = cli(*base, "--key-start", "10")
    assert moved.code == 0 and _fits(moved.stdout)
    assert re.search(r"keys 10-\d+ of", " ".join(moved.stdout.split()))
    past = cli(*base, "--key-start", str(n_source))
    assert past.code == 2 and "past the last source token" in past.stderr
    grid = cli(*base, "--head", "all")
    assert f"{len(TextTokenizer.load(runs['seq2seq']).encode('a red ball')) + 1} queries aggregated into" in " ".join(grid.stdout.split())
    assert f"{n_source} keys into 12" in " ".join(grid.stdout.split())


def test_summary_keeps_the_run_comparison_and_the_token(cli, runs):
    ranked = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--summary", "--compare-run", runs["decoder2"])
    assert ranked.code == 0 and "heads that changed most" in ranked.stdout and "entropy" in ranked.stdout
    token = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--summary", "--token", "it")
    assert token.code == 0 and "entropy" in token.stdout and "where '␣it' (position" in token.stdout
    ignored = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--head", "all", "--start", "2")
    assert ignored.code == 0 and "they change nothing here" in " ".join(ignored.stdout.split())


def test_causal_token_bars_list_only_visible_keys(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", "it was here", "--token", "it")
    assert result.code == 0
    rows = [line for line in _lines(result.stdout) if re.match(r"L\d H\d", line)]
    assert len(rows) == 4 and all(line.count("0.") + line.count("1.0") == 1 for line in rows), rows  # one key: itself


def test_crop_from_the_command_line(cli, runs):
    result = cli("inspect-attention", runs["short"], "--text", TEXT * 3)
    assert result.code == 2 and "--crop" in result.stderr
    cropped = cli("inspect-attention", runs["short"], "--text", TEXT * 3, "--crop")
    assert cropped.code == 0 and "cropped to its first 16" in " ".join(cropped.stdout.split())


def test_text_file(cli, runs, tmp_path):
    (tmp_path / "t.txt").write_bytes(TEXT.encode() + b"\xff")
    result = cli("inspect-attention", runs["decoder"], "--text-file", tmp_path / "t.txt", "--token", "tired")
    assert result.code == 0, result.stderr
    assert f"is not valid UTF-8 (byte {len(TEXT.encode())})" in " ".join(result.stderr.split())


# ---- mistakes ---------------------------------------------------------------------------------------

MISTAKES = [
    (["--text", TEXT, "--layer", "2"], "--layer 2 is out of range"),
    (["--text", TEXT, "--head", "4"], "--head 4 is out of range"),
    (["--text", TEXT, "--head", "-5"], "out of range"),
    (["--text", TEXT, "--layer", "first"], "a number or 'all'"),
    (["--text", "   "], "empty"),
    (["--text", ""], "empty"),
    ([], "no text given"),
    (["--text", TEXT, "--token", "zebra"], "not in the text"),
    (["--text", TEXT, "--token", "it", "--occurrence", "2"], "occurs once"),
    (["--text", TEXT, "--format", "bmp"], "unknown format 'bmp'"),
    (["--text", TEXT, "--format", "html"], "pass -o FILE.html"),
    (["--text", TEXT, "--format", "png"], "pass -o FILE.png"),
    (["--text", TEXT, "-o", "OUT/attention.svg"], "cannot tell the format"),
    (["--text", TEXT, "-o", "OUT/missing/a.html"], "does not exist"),
    (["--text", TEXT, "-o", "OUT/file.txt/a.html"], "does not exist"),
    (["--text", TEXT, "-o", "OUT", "--format", "html"], "is a folder"),
    (["--text", TEXT, "--format", "terminal", "-o", "OUT/a.html"], "prints to the screen"),
    (["--text", TEXT, "--json", "--format", "html", "-o", "OUT/a.html"], "--json prints JSON"),
    (["--text", TEXT, "--start", "3", "-o", "OUT/a.html"], "--start moves"),
    (["--text", TEXT, "--summary", "-o", "OUT/a.png"], "--summary is a table"),
    (["--text", TEXT, "--compare", "x", "--compare-run", "RUN"], "cannot be used together"),
    (["--text", TEXT, "--text-file", "OUT/x.txt"], "not both"),
    (["--text-file", "OUT/none.txt"], "does not exist"),
    (["--text", TEXT, "--device", "tpu"], "unknown device"),
    (["--text", TEXT, "--start", "500"], "--start 500 is past the last token"),
    (["--text", TEXT, "--format", "png", "-o", "OUT/a.html"], "--format png but -o"),
    (["--text", TEXT, "--key-start", "2"], "--key-start moves the columns of a cross-attention map"),
    (["--text", TEXT, "--key-start", "-1"], "--key-start must be 0 or more"),
    (["--text-file", "OUT"], "is a folder"),
    (["--text-file", "OUT/data.bin"], "data.bin looks like a binary file (it holds NUL bytes); pass text files only"),
    (["--text", TEXT, "--target-file", "OUT/data.bin"], "data.bin looks like a binary file"),
]


@pytest.mark.parametrize("args,message", MISTAKES, ids=[m for _, m in MISTAKES])
def test_mistakes_are_one_line_and_write_nothing(cli, runs, tmp_path, args, message):
    out = tmp_path / "out"
    out.mkdir()
    (out / "file.txt").write_text("x")
    (out / "x.txt").write_text("x")
    (out / "data.bin").write_bytes(b"The fox\x00\x01\x02 ran")
    before = snapshot(tmp_path)
    args = [str(a).replace("OUT", str(out)).replace("RUN", str(runs["decoder2"])) for a in args]
    result = cli("inspect-attention", runs["decoder"], *args)
    assert result.code == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before


def test_a_binary_text_file_gets_the_line_tokenize_gives(cli, runs, tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00" * 16 + TEXT.encode())
    inspected = cli("inspect-attention", runs["decoder"], "--text-file", binary)
    tokenized = cli("tokenize", "train", binary, "-o", tmp_path / "tok")
    assert inspected.code == tokenized.code == 2
    assert inspected.stderr == tokenized.stderr == f"error: {binary} looks like a binary file (it holds NUL bytes); pass text files only\n"


def test_missing_run_is_one_line(cli, tmp_path):
    result = cli("inspect-attention", tmp_path / "nope", "--text", TEXT)
    assert result.code == 2 and result.stderr.count("\n") == 1 and "does not exist" in result.stderr


@pytest.mark.parametrize("name", ["a.html", "a.png", "a.json"])
def test_a_failed_write_leaves_nothing(cli, runs, tmp_path, monkeypatch, name):
    import tfcli.fsutil

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tfcli.fsutil.os, "fsync", full_disk)
    before = snapshot(tmp_path)
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "-o", tmp_path / name)
    assert result.code == 2 and "No space left" in result.stderr and "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before  # no file, no temp file


def test_help_has_an_example_and_does_not_import_torch(cli):
    result = cli("inspect-attention", "--help")
    assert result.code == 0
    assert "Example: tfcli inspect-attention" in " ".join(result.stdout.split())
    assert heavy_imports_of(["inspect-attention", "--help"], ("torch", "numpy", "matplotlib", "tokenizers")) == []
