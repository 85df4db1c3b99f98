"""The logit lens, head ablation and activation patching: on a hand-built model whose answers are known,
against transformers on an imported random GPT-2, hooks that never stay behind, and the commands' output
and mistakes (one line, exit code 2)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from tests.helpers import needs_chromium
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.inspect.ablation import ablated_runs, head_means, parse_heads
from tfcli.inspect.attribution import attribution_differences, top_cells
from tfcli.inspect.hooks import Hooks
from tfcli.inspect.lens import lens_logits
from tfcli.inspect.patching import patch_differences
from tfcli.model.config import ModelConfig, preset
from tfcli.model.transformer import DecoderInput, Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.show import label_text

V = 8  # the hand-built model's vocabulary


def previous_token_model() -> Transformer:
    """Two layers of two heads, built by hand: layer 0 does nothing, and layer 1's head 0 attends to the
    previous position (by the angle of a learned position code) and copies its token into a "previous token"
    block of the residual stream, which the vocabulary head reads. Head 1 of each layer writes nothing.
    So on "a b a b ..." (each next token is the one before the last) the model is nearly always right, and
    only head 1.0 matters.

    Residual stream (d = 24): [0, 8) the token, [8, 16) the previous token, [16, 18) the position code.
    """
    d = 24  # two heads of 12 dimensions
    config = ModelConfig(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=d, d_ff=8, norm="rmsnorm", positions="learned", tie_embeddings=False)
    model = Transformer(config).eval()
    theta = math.pi / 16
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
        model.tok_emb.weight[:, :V] = torch.eye(V)
        t = torch.arange(16, dtype=torch.float32)
        model.pos_emb.weight[:, 16] = torch.cos(theta * t)
        model.pos_emb.weight[:, 17] = torch.sin(theta * t)
        qkv = model.decoder.blocks[1].attn.qkv.weight  # rows: q (d), k (d), v (d); head 0 is each's first hs
        beta = 300.0
        rotate = torch.tensor([[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]])  # by -theta
        qkv[0:2, 16:18] = beta * rotate  # q: the code of the position before
        qkv[d : d + 2, 16:18] = torch.eye(2)  # k: the position's code
        qkv[2 * d : 2 * d + V, 0:V] = torch.eye(V)  # v: the token
        out = model.decoder.blocks[1].attn.out.weight
        out[V : 2 * V, 0:V] = torch.eye(V) / math.sqrt(12)  # into the previous-token block (undoing the norm's scale)
        model.lm_head.weight[:, V : 2 * V] = 3.0 * torch.eye(V)
    return model


ALTERNATING = [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]


def induction_model() -> Transformer:
    """Two layers of two heads, built by hand to hold an induction circuit: layer 0's head 0 attends to the
    previous position (by the angle of a learned position code) and writes that token into a "previous
    token" block; layer 1's head 0 queries with the current token and keys on that block, so it attends to
    the position right after an earlier occurrence of the current token (A B ... A -> B). The other heads
    write nothing and attend evenly.

    Residual stream (d = 24): [0, 8) the token, [8, 16) the previous token, [16, 18) the position code.
    """
    d, theta = 24, math.pi / 16
    config = ModelConfig(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=d, d_ff=8, norm="rmsnorm", positions="learned", tie_embeddings=False)
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.zero_()
        model.tok_emb.weight[:, :V] = torch.eye(V)
        t = torch.arange(16, dtype=torch.float32)
        model.pos_emb.weight[:, 16] = torch.cos(theta * t)
        model.pos_emb.weight[:, 17] = torch.sin(theta * t)
        previous = model.decoder.blocks[0].attn
        rotate = torch.tensor([[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]])  # by -theta
        previous.qkv.weight[0:2, 16:18] = 300.0 * rotate  # q: the code of the position before
        previous.qkv.weight[d : d + 2, 16:18] = torch.eye(2)  # k: the position's code
        previous.qkv.weight[2 * d : 2 * d + V, 0:V] = torch.eye(V)  # v: the token
        previous.out.weight[V : 2 * V, 0:V] = torch.eye(V) / math.sqrt(12)  # into the previous-token block
        induction = model.decoder.blocks[1].attn
        induction.qkv.weight[0:V, 0:V] = 30.0 * torch.eye(V)  # q: the current token
        induction.qkv.weight[d : d + V, V : 2 * V] = torch.eye(V)  # k: the token before the key
    return model


def test_a_hand_built_induction_head_scores_high_on_the_detector():
    from tfcli.inspect.capture import forward_weights
    from tfcli.inspect.stats import pattern_scores

    model = induction_model()
    ids = [3, 1, 6, 0, 5, 2, 7, 4] * 2  # a repeated random sequence, as the detector's probe
    scores = pattern_scores(forward_weights(model, "decoder", ids), ids)
    assert scores["previous-token"][0, 0] > 0.95 and scores["induction"][1, 0] > 0.9  # 15/16: position 0 is its own "previous"
    others = [(0, 0), (0, 1), (1, 1)]
    assert all(scores["induction"][pair] < 0.2 for pair in others)  # even attention: about 1/12 on the right key
    assert all(scores["previous-token"][pair] < 0.5 for pair in [(0, 1), (1, 0), (1, 1)])


def _loss(logits: torch.Tensor, ids: list[int]) -> float:
    return float(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])))


def test_the_hand_built_model_copies_the_previous_token():
    model = previous_token_model()
    with torch.no_grad(), Hooks() as hooks:
        patterns = hooks.attention_patterns(model)
        out = model(torch.tensor([ALTERNATING]))
    weights = patterns["decoder"][1][0, 0]  # layer 1, head 0: (T, T)
    assert torch.all(weights.diagonal(-1) > 0.99)  # each position looks at the one before
    assert torch.equal(out.logits[0, 1:].argmax(-1), torch.tensor(ALTERNATING[:-1]))  # the token before the last
    assert 0.7 < _loss(out.logits[0], ALTERNATING) < 0.8  # position 0 (no token before it) is all the loss


def test_ablating_the_previous_token_head_changes_the_loss_and_no_other_head_does():
    model = previous_token_model()
    rows = [[]] + [[(layer, head)] for layer in range(2) for head in range(2)]
    losses, log_probs = ablated_runs(model, ALTERNATING, rows, torch.zeros(2, 2, 12), position=len(ALTERNATING) - 1, batch=3)
    base = float(losses[0])
    assert base < 0.8
    delta = (losses[1:] - base).reshape(2, 2)
    assert delta[1, 0] > 1.2  # without it the model knows nothing: loss ln 8
    assert abs(float(losses[3]) - math.log(V)) < 1e-5
    for layer, head in [(0, 0), (0, 1), (1, 1)]:
        assert abs(float(delta[layer, head])) < 1e-6
    # the same loss as the model run with that head zeroed by a hook of its own
    with torch.no_grad(), Hooks() as hooks:
        hooks.edit_heads(model.decoder, 1, lambda z: z[:, :, 0].zero_())
        logits = model(torch.tensor([ALTERNATING])).logits[0]
    assert abs(_loss(logits, ALTERNATING) - float(losses[3])) < 1e-6
    assert torch.allclose(log_probs[3], torch.log_softmax(logits[-1], -1), atol=1e-6)


def test_mean_ablation_puts_in_the_heads_mean_output():
    model = previous_token_model()
    means = head_means(model, ALTERNATING)  # (L, nh, hs)
    assert means.shape == (2, 2, 12)
    assert torch.count_nonzero(means[0]) == 0 and torch.count_nonzero(means[1, 1]) == 0
    copied = means[1, 0, :V]
    assert copied[0] > 0.3 and copied[1] > 0.3 and float(copied[2:].abs().max()) < 1e-3  # half a, half b
    losses, _ = ablated_runs(model, ALTERNATING, [[], [(1, 0)]], means, position=0)
    assert float(losses[0]) + 0.2 < float(losses[1]) < math.log(V) - 0.5  # the mean of a and b says "a or b", never which


def test_patching_the_one_position_that_differs_restores_everything():
    model = previous_token_model()
    clean = [0, 1, 0, 1, 0, 1, 0]  # last position: the previous token is 1
    corrupt = [0, 1, 0, 1, 0, 2, 0]  # ... here 2
    result = patch_differences(model, clean, corrupt, answer=1, wrong=2, per_head=True, batch=1)
    assert result["clean"] > 5 and result["corrupted"] < -5
    restored = (result["patched"] - result["corrupted"]) / (result["clean"] - result["corrupted"])
    expected = np.zeros((2, 7))
    expected[:, 5] = 1.0  # the corrupted token's residual, before either block
    np.testing.assert_allclose(restored, expected, atol=1e-6)
    assert np.all(restored[:, [0, 1, 2, 3, 4, 6]] == 0.0)  # identical residuals: exactly nothing
    heads = (result["heads"] - result["corrupted"]) / (result["clean"] - result["corrupted"])
    np.testing.assert_allclose(heads, [[0, 0], [1, 0]], atol=1e-6)


def test_hooks_are_removed_even_when_the_forward_pass_fails():
    model = previous_token_model()

    def boom(z):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), Hooks() as hooks:
        hooks.residual_stream(model.decoder)
        hooks.edit_heads(model.decoder, 1, boom)
        model(torch.tensor([ALTERNATING]))
    ablated_runs(model, ALTERNATING, [[], [(1, 0)]], torch.zeros(2, 2, 12), position=0)
    patch_differences(model, [0, 1, 0], [0, 2, 0], 1, 2, per_head=True)
    attribution_differences(model, [0, 1, 0], [0, 2, 0], 1, 2, per_head=True)
    lens_logits(model, ALTERNATING)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_parse_heads():
    assert parse_heads("1.0, 0.1", 2, 4) == [(1, 0), (0, 1)]
    assert parse_heads("-1.*", 2, 3) == [(1, 0), (1, 1), (1, 2)]
    for bad, message in [
        ("1", "not LAYER.HEAD"),
        ("x.1", "not LAYER.HEAD"),
        ("2.0", "layer 2 is out of range"),
        ("0.4", "head 4 is out of range"),
        (",", "empty"),
    ]:
        with pytest.raises(Exception, match=message):
            parse_heads(bad, 2, 4)


# ---- against transformers --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, trained_tokenizer):
    """A random GPT-2 built with transformers and imported with tfcli's import: (hf model, our checkpoint)."""
    pytest.importorskip("transformers")
    from tests.test_hf import _hub_style_gpt2
    from tfcli.hf import import_hf

    root = tmp_path_factory.mktemp("gpt2")
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    hf = _hub_style_gpt2(root / "hf", trained_tokenizer, vocab, True)
    import_hf(root / "hf", root / "run")
    return hf, load_checkpoint(root / "run")


