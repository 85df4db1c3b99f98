"""Attribution patching (`tfcli inspect-patch --method attribution`): Nanda's linear approximation of
activation patching. One run of the clean text, one of the corrupted text and one backward pass of the
corrupted run's logit difference answer - wrong give every (layer, position) at once:

    patched(layer, position) ~ corrupted + (clean - corrupted residual) . d(difference)/d(residual)

and, per head, the same with the head's output at every position. Exact where the model is linear between
the patch and the logits, an estimate elsewhere; `top_cells` picks the estimates worth re-checking by
activation patching (`--verify N`). Read with scoped hooks on the one model's own forward and backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tfcli.inspect.hooks import Hooks, lens_stack
from tfcli.inspect.recording import logit_difference, record
from tfcli.model.transformer import HIDDEN


@contextlib.contextmanager
def _parameters_frozen(model) -> Iterator[None]:
    """No parameter asks for a gradient inside: the backward pass computes the activations' only."""
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def attribution_differences(model, clean_ids: list[int], corrupt_ids: list[int], answer: int, wrong: int, *, per_head: bool = False) -> dict[str, Any]:
    """What `patching.patch_differences` returns (`clean`, `corrupted`, `patched` (L, T), `heads` (L, nh)
    with per_head), each patched difference estimated to first order from the corrupted run's gradient."""
    stack = lens_stack(model, "inspect-patch", ("decoder",))
    with torch.inference_mode():
        clean_stream, clean_heads, clean_diff = record(model, stack, clean_ids, answer, wrong)
    L = len(stack.blocks)
    with _parameters_frozen(model), torch.enable_grad(), Hooks() as hooks:
        hooks.edit(stack.blocks[0].hook_resid_pre, lambda x: x.detach().requires_grad_())  # the graph starts here
        stream = hooks.residual_stream(stack)
        head_outputs = hooks.head_outputs(stack)  # each attention's heads (1, T, nh, hs)
        hidden = model(torch.tensor([corrupt_ids], device=model.lm_head.weight.device), head=HIDDEN).hidden
        difference = logit_difference(model, hidden[:, -1], answer, wrong)[0]
        wanted = stream[:L] + (head_outputs if per_head else [])
        gradients = torch.autograd.grad(difference, wanted, allow_unused=True, materialize_grads=True)  # unused: zeros
    with torch.no_grad():
        corrupt_diff = float(difference)
        patched = np.stack([_first_order(clean_stream[l], stream[l][0], gradients[l][0]).sum(-1) for l in range(L)]) + corrupt_diff  # (L, T)
        heads = None
        if per_head:
            pairs = [(z[0], g[0]) for z, g in zip(head_outputs, gradients[L:])]  # (T, nh, hs) each
            heads = np.stack([_first_order(clean_heads[l], z, g).sum((0, 2)) for l, (z, g) in enumerate(pairs)]) + corrupt_diff  # (L, nh)
    return {"clean": clean_diff, "corrupted": corrupt_diff, "patched": patched, "heads": heads}


def _first_order(clean, corrupt, gradient) -> np.ndarray:
    """(clean - corrupt) * gradient, element by element, in float64 (summed by the caller)."""
    return ((clean.double() - corrupt.detach().double()) * gradient.double()).cpu().numpy()


def top_cells(estimates: np.ndarray, baseline: float, n: int) -> list[tuple[int, int]]:
    """The n cells of `estimates` (rows, columns) furthest from `baseline`, furthest first; cells that equal
    it exactly (nothing to patch) never count.

    Example: top_cells(np.array([[0.0, 3.0], [-5.0, 1.0]]), 0.0, 2) -> [(1, 0), (0, 1)]
    """
    distance = np.abs(estimates - baseline).ravel()
    order = [int(i) for i in np.argsort(-distance, kind="stable")[:n] if distance[i] > 0]
    return [divmod(i, estimates.shape[1]) for i in order]
