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
    rng = random.Random(1)
    # (prompt, new tokens): prompt + new tokens fit in the context; a long prompt joining late shifts the others
    wanted = [([rng.randrange(50) for _ in range(p)], n) for p, n in [(3, 12), (9, 6), (2, 20), (15, 8), (1, 5), (20, 3), (4, 19), (6, 6)]]
    waiting = list(range(len(wanted)))
    rows: list[int] = []  # which sequence each row holds
    got: dict[int, list[int]] = {i: [] for i in range(len(wanted))}
    pending: dict[int, int] = {}
    while waiting or rows:
        joining = []
        while waiting and batch.free > len(joining) and (not rows or rng.random() < 0.5):  # join at a random step, one or several at once
            joining.append(waiting.pop(0))
        if joining:
            cache, logits = batch.prefill([wanted[s][0] for s in joining])
            for k, s in enumerate(joining):
                assert batch.join(wanted[s][0], cache, k) == len(rows)
                rows.append(s)
                got[s].append(int(logits[k].argmax()))
                pending[s] = got[s][-1]
        for s in [s for s in rows if len(got[s]) == wanted[s][1]]:  # done: leave (the last row moves up)
            at = rows.index(s)
            moved = batch.leave(at)
            if moved is not None:
                rows[at] = rows[moved]
            rows.pop()
        if not rows:
            continue
        for r, s in enumerate(rows):
            assert batch.tokens(r) == wanted[s][0] + got[s][:-1]
        logits = batch.step(torch.tensor([pending[s] for s in rows]))
        for r, s in enumerate(rows):
            got[s].append(int(logits[r].argmax()))
            pending[s] = got[s][-1]
    assert called["_shift_right"] and called["_drop_empty_columns"], called  # both ways the window moves were taken
    for s, (prompt, n) in enumerate(wanted):
        assert got[s] == alone(model, prompt, n), s