IDS = [5, 17, 99, 3, 250, 41, 7, 7, 120, 64, 33, 2, 18, 200]


def test_logit_lens_matches_transformers_hidden_states(gpt2):
    hf, ours = gpt2
    lens = lens_logits(ours.model, IDS)  # (L + 1, T, vocab)
    with torch.no_grad():
        out = hf(torch.tensor([IDS]), output_hidden_states=True)
        L = len(out.hidden_states) - 1
        assert lens.shape[0] == L + 1
        assert (lens[-1] - out.logits[0]).abs().max().item() < 1e-5  # the last layer is the model's own logits
        for layer in range(L):  # transformers' last hidden state already has ln_f applied
            expected = hf.lm_head(hf.transformer.ln_f(out.hidden_states[layer]))[0]
            assert (lens[layer] - expected).abs().max().item() < 1e-5, layer


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3), (2, 1)])
def test_zero_ablation_matches_transformers_with_the_head_zeroed_at_c_proj(gpt2, layer, head):
    hf, ours = gpt2
    hs = hf.config.n_embd // hf.config.n_head
    rows = [[]] + [[(l, h)] for l in range(3) for h in range(4)]
    losses, log_probs = ablated_runs(ours.model, IDS, rows, torch.zeros(3, 4, hs), position=len(IDS) - 1)

    def zero_head(module, args):
        x = args[0].clone()
        x[..., head * hs : (head + 1) * hs] = 0
        return (x,)

    handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([IDS])).logits[0]
    finally:
        handle.remove()
    row = 1 + layer * 4 + head
    assert abs(_loss(logits, IDS) - float(losses[row])) < 1e-5
    assert (torch.log_softmax(logits[-1], -1) - log_probs[row]).abs().max().item() < 1e-5
    with torch.no_grad():
        plain = hf(torch.tensor([IDS])).logits[0]
    assert abs(_loss(plain, IDS) - float(losses[0])) < 1e-5


