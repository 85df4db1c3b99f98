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
        context, continuation = tuple(map(int, context)), tuple(map(int, continuation))
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
                    _score(model, batch, top_k, results)
                    batch, rows = [], 0
                batch.append(group)
                rows += len(group.members)
            if batch:
                _score(model, batch, top_k, results)
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


def _log_probs(model: Transformer, hidden: torch.Tensor) -> torch.Tensor:
    """Log-probabilities over the vocabulary (N, vocab) in float32 from hidden states (N, d)."""
    return torch.log_softmax(model.unembed(hidden).float(), dim=-1)


def _score(model: Transformer, groups: list[_Group], top_k: int, results: list) -> None:
    """Score a batch: a lone continuation with its context in one forward; several continuations of one
    context after a forward over the context, from its cache."""
    if all(len(g.members) == 1 for g in groups):
        _score_rows(model, groups, top_k, results)
    else:
        _score_shared(model, groups, top_k, results)


def _score_rows(model: Transformer, groups: list[_Group], top_k: int, results: list) -> None:
    """One row per request, context + continuation (but its last token), right-padded, in one forward."""
    device = next(model.parameters()).device
    members = [(g.context, *g.members[0]) for g in groups]
    rows = [context + continuation[:-1] for context, _, continuation in members]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, device=device)
    lengths = torch.tensor([len(r) for r in rows], device=device)  # (B,)
    starts = torch.tensor([len(context) - 1 for context, _, _ in members], device=device)  # (B,) the position that predicts each first token
    steps = torch.arange(width, device=device)[None, :]  # (1, width)
    real = steps < lengths[:, None]  # (B, width)
    hidden = model.decode(ids)  # (B, width, d); causal: a real token never sees the right padding after it
    table = _log_probs(model, hidden[real & (steps >= starts[:, None])])  # (sum of lengths, vocab), row by row
    spans, offset = [], 0
    for _, _, continuation in members:
        spans.append(list(range(offset, offset + len(continuation))))
        offset += len(continuation)
    _record(table, [t for _, _, c in members for t in c], [(index, span) for (_, index, _), span in zip(members, spans)], top_k, results)


def _score_shared(model: Transformer, groups: list[_Group], top_k: int, results: list) -> None:
    """Groups' contexts in one forward, then every continuation in a second one from the contexts' cache,
    copied to one row per continuation (skipped when every continuation is a single token)."""
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
    hidden = model.decode(context_ids, cache=cache)  # (G, C, d); causal: right padding is never seen (it is masked below)
    last = _log_probs(model, hidden[torch.arange(G, device=device), context_lengths - 1])  # (G, vocab): predicts each first token
    owner = torch.tensor([gi for gi, _, _ in members], device=device)  # (N,) the group each row continues
    # every scored position in one table: row r's first token (predicted by its context's last position),
    # then the rest of every row's tokens in order (predicted by the continuation's own positions)
    scored = [last[owner]]  # (N, vocab)
    targets = [cont[0] for _, _, cont in members]
    if T > 0:
        cache.keys, cache.values = cache.keys.index_select(1, owner), cache.values.index_select(1, owner)  # (L, N, nkv, C + T, hs)
        lengths = torch.tensor([len(cont) - 1 for _, _, cont in members], device=device)  # (N,)
        ids = torch.zeros(N, T, dtype=torch.long, device=device)
        for row, (_, _, cont) in enumerate(members):
            if len(cont) > 1:
                ids[row, : len(cont) - 1] = torch.tensor(cont[:-1], device=device)
                targets.extend(cont[1:])
        steps = torch.arange(T, device=device)[None, :]  # (1, T)
        real = steps < lengths[:, None]  # (N, T)
        positions = (context_lengths[owner][:, None] + steps).masked_fill(~real, 0)  # (N, T) each row after its own context; padding at 0
        padding = torch.cat([context_real[owner], real], dim=1)  # (N, C + T)
        hidden = model.decode(ids, padding, cache=cache, positions=positions)  # (N, T, d)
        scored.append(_log_probs(model, hidden[real]))  # (sum of lengths - N, vocab), row by row
    table = torch.cat(scored)  # (sum of lengths, vocab)
    spans, offset = [], N  # row r's first token is table row r; its others follow the first N rows, row by row
    for row, (_, index, cont) in enumerate(members):
        spans.append((index, [row, *range(offset, offset + len(cont) - 1)]))
        offset += len(cont) - 1
    _record(table, targets, spans, top_k, results)


def _record(table: torch.Tensor, targets: list[int], spans: list[tuple[int, list[int]]], top_k: int, results: list) -> None:
    """Each request's score from the log-probability table (one row per scored position): `targets[i]` is
    the token table row i should predict; `spans` gives each request's rows in its continuation's order."""
    target_ids = torch.tensor(targets, device=table.device)
    logprobs = table.gather(1, target_ids[:, None]).squeeze(1).tolist()
    greedy = (table.argmax(dim=-1) == target_ids).tolist()
    top_ids = top_values = None
    if top_k:
        values, indices = table.topk(min(top_k, table.shape[-1]), dim=-1)  # (rows, k)
        top_ids, top_values = indices.tolist(), values.tolist()
    for index, where in spans:
        values = [logprobs[i] for i in where]
        top = [dict(zip(top_ids[i], top_values[i])) for i in where] if top_ids is not None else None
        results[index] = ContinuationScore(float(sum(values)), all(greedy[i] for i in where), values, top)
