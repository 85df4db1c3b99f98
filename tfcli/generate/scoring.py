"""The one scorer: the log-likelihood of continuations given contexts, for `tfcli eval --tasks`, the lm-eval
model class and serve's `echo` + `logprobs`. Token ids in, numbers out; it never tokenizes or prints.

Requests that share a context (a multiple-choice question's choices) share one forward over it: the
contexts of a batch run once, right-padded, into a KV cache; the cache is copied to one row per choice and
the continuations run after it, each row at its own positions. A single-token continuation needs no second
forward at all. A context longer than the model's window is cut from the left, as lm-eval's `hf` model
does: the last window + 1 tokens of context + continuation are kept, and the continuation scored inside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from tfcli.errors import TfcliError
from tfcli.model.attention import KVCache
from tfcli.model.transformer import Transformer

DEFAULT_BATCH_SIZE = 16


@dataclasses.dataclass(frozen=True)
class ContinuationScore:
    logprob: float  # the log-probability of the whole continuation: the sum of token_logprobs
    greedy: bool  # every continuation token is the model's most likely next token
    token_logprobs: list[float]  # one per continuation token
    top_logprobs: list[dict[int, float]] | None = None  # with top_k > 0: the top_k ids -> log-probs at each continuation position


@dataclasses.dataclass
class _Group:
    """Requests that read the same (cut) context: one forward over it, then one row per continuation."""

    context: tuple[int, ...]
    members: list[tuple[int, tuple[int, ...]]]  # (request index, continuation)

    @property
    def length(self) -> int:
        return len(self.context) + max(len(c) for _, c in self.members) - 1


def score_continuations(
    model: Transformer, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *, batch_size: int = DEFAULT_BATCH_SIZE, top_k: int = 0
) -> list[ContinuationScore]:
    """The log-likelihood of each (context ids, continuation ids) under a decoder `model`, in the order given.
    A context needs at least one token (start it with the BOS or EOS token); an empty continuation scores 0.
    `batch_size` bounds the rows (continuations) of one forward; at most `top_k` alternatives per position.

    Example: [([464, 3290], [318]), ([464, 3290], [373, 257])] -> two scores, one forward over [464, 3290]."""
    config = model.config
    if config.arch != "decoder":
        raise TfcliError(f"only a decoder scores continuations; this run is an {config.arch}", hint="score a decoder (language model) run")
    if batch_size < 1 or top_k < 0:
        raise ValueError("batch_size must be at least 1 and top_k at least 0")
    window = config.block_size
    results: list[ContinuationScore | None] = [None] * len(requests)
    groups: dict[tuple[int, ...], _Group] = {}
    for index, (context, continuation) in enumerate(requests):
        context, continuation = tuple(int(t) for t in context), tuple(int(t) for t in continuation)
        if not context:
            raise ValueError("a context needs at least one token: start it with the BOS or EOS token")
        if not continuation:
            results[index] = ContinuationScore(0.0, True, [], [] if top_k else None)
            continue
        if len(continuation) > window:
            raise TfcliError(
                f"a continuation of {len(continuation):,} tokens is longer than the model's window ({window:,})", hint="score a shorter continuation"
            )
        kept = (context + continuation)[-(window + 1) :]  # cut from the left, as lm-eval's hf model does
        cut = kept[: len(kept) - len(continuation)]
        groups.setdefault(cut, _Group(cut, [])).members.append((index, continuation))
    chunks = [dataclasses.replace(g, members=g.members[i : i + batch_size]) for g in groups.values() for i in range(0, len(g.members), batch_size)]
    chunks.sort(key=lambda g: -g.length)  # longest first: the first batch shows at once whether memory suffices
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            batch: list[_Group] = []
            rows = 0
            for group in chunks:
                if batch and rows + len(group.members) > batch_size:
                    _score_batch(model, batch, top_k, results)
                    batch, rows = [], 0
                batch.append(group)
                rows += len(group.members)
            if batch:
                _score_batch(model, batch, top_k, results)
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


def _log_probs(model: Transformer, hidden: torch.Tensor) -> torch.Tensor:
    """Log-probabilities over the vocabulary (N, vocab) in float32 from hidden states (N, d)."""
    return torch.log_softmax(model.lm_head(model._head_input(hidden)).float(), dim=-1)


def _score_batch(model: Transformer, groups: list[_Group], top_k: int, results: list) -> None:
    """Score a batch of groups: their contexts in one forward, then every continuation in a second one
    (skipped when every continuation is a single token)."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    G = len(groups)
    context_lengths = torch.tensor([len(g.context) for g in groups], device=device)  # (G,)
    C = int(context_lengths.max())
    members = [(gi, index, cont) for gi, g in enumerate(groups) for index, cont in g.members]
    N = len(members)
    T = max(len(cont) for _, _, cont in members) - 1  # continuation tokens that are inputs
    context_ids = torch.zeros(G, C, dtype=torch.long, device=device)
    for gi, g in enumerate(groups):
        context_ids[gi, : len(g.context)] = torch.tensor(g.context, device=device)
    context_real = torch.arange(C, device=device)[None, :] < context_lengths[:, None]  # (G, C) right padding
    # the cache holds the longest context then the longest continuation: up to twice the window, while each
    # row's own positions (its context, then its continuation) stay inside it
    cache = KVCache(model.config, G, C + T, dtype, device)
    hidden = model.decode(context_ids, context_real if not bool(context_real.all()) else None, cache=cache)  # (G, C, d)
    last = _log_probs(model, hidden[torch.arange(G, device=device), context_lengths - 1])  # (G, vocab): predicts each first token
    owner = torch.tensor([gi for gi, _, _ in members], device=device)  # (N,) the group each row continues
    first = last[owner]  # (N, vocab)
    rest = None
    if T > 0:
        cache.keys, cache.values = cache.keys.index_select(1, owner), cache.values.index_select(1, owner)  # (L, N, nkv, C + T, hs)
        lengths = torch.tensor([len(cont) - 1 for _, _, cont in members], device=device)  # (N,)
        ids = torch.zeros(N, T, dtype=torch.long, device=device)
        for row, (_, _, cont) in enumerate(members):
            if len(cont) > 1:
                ids[row, : len(cont) - 1] = torch.tensor(cont[:-1], device=device)
        steps = torch.arange(T, device=device)[None, :]  # (1, T)
        real = steps < lengths[:, None]  # (N, T)
        positions = (context_lengths[owner][:, None] + steps).masked_fill(~real, 0)  # (N, T) each row after its own context; padding at 0
        padding = torch.cat([context_real[owner], real], dim=1)  # (N, C + T)
        hidden = model.decode(ids, padding, cache=cache, positions=positions)  # (N, T, d)
        rest = _log_probs(model, hidden[real])  # (sum of lengths, vocab), row by row
    offset = 0
    for row, (_, index, cont) in enumerate(members):
        n_rest = len(cont) - 1
        rows = first[row : row + 1] if n_rest == 0 else torch.cat([first[row : row + 1], rest[offset : offset + n_rest]])  # (len(cont), vocab)
        offset += n_rest
        targets = torch.tensor(cont, device=device)
        token_logprobs = rows.gather(1, targets[:, None]).squeeze(1)  # (len(cont),)
        greedy = bool((rows.argmax(dim=-1) == targets).all())
        top = None
        if top_k:
            values, ids_k = rows.topk(min(top_k, rows.shape[-1]), dim=-1)
            top = [dict(zip(i.tolist(), v.tolist())) for i, v in zip(ids_k, values)]
        values = token_logprobs.tolist()
        results[index] = ContinuationScore(float(sum(values)), greedy, values, top)