# ---- the commands -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    root = tmp_path_factory.mktemp("circuit-runs")
    out = {}
    for name, overrides in {"decoder": {}, "encoder": {"arch": "encoder"}, "seq2seq": {"arch": "encoder-decoder"}}.items():
        torch.manual_seed(0)
        config = preset(
            "tiny", vocab_size=tokenizer.vocab_size, **{"block_size": 64, "n_layers": 2, "n_heads": 4, "d_model": 32, "d_ff": 64, "init_std": 0.2, **overrides}
        )
        save_checkpoint(root / name, Transformer(config), tokenizer)
        out[name] = root / name
    return out


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


TEXT = "The fox was happy, so it played with the ball."


def test_inspect_logits_terminal_and_json(cli, runs, tmp_path):
    result = cli("inspect-logits", runs["decoder"], "--text", TEXT)
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "logit lens" in lines[0]
    assert any(line.startswith("embeddings") for line in lines) and any(line.startswith("block 1") for line in lines)
    assert any(line.startswith("next") and "␣fox" in line for line in lines)  # a label: its leading space marked
    assert all(len(line) <= 80 for line in lines)
    result = cli("inspect-logits", runs["decoder"], "--text", TEXT, "--json", "--top-k", "3")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == "tfcli-logit-lens" and doc["layers"] == ["embeddings", "block 0", "block 1"]
    T = len(doc["tokens"])
    assert len(doc["cells"]) == 3 and len(doc["cells"][0]) == T and len(doc["cells"][0][0]["top"]) == 3
    assert doc["targets"][0]["text"] == " fox" and doc["targets"][-1] is None  # JSON: the text, unmarked
    assert "␣" not in result.stdout
    checkpoint = load_checkpoint(runs["decoder"])
    ids = [t["id"] for t in doc["tokens"]]
    logits = lens_logits(checkpoint.model, ids)
    probs = torch.softmax(logits, -1)
    assert doc["cells"][2][0]["top"][0]["id"] == int(probs[2, 0].argmax())
    assert abs(doc["cells"][1][3]["target"]["probability"] - float(probs[1, 3, ids[4]])) < 1e-5
    expected_loss = float(torch.nn.functional.cross_entropy(logits[2, :-1], torch.tensor(ids[1:])))
    assert abs(doc["losses"][2] - expected_loss) < 1e-5
    result = cli("inspect-logits", runs["decoder"], "--text", TEXT, "--top-k", "3", "-o", tmp_path / "lens.json")
    assert result.code == 0 and "wrote" in result.stderr
    assert json.loads((tmp_path / "lens.json").read_text(encoding="utf-8"))["cells"] == doc["cells"]


