"""Head statistics over captured weights (numpy only, no torch): entropy, attended distance, known
patterns with a score each, and how much a head changed between two runs.

Weights are always `[layer, head, query_pos, key_pos]`, each row a probability distribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

PATTERNS: tuple[str, ...] = ("previous-token", "first-token", "duplicate", "induction")
PATTERN_THRESHOLD = 0.4  # a head "is" a pattern when at least this much of its attention follows it


def row_entropy(weights: np.ndarray) -> np.ndarray:
    """Entropy in bits of each row (the last axis). Example: [[0.5, 0.5, 0], [1, 0, 0]] -> [1.0, 0.0]"""
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(w > 0, w * np.log2(np.where(w > 0, w, 1.0)), 0.0)
    return 0.0 - terms.sum(axis=-1)  # 0.0 - x: no -0.0 for a one-hot row


def mean_entropy(weights: np.ndarray) -> np.ndarray:
    """[L, H, T, S] -> [L, H]: the entropy of each query's distribution in bits, averaged over queries."""
    return row_entropy(weights).mean(axis=-1)


def mean_distance(weights: np.ndarray) -> np.ndarray:
    """[L, H, T, T] -> [L, H]: sum over keys of weight * |query - key|, averaged over queries.

    Example: a previous-token head over 3 tokens (rows [1,0,0], [1,0,0], [0,1,0]) -> (0 + 1 + 1) / 3
    """
    T, S = weights.shape[-2:]
    distance = np.abs(np.arange(T)[:, None] - np.arange(S)[None, :]).astype(np.float64)  # (T, S)
    return (np.asarray(weights, dtype=np.float64) * distance).sum(axis=-1).mean(axis=-1)


def _masked_score(weights: np.ndarray, keys: np.ndarray) -> np.ndarray | None:
    """Mean over the queries that have at least one key in `keys` (T, S bool) of the weight on those keys."""
    rows = keys.any(axis=1)
    if not rows.any():
        return None
    mass = (np.asarray(weights, dtype=np.float64) * keys).sum(axis=-1)  # (..., T)
    return mass[..., rows].mean(axis=-1)


def pattern_scores(weights: np.ndarray, ids: Sequence[int], *, causal: bool = True) -> dict[str, np.ndarray | None]:
    """Self-attention weights [L, H, T, T] over the tokens `ids` -> per pattern a [L, H] score in [0, 1]
    (None where the sequence cannot show the pattern, e.g. duplicate without a repeated token).

    - previous-token: weight on key q-1, averaged over queries 1..T-1;
    - first-token (the "sink"): weight on key 0, averaged over queries 1..T-1;
    - duplicate: weight on the other positions holding the same token as the query;
    - induction: weight on the token right after an earlier occurrence of the query's token (A B ... A -> B),
      the key q+1 excluded (that is the next token, not induction).
    Duplicate and induction average over the queries that have such a key (only earlier keys when `causal`);
    measure them on a repeated random sequence (see `repeated_random_ids`), where every query of the second
    half has one.

    Example: ids [5, 7, 9, 5, 7, 9]; queries 3, 4, 5 attend to keys 1, 2, 3, the others to key 0:
    induction 1.0 (queries 3-5), previous-token 1/5 (only query 1 looks at its predecessor).
    """
    ids_arr = np.asarray(ids)
    T = weights.shape[-1]
    scores: dict[str, np.ndarray | None] = dict.fromkeys(PATTERNS)
    if T >= 2:
        q = np.arange(1, T)
        scores["previous-token"] = np.asarray(weights[..., q, q - 1], dtype=np.float64).mean(axis=-1)
        scores["first-token"] = np.asarray(weights[..., 1:, 0], dtype=np.float64).mean(axis=-1)
    same = ids_arr[:, None] == ids_arr[None, :]  # (T, T): key holds the query's token
    np.fill_diagonal(same, False)
    if causal:
        same &= np.tri(T, dtype=bool)
    scores["duplicate"] = _masked_score(weights, same)
    after = np.zeros((T, T), dtype=bool)  # (q, k): the key follows an occurrence of the query's token
    after[:, 1:] = ids_arr[:, None] == ids_arr[None, :-1]
    np.fill_diagonal(after, False)
    after[np.arange(T - 1), np.arange(1, T)] = False  # key q+1 is the next token, not an induction target
    if causal:
        after &= np.tri(T, dtype=bool)
    scores["induction"] = _masked_score(weights, after)
    return scores


