"""The shared scorer (tfcli.generate.scoring) against a direct full forward + log_softmax of each request."""

from __future__ import annotations

import random

import pytest
import torch

from tfcli.errors import TfcliError
from tfcli.generate.scoring import score_continuations
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer

SHAPES = {
    "gpt2": dict(positions="learned", norm="layernorm", activation="gelu_tanh"),
    "llama": dict(positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=1, tie_embeddings=False),
}
WINDOW = 16


def tiny(shape: str) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, block_size=WINDOW, n_layers=2, n_heads=2, d_model=32, d_ff=64, init_std=0.3, **SHAPES[shape])
    return Transformer(config).eval()


def reference(model: Transformer, context: list[int], continuation: list[int]) -> tuple[list[float], bool]:
    """One request alone: the last window + 1 tokens, one forward, log_softmax at the continuation's positions."""
    kept = (context + continuation)[-(WINDOW + 1) :]
    with torch.no_grad():
        logits = model(torch.tensor([kept[:-1]])).logits[0]  # (T, vocab)
    rows = torch.log_softmax(logits.float(), dim=-1)[-len(continuation) :]
    targets = torch.tensor(continuation)
    return rows.gather(1, targets[:, None]).squeeze(1).tolist(), bool((rows.argmax(-1) == targets).all())


def requests() -> list[tuple[list[int], list[int]]]:
    rng = random.Random(0)
    out = []
    for _ in range(6):  # multiple-choice questions: one context, four choices of 1 to 4 tokens
        context = [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
        out += [(context, [rng.randrange(50) for _ in range(rng.randrange(1, 5))]) for _ in range(4)]
    out.append(([3] * 40, [5, 6, 7]))  # a context longer than the window, cut from the left
    out.append(([1], [rng.randrange(50) for _ in range(WINDOW)]))  # a continuation that fills the window
    out.append(([2, 3], [4]))
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_scores_equal_a_full_forward(shape, batch_size):
    model = tiny(shape)
    reqs = requests()
    scores = score_continuations(model, reqs, batch_size=batch_size)
    assert len(scores) == len(reqs)
    for (context, continuation), score in zip(reqs, scores):
        expected, greedy = reference(model, context, continuation)
        assert len(score.token_logprobs) == len(continuation)
        torch.testing.assert_close(torch.tensor(score.token_logprobs), torch.tensor(expected), atol=1e-5, rtol=0)
        assert score.logprob == pytest.approx(sum(expected), abs=1e-5)
        assert score.greedy == greedy
        assert score.top_logprobs is None


def test_greedy_continuations_are_recognised():
    model = tiny("gpt2")
    context = [4, 9, 1]
    with torch.no_grad():
        best = int(model(torch.tensor([context])).logits[0, -1].argmax())
        second = int(model(torch.tensor([context + [best]])).logits[0, -1].argmax())
    scores = score_continuations(model, [(context, [best, second]), (context, [best, (second + 1) % 50])])
    assert scores[0].greedy and not scores[1].greedy


def test_top_logprobs():
    model = tiny("llama")
    context, continuation = [7, 8, 9], [10, 11]
    (score,) = score_continuations(model, [(context, continuation)], top_k=3)
    with torch.no_grad():
        rows = torch.log_softmax(model(torch.tensor([context + continuation[:-1]])).logits[0, -2:], dim=-1)
    for top, row in zip(score.top_logprobs, rows):
        values, ids = row.topk(3)
        assert list(top) == ids.tolist()
        torch.testing.assert_close(torch.tensor(list(top.values())), values, atol=1e-5, rtol=0)


def test_edge_cases():
    model = tiny("gpt2")
    (empty,) = score_continuations(model, [([1, 2], [])])
    assert empty.logprob == 0.0 and empty.greedy and empty.token_logprobs == []
    with pytest.raises(ValueError):
        score_continuations(model, [([], [1])])
    with pytest.raises(TfcliError, match="longer than the model's window"):
        score_continuations(model, [([1], [2] * (WINDOW + 1))])
    encoder = Transformer(ModelConfig(arch="encoder", vocab_size=50, block_size=WINDOW, n_layers=1, n_heads=2, d_model=16))
    with pytest.raises(TfcliError, match="only a decoder"):
        score_continuations(encoder, [([1], [2])])


def test_shared_context_runs_once():
    """Four choices of one question: the context's forward runs once, with one row, not four."""
    model = tiny("gpt2")
    widths = []
    handle = model.decoder.blocks[0].register_forward_pre_hook(lambda _m, args: widths.append(tuple(args[0].shape[:2])))
    try:
        score_continuations(model, [([1, 2, 3, 4, 5], [c]) for c in (6, 7, 8, 9)])
    finally:
        handle.remove()
    assert widths == [(1, 5)]