def test_inspect_logits_on_an_encoder_reads_the_masks(cli, runs):
    result = cli("inspect-logits", runs["encoder"], "--text", "The [MASK] was happy.", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["positions"]) == 1 and doc["tokens"][doc["positions"][0]]["token"] == "<|mask|>"
    assert doc["losses"] == [None, None, None]
    result = cli("inspect-logits", runs["encoder"], "--text", "The fox was happy.")
    assert result.code == 2 and "has no [MASK]" in result.stderr


def test_inspect_ablate_sweep_and_heads(cli, runs):
    result = cli("inspect-ablate", runs["decoder"], "--text", TEXT)
    assert result.code == 0, result.stderr
    assert "change in loss" in result.stdout and "layer 1" in result.stdout and "head 3" in result.stdout
    result = cli("inspect-ablate", runs["decoder"], "--text", TEXT, "--json")
    doc = json.loads(result.stdout)
    assert np.array(doc["loss_change"]).shape == (2, 4) and np.array(doc["kl"]).min() >= 0
    result = cli("inspect-ablate", runs["decoder"], "--text", TEXT, "--heads", "1.2", "--mode", "mean", "--json", "--position", "3")
    assert result.code == 0, result.stderr
    one = json.loads(result.stdout)
    assert one["ablated"]["heads"] == ["1.2"] and one["position"] == 3 and one["mode"] == "mean"
    result = cli("inspect-ablate", runs["decoder"], "--text", TEXT, "--heads", "0.1,1.0")
    assert result.code == 0 and "heads 0.1, 1.0 zeroed" in result.stdout and "before" in result.stdout
    tops = json.loads(cli("inspect-ablate", runs["decoder"], "--text", TEXT, "--heads", "0.1,1.0", "--json").stdout)["top"]
    assert all(label_text(top["text"]) in result.stdout for top in tops)  # predictions named as token labels ("␣the"), JSON unmarked
    assert any(top["text"].startswith(" ") for top in tops) and "␣" in result.stdout


