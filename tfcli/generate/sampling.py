"""Turning next-token logits into a choice: repetition penalty, temperature, top-k, top-p (nucleus) and
min-p filters, then argmax or a seeded draw. Pure functions over (B, vocab) tensors, kept apart from the
decoding loop so each is tested on hand-made logits. A filtered-out token gets -inf, never a tiny weight.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty: a token already in the text has its logit divided by `penalty` when positive and
    multiplied by it when negative, so it becomes less likely either way. seen: (B, vocab) bool.

    Example: logits [2.0, -1.0, 3.0], seen [T, T, F], penalty 2 -> [1.0, -2.0, 3.0]
    """
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row; the rest become -inf (k <= 0 or k >= vocab: unchanged).

    Example: [1.0, 3.0, 2.0, 0.0], k=2 -> [-inf, 3.0, 2.0, -inf]
    """
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    values, indices = torch.topk(logits, k, dim=-1)
    return torch.full_like(logits, NEG_INF).scatter(-1, indices, values)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the most likely tokens, in order, until their probability reaches p (the token
    that crosses p is kept; the most likely token always is).

    Example: probabilities [0.5, 0.3, 0.15, 0.05], p=0.7 -> the first two are kept (0.5 < 0.7 <= 0.8)
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # probability of the tokens ranked above each one
    drop_sorted = before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the most likely token's.

    Example: probabilities [0.6, 0.3, 0.1], min_p=0.25 -> threshold 0.15, the last is dropped
    """
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p
    return logits.masked_fill(probs < threshold, NEG_INF)


def filtered_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """Temperature first, then top-k, top-p and min-p, in that order (as transformers applies them)."""
    if temperature != 1.0:
        logits = logits / temperature
    logits = top_k_filter(logits, top_k)
    logits = top_p_filter(logits, top_p)
    return min_p_filter(logits, min_p)


def sample_from(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from softmax(logits) (B, vocab) -> (B,) ids."""
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def choose_next(
    logits: torch.Tensor,
    *,
    greedy: bool,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The next token of each row: argmax when greedy (or at temperature 0), else a filtered draw."""
    if greedy or temperature == 0:
        return logits.argmax(dim=-1)
    return sample_from(filtered_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p), generator)
