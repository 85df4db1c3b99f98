"""The corpus statistics word2vec draws from: each token's count in the shards, the subsampling thresholds and
the cumulative noise table, computed as gensim computes them (`prepare_weights`, `make_cum_table`)."""

from __future__ import annotations

import numpy as np

COUNT_BLOCK = 1 << 24  # tokens counted at a time: memory stays bounded on shards of any size
NOISE_DOMAIN = 2**31 - 1  # gensim's cum_table domain


def count_tokens(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """How often each id occurs in `ids` (a memory-mapped shard), block by block.
    Example: count_tokens(np.array([1, 1, 3]), 4) -> [0, 2, 0, 1]"""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(ids), COUNT_BLOCK):
        counts += np.bincount(np.asarray(ids[start : start + COUNT_BLOCK], dtype=np.int64), minlength=vocab_size)[:vocab_size]
    return counts


def keep_thresholds(counts: np.ndarray, subsample: float) -> np.ndarray:
    """gensim's sample_int: a word is kept when its threshold >= a random 32-bit number, i.e. with probability
    min(1, (sqrt(c / t) + 1) * t / c), t = subsample * the words counted (word2vec.c's formula).
    Example: counts [0, 1000, 1], subsample 1e-3 -> word 1 kept with p ~ 0.032, word 2 always."""
    if subsample <= 0:
        return np.full(len(counts), 2**32 - 1, dtype=np.uint32)
    threshold = subsample * counts.sum()
    c = np.maximum(counts.astype(np.float64), 1.0)
    probability = np.minimum((np.sqrt(c / threshold) + 1.0) * threshold / c, 1.0)
    return np.round(probability * (2**32 - 1)).astype(np.uint32)


def noise_table(counts: np.ndarray, exponent: float) -> np.ndarray:
    """The cumulative distribution of counts ** exponent over NOISE_DOMAIN (gensim's cum_table); tokens never
    seen take no share. Example: counts [1, 0, 1], exponent 1 -> [1073741824, 1073741824, 2147483647]"""
    weights = np.where(counts > 0, counts.astype(np.float64) ** exponent, 0.0)
    total = weights.sum()
    cumulative = np.round(np.cumsum(weights) / total * NOISE_DOMAIN) if total > 0 else np.zeros(len(counts))
    return cumulative.astype(np.uint32)


def initial_vectors(vocab_size: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """gensim's start: input vectors uniform in [-0.5/dim, 0.5/dim), output vectors zero."""
    rng = np.random.default_rng(seed)
    input_vectors = ((rng.random((vocab_size, dim), dtype=np.float32) - 0.5) / dim).astype(np.float32)
    return input_vectors, np.zeros((vocab_size, dim), dtype=np.float32)
