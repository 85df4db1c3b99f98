"""One plain run of a text, recorded for patching and attribution patching: its residual stream, its heads'
outputs and the logit difference answer - wrong at the last position."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tfcli.inspect.hooks import Hooks
from tfcli.model.transformer import HIDDEN


def logit_difference(model, hidden: torch.Tensor, answer: int, wrong: int) -> torch.Tensor:
    """answer - wrong from the last stack's output `hidden` (rows, d) at the last position: the vocabulary
    head restricted to those two tokens (the rest of the vocabulary is never read), soft-capped as the model
    caps every logit. Returns (rows,)."""
    head = model.lm_head
    bias = None if head.bias is None else head.bias[[answer, wrong]]
    two = model.soft_cap(F.linear(model.head_input(hidden), head.weight[[answer, wrong]], bias)).float()  # (rows, 2)
    return two[:, 0] - two[:, 1]


def record(model, stack, ids: list[int], answer: int, wrong: int, cache=None) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """One plain run: the residual stream (L + 1 of (T, d)), head outputs (L of (T, nh, hs)) and the logit
    difference; with `cache` (a KVCache), every layer's keys and values too."""
    with Hooks() as hooks:
        stream = hooks.residual_stream(stack)
        heads = hooks.head_outputs(stack)
        hidden = model(torch.tensor([ids], device=model.lm_head.weight.device), head=HIDDEN, cache=cache).hidden
    return [x[0] for x in stream], [z[0] for z in heads], float(logit_difference(model, hidden[:, -1], answer, wrong)[0])
