"""The continuous batch (tfcli.serve.slots): sequences that join and leave at any step, with prompts longer
and shorter than the window, decode exactly as each decodes alone, for learned and rotary positions."""

from __future__ import annotations

import random

import pytest
import torch

from tfcli.generate.window import Vocabulary
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.serve.slots import SlotBatch

VOCAB = Vocabulary(limit=50, eos_id=None, pad_id=0, suppressed=[])


def alone(model: Transformer, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens by full forward passes (no cache), one sequence."""
    ids = list(prompt)
    for _ in range(steps):
        logits = model(torch.tensor([ids])).logits[0, -1, : VOCAB.limit]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


SEQUENCES = [(3, 12), (9, 6), (2, 20), (15, 8), (1, 5), (20, 3), (4, 19), (6, 6)]  # (prompt, new tokens): each fits a 24-token context


def decode_joining_and_leaving(batches: list[SlotBatch], tolerance: float | None = None) -> tuple[list[tuple[list[int], int]], dict[int, list[int]]]:
    """Sequences join (at a random step, one or several at once; a long prompt joining late shifts the others)
    and leave (the last row moves up) until all are done, greedy on the first batch's logits; every other
    batch is driven the same way and its logits held to the first's within `tolerance`. Returns the
    sequences (prompt, new tokens) and the tokens each got."""
    first = batches[0]
    rng = random.Random(1)
    wanted = [([rng.randrange(50) for _ in range(p)], n) for p, n in SEQUENCES]
    waiting = list(range(len(wanted)))
    rows: list[int] = []  # which sequence each row holds
    got: dict[int, list[int]] = {i: [] for i in range(len(wanted))}
    pending: dict[int, int] = {}
    while waiting or rows:
        joining = []
        while waiting and first.free > len(joining) and (not rows or rng.random() < 0.5):
            joining.append(waiting.pop(0))
        if joining:
            for batch in batches:
                cache, logits = batch.prefill([wanted[s][0] for s in joining])
                for k, s in enumerate(joining):
                    assert batch.join(wanted[s][0], cache, k) == len(rows) + k
                if batch is first:
                    chosen = [int(logits[k].argmax()) for k in range(len(joining))]
            for k, s in enumerate(joining):
                rows.append(s)
                got[s].append(chosen[k])
                pending[s] = chosen[k]
        for s in [s for s in rows if len(got[s]) == wanted[s][1]]:  # done: leave (the last row moves up)
            at = rows.index(s)
            moved = {batch.leave(at) for batch in batches}
            assert len(moved) == 1
            moved = moved.pop()
            if moved is not None:
                rows[at] = rows[moved]
            rows.pop()
        if not rows:
            continue
        for r, s in enumerate(rows):
            assert first.tokens(r) == wanted[s][0] + got[s][:-1]
        tokens = torch.tensor([pending[s] for s in rows])
        logits = [batch.step(tokens) for batch in batches]
        for other in logits[1:]:
            torch.testing.assert_close(other, logits[0], rtol=0, atol=tolerance)
            assert torch.equal(other.argmax(dim=-1), logits[0].argmax(dim=-1))  # the same greedy tokens
        for r, s in enumerate(rows):
            got[s].append(int(logits[0][r].argmax()))
            pending[s] = got[s][-1]
    return wanted, got


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@torch.inference_mode()
def test_sequences_joining_and_leaving_decode_as_they_would_alone(positions):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, block_size=24, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_ff=64, positions=positions)
    model = Transformer(config).eval()
    batch = SlotBatch(model, 3, VOCAB)
    called = {"_shift_right": 0, "_drop_empty_columns": 0}
    for name in called:
        method = getattr(batch, name)
        setattr(batch, name, lambda *a, name=name, method=method: (called.__setitem__(name, called[name] + 1), method(*a))[1])
    wanted, got = decode_joining_and_leaving([batch])
    assert called["_shift_right"] and called["_drop_empty_columns"], called  # both ways the window moves were taken
    for s, (prompt, n) in enumerate(wanted):
        assert got[s] == alone(model, prompt, n), s