def test_inspect_patch_command(cli, runs):
    result = cli("inspect-patch", runs["decoder"], "--clean", "The fox was happy", "--corrupt", "The ball was happy", "--answer", " it", "--per-head", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    restored = np.array(doc["restored"])
    assert restored.shape == (2, len(doc["clean_tokens"]))
    assert np.allclose(restored[0, 1], 1.0, atol=1e-4)  # the one token that differs, before the first block
    assert np.all(restored[:, 0] == 0.0) and np.array(doc["head_restored"]).shape == (2, 4)
    result = cli("inspect-patch", runs["decoder"], "--clean", "The fox was happy", "--corrupt", "The ball was happy", "--answer", " it")
    assert result.code == 0 and "fraction restored" in result.stdout


def test_inspect_patch_attribution_says_so_and_verifies_the_largest_exactly(cli, runs, tmp_path):
    texts = ("--clean", "The fox was happy", "--corrupt", "The ball was happy", "--answer", " it", "--per-head")
    exact = json.loads(cli("inspect-patch", runs["decoder"], *texts, "--json").stdout)
    result = cli("inspect-patch", runs["decoder"], *texts, "--method", "attribution", "--verify", "3", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert exact["method"] == "exact" and exact["verified"] == [] and doc["method"] == "attribution"
    assert len(doc["verified"]) == 3 and len(doc["head_verified"]) == 3
    for cell in doc["verified"]:  # the re-checked cells hold exact patching's numbers
        assert abs(cell["exact"] - exact["restored"][cell["layer"]][cell["position"]]) < 1e-4
        assert doc["restored"][cell["layer"]][cell["position"]] == cell["exact"]
    for cell in doc["head_verified"]:
        assert abs(cell["exact"] - exact["head_restored"][cell["layer"]][cell["head"]]) < 1e-4
    shown = cli("inspect-patch", runs["decoder"], *texts, "--method", "attribution", "--verify", "1")
    assert shown.code == 0 and "estimated by attribution patching" in shown.stdout and "*" in shown.stdout
    page = tmp_path / "patch.html"
    assert cli("inspect-patch", runs["decoder"], *texts, "--method", "attribution", "-o", page).code == 0
    assert "method: attribution patching" in page.read_text() and "attribution estimate" in page.read_text()


def test_the_png_of_attribution_patching_says_so(cli, runs, tmp_path, monkeypatch):
    from tfcli.inspect import png

    drawn = {}
    monkeypatch.setattr(png, "value_grid_png", lambda title, values, rows, columns, **kw: drawn.update(title=title, texts=kw["texts"]) or b"png")
    args = ("--clean", "The fox was happy", "--corrupt", "The ball was happy", "--answer", " it", "--method", "attribution", "--verify", "1")
    assert cli("inspect-patch", runs["decoder"], *args, "-o", tmp_path / "p.png").code == 0
    assert "estimated by attribution patching (* exact)" in drawn["title"] and sum(t.endswith("*") for row in drawn["texts"] for t in row) == 1


def test_head_as_layer_dot_head_in_the_single_run_view(cli, runs):
    result = cli("inspect-attention", runs["decoder"], "--text", TEXT, "--head", "1.2")
    assert result.code == 0, result.stderr
    assert "layer 1, head 2" in result.stdout


def test_logit_lens_of_an_encoder_decoder_reads_its_decoder(cli, runs):
    result = cli("inspect-logits", runs["seq2seq"], "--text", TEXT, "--target", "The fox played.", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    checkpoint = load_checkpoint(runs["seq2seq"])
    tokenizer = checkpoint.tokenizer
    assert doc["target"] == "The fox played." and doc["tokens"][0]["id"] == tokenizer.special_ids["eos"]  # the start token, then the target
    source, decoder = tokenizer.encode(TEXT), [t["id"] for t in doc["tokens"]]
    assert decoder[1:] == tokenizer.encode("The fox played.") and len(doc["cells"]) == 1 + checkpoint.config.model.decoder_layers
    lens = lens_logits(checkpoint.model, source, decoder)
    with torch.no_grad():
        own = checkpoint.model(torch.tensor([source]), decoder=DecoderInput(torch.tensor([decoder]))).logits[0]
    assert (lens[-1] - own).abs().max().item() < 1e-5  # the last layer's lens is the decoder's own logits
    assert doc["cells"][-1][0]["top"][0]["id"] == int(own[0].argmax())
    result = cli("inspect-logits", runs["seq2seq"], "--text", TEXT, "--target", "The fox played.")
    assert result.code == 0 and "block 1" in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["inspect-patch", "{decoder}", "--clean", "The fox was happy", "--corrupt", "The elephant was very happy", "--answer", " so"],
            "patching needs texts of the same token length",
        ),
        (["inspect-patch", "{decoder}", "--clean", "The fox", "--corrupt", "The ball", "--answer", "happily ever"], "--answer 'happily ever' is"),
        (["inspect-patch", "{decoder}", "--clean", "a", "--corrupt", "b", "--answer", " so", "--verify", "3"], "--verify is for --method attribution"),
        (
            ["inspect-patch", "{decoder}", "--clean", "a", "--corrupt", "b", "--answer", " so", "--method", "attribution", "--verify", "-1"],
            "--verify -1 is negative",
        ),
        (["inspect-patch", "{decoder}", "--clean", "a", "--corrupt", "b", "--answer", " so", "--method", "fast"], "unknown --method 'fast'"),
        (["inspect-ablate", "{decoder}", "--text", TEXT, "--heads", "5.0"], "layer 5 is out of range"),
        (["inspect-ablate", "{decoder}", "--text", TEXT, "--mode", "half"], "unknown --mode"),
        (["inspect-ablate", "{decoder}", "--text", TEXT, "--reference-text", "x"], "--reference-text is for --mode mean"),
        (["inspect-ablate", "{decoder}", "--text", TEXT, "--position", "99"], "--position 99 is out of range"),
        (["inspect-ablate", "{encoder}", "--text", TEXT], "inspect-ablate works on decoder runs; this run is an encoder"),
        (["inspect-patch", "{seq2seq}", "--clean", "a", "--corrupt", "b", "--answer", " so"], "inspect-patch works on decoder runs"),
        (["inspect-logits", "{seq2seq}", "--text", TEXT], "an encoder-decoder's logit lens reads its decoder: it needs the target text"),
        (["inspect-logits", "{decoder}", "--text", TEXT, "--target", "x"], "--target is for encoder-decoder runs; this one is a decoder"),
        (["inspect-ablate", "{seq2seq}", "--text", TEXT], "inspect-ablate works on decoder runs; this run is an encoder-decoder"),
        (["inspect-logits", "{decoder}", "--text", " "], "the text is empty"),
        (["inspect-logits", "{decoder}", "--text", TEXT, "-o", "out.txt"], "writes .json, .html and .png files"),
        (["inspect-logits", "{decoder}", "--text", TEXT, "--format", "png"], "--format png writes a file"),
        (["inspect-logits", "{decoder}", "--text", TEXT, "--format", "html"], "--format html writes a file"),
        (["inspect-logits", "{decoder}", "--text", TEXT, "--format", "svg"], "unknown format 'svg'"),
        (["inspect-ablate", "{decoder}", "--text", TEXT, "--heads", "0.1", "-o", "x.png"], "the png shows every head"),
        (["inspect-logits", "{decoder}", "--text", TEXT, "--start", "500"], "--start 500 is out of range"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(cli, runs, args, message):
    result = cli(*[a.format(**{k: str(v) for k, v in runs.items()}) for a in args])
    assert result.code == 2, (result.stdout, result.stderr)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["inspect-logits", "{decoder}", "--text", TEXT],
        ["inspect-ablate", "{decoder}", "--text", TEXT],
        ["inspect-patch", "{decoder}", "--clean", "The fox was happy", "--corrupt", "The ball was happy", "--answer", " it"],
        [
            "inspect-patch",
            "{decoder}",
            "--clean",
            "The fox was happy",
            "--corrupt",
            "The ball was happy",
            "--answer",
            " it",
            "--method",
            "attribution",
            "--verify",
            "2",
        ],
    ],
)
def test_png_views(cli, runs, tmp_path, args):
    out = tmp_path / "view.png"
    result = cli(*[a.format(**{k: str(v) for k, v in runs.items()}) for a in args], "-o", out)
    assert result.code == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in result.stderr


def test_keep_checkpoints_and_the_scores_across_them(cli, tmp_path, trained_tokenizer):
    import shutil

    from tests.conftest import TINY_TEXT
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus

    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.txt").write_text(TINY_TEXT * 10, encoding="utf-8")
    shutil.copytree(trained_tokenizer, data / "tokenizer")
    encode_corpus(resolve_corpus([data / "corpus.txt"]), TextTokenizer.load(data / "tokenizer"), data / "shards", val_fraction=0.2)
    run = tmp_path / "run"
    result = cli(
        "train",
        "pretrain",
        "--data",
        data / "shards",
        "-o",
        run,
        "--block-size",
        "32",
        "--batch-size",
        "2",
        "--max-steps",
        "5",
        "--keep-checkpoints",
        "2",
        "--eval-every",
        "0",
        "--set",
        "n_layers=2",
        "--set",
        "d_model=32",
        "--set",
        "n_heads=2",
        "--device",
        "cpu",
    )
    assert result.code == 0, result.stderr
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == ["step-0000002", "step-0000004"]
    for name in kept:  # a run directory of its own, weights only
        files = {p.name for p in (run / "checkpoints" / name).iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= files and "trainer" not in files
    assert load_checkpoint(run / "checkpoints" / "step-0000002").config.model.n_layers == 2
    result = cli("inspect-attention", run, "--text", TEXT, "--checkpoints", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [c["step"] for c in doc["checkpoints"]] == [2, 4, 5]
    induction = np.array(doc["checkpoints"][0]["scores"]["induction"])
    assert induction.shape == (2, 2) and np.all((induction >= 0) & (induction <= 1))
    result = cli("inspect-attention", run, "--text", TEXT, "--checkpoints", "--pattern", "previous-token", "--layer", "1")
    assert result.code == 0, result.stderr
    assert (
        "previous-token score" in result.stdout and "step 4" in result.stdout and "1.1" in result.stdout and "0.1" not in result.stdout.splitlines()[1]
    )  # layer 1 only
    result = cli("inspect-attention", tmp_path / "run" / "checkpoints" / "step-0000002", "--text", TEXT, "--checkpoints")
    assert result.code == 2 and "kept no checkpoints" in result.stderr and "--keep-checkpoints" in result.stderr
    result = cli("inspect-attention", run, "--text", TEXT, "--checkpoints", "--pattern", "copying")
    assert result.code == 2 and "unknown --pattern" in result.stderr
    # one head at every kept step: the single-run view's renderers, a capture per checkpoint
    result = cli("inspect-attention", run, "--text", TEXT, "--checkpoints", "--head", "1.0")
    assert result.code == 0, result.stderr
    assert "layer 1, head 0 at 3 checkpoints" in result.stdout and "step 2" in result.stdout and "induct" in result.stdout
    result = cli("inspect-attention", run, "--text", TEXT, "--checkpoints", "--layer", "1", "--head", "0", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == "tfcli-attention" and doc["layers"] == [1] and doc["heads"] == [0]
    assert [c["title"] for c in doc["captures"]] == ["step 2", "step 4", "step 5"] and [c["step"] for c in doc["checkpoints"]] == [2, 4, 5]
    steps = [load_checkpoint(p) for p in (run / "checkpoints" / "step-0000002", run)]
    for capture, checkpoint in zip((doc["captures"][0], doc["captures"][2]), steps):  # each step's own weights
        from tfcli.inspect.capture import capture_attention

        expected = capture_attention(checkpoint, TEXT).weights[1, 0]
        np.testing.assert_allclose(np.array(capture["weights"])[0, 0], expected, atol=1e-6)
    assert doc["captures"][0]["weights"] != doc["captures"][2]["weights"]
    assert 0 <= doc["checkpoints"][1]["scores"]["induction"] <= 1
    for suffix, magic in ((".png", b"\x89PNG"), (".html", b"<!DOCTYPE html>")):
        out = tmp_path / f"steps{suffix}"
        result = cli("inspect-attention", run, "--text", TEXT, "--checkpoints", "-o", out)  # the best induction head
        assert result.code == 0, result.stderr
        assert out.read_bytes().startswith(magic) and "the best induction score" in result.stderr
    page = (tmp_path / "steps.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="[^"]+" data-part="data">(.*?)</script>', page, re.DOTALL).group(1))
    assert [panel["title"] for panel in data["panels"]] == ["step 2", "step 4", "step 5"] and len(data["table"]["rows"]) == 3
    for args, message in (
        (["--head", "1.x"], "--head 1.x: the head must be a number"),
        (["--head", "2.0"], "--head 2.0: layer 2 is out of range"),  # named as written, not --layer 2
        (["--head", "1.9"], "--head 1.9: head 9 is out of range"),
        (["--layer", "-3"], "pick 0 to 1, or -1 to -2 from the end"),
        (["--layer", "1", "--head", "1.0"], "names its layer already"),
        (["--head", "1.0.1"], "is not LAYER.HEAD"),
        (["--layer", "all", "-o", tmp_path / "x.png"], "pick it with --head LAYER.HEAD"),
    ):
        result = cli("inspect-attention", run, "--text", TEXT, "--checkpoints", *args)
        assert result.code == 2 and message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "x.png").exists()


EVIL = "The <script>x</script> <img src=y onerror=z> fox\u202e was"


@pytest.mark.parametrize(
    "args",
    [
        ["inspect-logits", "{decoder}", "--text", EVIL],
        ["inspect-ablate", "{decoder}", "--text", EVIL],
        ["inspect-ablate", "{decoder}", "--text", EVIL, "--heads", "0.1"],
        ["inspect-patch", "{decoder}", "--clean", EVIL, "--corrupt", EVIL.replace("fox", "ball"), "--answer", " it", "--per-head"],
    ],
)
def test_html_pages_are_self_contained_and_inert(cli, runs, tmp_path, args):
    out = tmp_path / "view.html"
    result = cli(*[a.format(**{k: str(v) for k, v in runs.items()}) for a in args], "-o", out)
    assert result.code == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    lowered = page.lower()
    assert "<script" not in lowered and "<img" not in lowered and "http:" not in lowered and "https:" not in lowered  # no code, nothing to fetch
    assert "&lt;script&gt;" in page and "&lt;img" in page  # the text, escaped
    assert "\u202e" not in page  # the bidi override shows escaped, never acts
    assert "default-src 'none'" in page


PAGE_PROBE = """
  const cells = Array.from(document.querySelectorAll("td[style]"));
  const plain = ["rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"];
  const drawn = Array.from(document.querySelectorAll("canvas.map")).map((c) => {
    const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let inked = 0;
    for (let i = 0; i < data.length; i += 4) if (data[i] < 250) inked++;
    return inked;
  });
  return { cells: cells.length, coloured: cells.filter((c) => !plain.includes(getComputedStyle(c).backgroundColor)).length, drawn,
           panels: Array.from(document.querySelectorAll(".panel h2")).map((h) => h.textContent),
           rows: document.querySelectorAll('[data-part="extra"] tr').length, images: document.images.length,
           text: document.body.innerText, pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth };
"""


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory, trained_tokenizer):
    """A run with two kept checkpoints (random weights, two seeds), as `train --keep-checkpoints` leaves one."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    run = tmp_path_factory.mktemp("kept") / "run"
    config = preset("tiny", vocab_size=tokenizer.vocab_size, block_size=64, n_layers=2, n_heads=2, d_model=32, d_ff=64, init_std=0.2)
    for seed, folder in ((0, run / "checkpoints" / "step-0000001"), (1, run / "checkpoints" / "step-0000002")):
        torch.manual_seed(seed)
        save_checkpoint(folder, Transformer(config), tokenizer)
    return run


@needs_chromium
@pytest.mark.parametrize(
    "args",
    [
        ["inspect-logits", "{decoder}", "--text", EVIL],
        ["inspect-ablate", "{decoder}", "--text", EVIL],
        ["inspect-patch", "{decoder}", "--clean", EVIL, "--corrupt", EVIL.replace("fox", "ball"), "--answer", " was", "--per-head"],
        ["inspect-attention", "{kept}", "--text", EVIL, "--checkpoints", "--head", "1.1"],
    ],
    ids=["logits", "ablate", "patch", "checkpoints"],
)
def test_the_pages_in_a_browser(cli, runs, kept_run, tmp_path, args):
    """Each page drawn by Chromium: coloured cells (or heatmaps) on the page, no console message (no error,
    no blocked fetch), the hostile text shown as text, nothing wider than the window."""
    from tests.helpers import browse

    out = tmp_path / "page.html"
    names = {**{k: str(v) for k, v in runs.items()}, "kept": str(kept_run)}
    result = cli(*[a.format(**names) for a in args], "-o", out)
    assert result.code == 0, result.stderr
    console: list[str] = []
    _, seen = browse(out, PAGE_PROBE, console=console)
    assert console == []
    assert seen["images"] == 0 and "<script>x</script>" in seen["text"] and "<img src=y onerror=z>" in seen["text"]
    assert "\u202e" not in seen["text"]  # the override shows as an escape or a badge, never acts
    assert seen["pageWidth"] <= seen["viewport"]
    if args[0] == "inspect-attention":
        assert seen["panels"] == ["step 1", "step 2"] and seen["rows"] == 3  # a header and a row per step
        assert len(seen["drawn"]) == 2 and min(seen["drawn"]) > 100  # both heatmaps drawn
    else:
        assert seen["cells"] > 0 and seen["coloured"] > (0 if args[0] == "inspect-patch" else seen["cells"] // 2)  # patching: 0 is white


@pytest.mark.parametrize("positions,placement", [("learned", "pre"), ("rotary", "pre"), ("learned", "post")])
def test_batched_patching_equals_one_patch_at_a_time(positions, placement):
    """The fast path (rows of a batch run from their first patched position on with the corrupted run's keys
    and values before it, from the patched block on, the last block at the last position only, two rows of
    the vocabulary head) gives what patching one (layer, position), or one head, in a plain run gives."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, block_size=32, n_layers=3, n_heads=4, d_model=32, init_std=0.2, positions=positions, norm_placement=placement)
    model = Transformer(config).eval()
    clean = torch.randint(0, 50, (12,)).tolist()
    corrupt = list(clean)
    corrupt[4] = (corrupt[4] + 1) % 50
    result = patch_differences(model, clean, corrupt, answer=3, wrong=4, batch=3, per_head=True)
    with torch.no_grad(), Hooks() as hooks:
        stream = hooks.residual_stream(model.decoder)
        heads = hooks.head_outputs(model.decoder)
        model(torch.tensor([clean]))

    def plain_difference(module, edit):
        handle = module.register_forward_pre_hook(edit)
        try:
            with torch.no_grad():
                logits = model(torch.tensor([corrupt])).logits[0, -1]
        finally:
            handle.remove()
        return float(logits[3] - logits[4])

    for layer in range(3):
        for position in range(12):

            def patch(module, args, layer=layer, position=position):
                x = args[0].clone()
                x[0, position] = stream[layer][0, position]
                return (x, *args[1:])

            expected = plain_difference(model.decoder.blocks[layer], patch)
            assert abs(expected - result["patched"][layer, position]) < 1e-4, (layer, position)
        for head in range(4):

            def put_head(module, args, layer=layer, head=head):
                z = args[0].clone().view(1, 12, 4, 8)  # (B, T, nh, hs)
                z[:, :, head] = heads[layer][:, :, head]
                return (z.flatten(2), *args[1:])

            expected = plain_difference(model.decoder.blocks[layer].attn.out, put_head)
            assert abs(expected - result["heads"][layer, head]) < 1e-4, (layer, head)
    assert np.all(result["patched"][:, :4] == result["corrupted"])  # before the change: nothing to patch, no run


def linear_model() -> Transformer:
    """A random two-layer model made linear from the residual stream to the logits: every query zero (each
    head attends evenly to the positions so far, whatever the keys), no MLP, and norms whose huge eps makes
    them a fixed scale (their weight undoes it). Attribution patching is then exact."""
    torch.manual_seed(1)
    config = ModelConfig(vocab_size=50, block_size=16, n_layers=2, n_heads=4, d_model=32, norm="rmsnorm", init_std=0.3)
    model = Transformer(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if module.__class__.__name__ == "RMSNorm":
                module.eps = 1e12
                module.weight.fill_(1e6)  # x / sqrt(eps) * 1e6 = x
        for block in model.decoder.blocks:
            block.attn.qkv.weight[:32] = 0.0  # the queries
            block.mlp.proj.weight.zero_()
    return model


def test_attribution_equals_exact_patching_where_the_model_is_linear():
    model = linear_model()
    clean = torch.randint(0, 50, (10,)).tolist()
    corrupt = list(clean)
    corrupt[3] = (corrupt[3] + 1) % 50
    exact = patch_differences(model, clean, corrupt, answer=5, wrong=6, per_head=True)
    estimate = attribution_differences(model, clean, corrupt, answer=5, wrong=6, per_head=True)
    assert estimate["clean"] == exact["clean"] and estimate["corrupted"] == exact["corrupted"]
    assert np.ptp(exact["patched"][:, 3:]) > 0.1 and np.ptp(exact["heads"]) > 0.1  # cells that differ, so the check means something
    np.testing.assert_allclose(estimate["patched"], exact["patched"], atol=1e-4)
    np.testing.assert_allclose(estimate["heads"], exact["heads"], atol=1e-4)
    assert all(p.requires_grad for p in model.parameters()) and not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_attribution_approximates_exact_patching_on_a_random_model():
    """Away from the changed token itself (where a norm of a wholly different embedding is far from linear),
    the first-order estimates follow the exact ones closely on a small random model."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, block_size=32, n_layers=3, n_heads=4, d_model=32, init_std=0.1)).eval()
    clean = torch.randint(0, 50, (12,)).tolist()
    corrupt = list(clean)
    corrupt[4] = (corrupt[4] + 7) % 50
    exact = patch_differences(model, clean, corrupt, answer=3, wrong=4, per_head=True)
    estimate = attribution_differences(model, clean, corrupt, answer=3, wrong=4, per_head=True)
    after = np.s_[1:, 5:]  # the positions after the change, where the change has arrived (layer 1 on)
    assert np.corrcoef(exact["patched"][after].ravel(), estimate["patched"][after].ravel())[0, 1] > 0.95
    assert np.corrcoef(exact["heads"].ravel(), estimate["heads"].ravel())[0, 1] > 0.99
    assert np.all(estimate["patched"][:, :4] == estimate["corrupted"])  # nothing differs before the change: exactly nothing


def test_top_cells():
    assert top_cells(np.array([[0.0, 3.0], [-5.0, 1.0]]), 0.0, 2) == [(1, 0), (0, 1)]
    assert top_cells(np.array([[2.0, 2.0], [2.0, 2.5]]), 2.0, 10) == [(1, 1)]  # cells at the baseline never count