def classify(scores: dict[str, float | None]) -> tuple[str, float]:
    """The best-matching pattern and its score; "none" when no pattern reaches PATTERN_THRESHOLD.

    Example: {"previous-token": 0.9, "first-token": 0.05, "duplicate": None, "induction": 0.1} -> ("previous-token", 0.9)
    """
    known = {name: s for name, s in scores.items() if s is not None and np.isfinite(s)}
    if not known:
        return "none", 0.0
    name = max(known, key=lambda n: known[n])
    return (name if known[name] >= PATTERN_THRESHOLD else "none"), float(known[name])


def repeated_random_ids(vocab: Sequence[int], length: int, seed: int = 0) -> list[int]:
    """`length` distinct-as-possible random ids drawn from `vocab`, then the same ids again (2 * length).
    On this sequence a duplicate head attends from q to q - length, an induction head to q - length + 1."""
    rng = np.random.default_rng(seed)
    pool = np.asarray(list(vocab))
    half = rng.choice(pool, size=length, replace=len(pool) < length).tolist()
    return half + half


@dataclasses.dataclass
class HeadSummary:
    layer: int
    head: int
    entropy: float  # bits, mean over queries
    distance: float | None  # mean |query - key| weighted by attention (None for cross-attention)
    scores: dict[str, float | None]
    pattern: str
    score: float

    def to_json(self) -> dict:
        return {
            "layer": self.layer,
            "head": self.head,
            "entropy_bits": round(self.entropy, 4),
            "mean_distance": None if self.distance is None else round(self.distance, 4),
            "pattern": self.pattern,
            "score": round(self.score, 4),
            "scores": {k: None if v is None else round(v, 4) for k, v in self.scores.items()},
        }


def summarize_heads(
    weights: np.ndarray, ids: Sequence[int] | None, *, causal: bool = True, probe_weights: np.ndarray | None = None, probe_ids: Sequence[int] | None = None
) -> list[HeadSummary]:
    """One HeadSummary per (layer, head) of `weights` [L, H, T, S].

    `ids` None means cross-attention: entropy only. Previous-token and first-token are scored on the text;
    duplicate and induction on the probe (a repeated random sequence) when given, else on the text.
    """
    L, H = weights.shape[:2]
    entropy = mean_entropy(weights)
    self_attention = ids is not None
    distance = mean_distance(weights) if self_attention else None
    per_pattern: dict[str, np.ndarray | None] = dict.fromkeys(PATTERNS)
    if self_attention:
        per_pattern = pattern_scores(weights, ids, causal=causal)
        if probe_weights is not None and probe_ids is not None:
            probe = pattern_scores(probe_weights, probe_ids, causal=causal)
            per_pattern["duplicate"], per_pattern["induction"] = probe["duplicate"], probe["induction"]
    out = []
    for layer in range(L):
        for head in range(H):
            scores = {name: (None if s is None else float(s[layer, head])) for name, s in per_pattern.items()}
            pattern, score = classify(scores)
            out.append(
                HeadSummary(layer, head, float(entropy[layer, head]), None if distance is None else float(distance[layer, head]), scores, pattern, score)
            )
    return out


def jensen_shannon(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence in bits (0 = same, 1 = disjoint) between rows (the last axis).
    Example: [1, 0] vs [0, 1] -> 1.0; [0.5, 0.5] vs [0.5, 0.5] -> 0.0"""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log2(np.where(a > 0, a, 1.0) / np.where(m > 0, m, 1.0)), 0.0).sum(axis=-1)

    return np.clip(0.5 * kl(p) + 0.5 * kl(q), 0.0, 1.0)


@dataclasses.dataclass
class HeadChange:
    layer: int
    head: int
    js: float  # mean Jensen-Shannon divergence over queries, bits
    l1: float  # mean total variation (half the L1 distance) over queries

    def to_json(self) -> dict:
        return {"layer": self.layer, "head": self.head, "js_bits": round(self.js, 6), "total_variation": round(self.l1, 6)}


def head_changes(a: np.ndarray, b: np.ndarray) -> list[HeadChange]:
    """Two captures [L, H, T, S] of the same text and shape -> every head, most changed first."""
    js = jensen_shannon(a, b).mean(axis=-1)  # (L, H)
    tv = 0.5 * np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum(axis=-1).mean(axis=-1)
    changes = [HeadChange(layer, head, float(js[layer, head]), float(tv[layer, head])) for layer in range(a.shape[0]) for head in range(a.shape[1])]
    return sorted(changes, key=lambda c: (-c.js, c.layer, c.head))
