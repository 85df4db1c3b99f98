"""Every way to cut a vocabulary's pieces in two tokens of the same vocabulary, in time linear in the
vocabulary's characters: the candidates for the merges a SentencePiece-style vocabulary implies
(`tfcli.gguf.vocab`). It never decides a split alone: each one it finds is checked on the strings.

Slicing a piece at each cut and looking both halves up costs the piece's length squared (a 300 KB token:
22 s). Here every token and both halves of every cut are named by a polynomial hash (two primes, random
bases) read off prefix sums computed for a block of characters at once, and looked up among the tokens'
hashes, sorted. Equal strings always hash alike, so no split is missed; a collision can only propose a
split that is not one, which the check on the strings turns down.

Example: tokens ["a", "b", "ab", "abb", "bb"], pieces [2, 3] -> (2, 1, 0, 1), (3, 1, 0, 4), (3, 2, 2, 1)
(piece, cut, left, right): "ab" = "a" + "b"; "abb" = "a" + "bb" = "ab" + "b".
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import numpy as np

PRIMES = (2_147_483_647, 2_147_483_629)  # below 2**31: a product of two residues fits in 64 bits
BLOCK = 1 << 18  # characters hashed at once (a longer token is a block of its own): 2 MiB per array


class _Hasher:
    """Hashes of substrings of blocks of text, equal for equal strings wherever they stand: for a block
    s (code points + 1) with prefix sums F[i] = sum(s[j] * b**j, j < i) mod p, the substring [a, e) is
    (F[e] - F[a]) * b**(K - a) mod p = sum(s[a + k] * b**(K + k)), whatever the block and the offset."""

    def __init__(self, longest: int) -> None:
        self.span = max(BLOCK, longest)  # K: no block is longer
        self.powers = [_powers(2 + secrets.randbelow(p - 3), self.span + 1, p) for p in PRIMES]

    def prefix_sums(self, text: str) -> list[np.ndarray]:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.uint64) + 1
        sums = []
        for p, powers in zip(PRIMES, self.powers):
            sums.append(np.concatenate([np.zeros(1, np.uint64), np.cumsum(codes * powers[: len(codes)] % np.uint64(p)) % np.uint64(p)]))
        return sums

    def keys(self, sums: list[np.ndarray], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """One 62-bit key a substring [start, end) of the block the sums were taken of."""
        key = np.zeros(len(starts), dtype=np.uint64)
        for prime, powers, prefix in zip(PRIMES, self.powers, sums):
            p = np.uint64(prime)
            part = (prefix[ends] + p - prefix[starts]) % p * powers[self.span - starts] % p
            key = (key << np.uint64(31)) | part
        return key


def _powers(base: int, count: int, p: int) -> np.ndarray:
    """base**k mod p for k < count, as uint64: a row of `step` powers times each power of base**step."""
    step = 1 << 10
    low = [1]
    for _ in range(step - 1):
        low.append(low[-1] * base % p)
    high, stride = [1], pow(base, step, p)
    for _ in range(-(-count // step) - 1):
        high.append(high[-1] * stride % p)
    table = np.array(high, dtype=np.uint64)[:, None] * np.array(low, dtype=np.uint64)[None, :] % np.uint64(p)
    return table.reshape(-1)[:count]


def _blocks(tokens: list[str], ids: list[int]) -> Iterator[list[int]]:
    """`ids` in runs of at most BLOCK characters (or one longer token)."""
    run: list[int] = []
    size = 0
    for i in ids:
        if run and size + len(tokens[i]) > BLOCK:
            yield run
            run, size = [], 0
        run.append(i)
        size += len(tokens[i])
    if run:
        yield run


def _bounds(tokens: list[str], ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Where each token of `ids` starts and ends in their concatenation."""
    lengths = np.array([len(tokens[i]) for i in ids], dtype=np.int64)
    ends = np.cumsum(lengths)
    return ends - lengths, ends


def token_splits(tokens: list[str], pieces: list[int]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Arrays (piece, cut, left, right), a block of pieces at a time: token `piece` may be token `left`
    followed by token `right`, its first `cut` characters being `left`'s. Proposals, to check on the
    strings (a hash collision proposes a split that is not one); every real split is among them."""
    if not tokens or not pieces:
        return
    hasher = _Hasher(max(len(t) for t in tokens))
    keys = []
    for block in _blocks(tokens, list(range(len(tokens)))):
        starts, ends = _bounds(tokens, block)
        keys.append(hasher.keys(hasher.prefix_sums("".join(tokens[i] for i in block)), starts, ends))
    every = np.concatenate(keys)
    order = np.argsort(every, kind="stable")
    known = every[order]

    def find(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = np.minimum(np.searchsorted(known, key), len(known) - 1)
        return known[at] == key, order[at]

    for block in _blocks(tokens, pieces):
        starts, ends = _bounds(tokens, block)
        cuts_each = np.maximum(ends - starts - 1, 0)  # a piece of n characters has n - 1 cuts
        which = np.repeat(np.arange(len(block)), cuts_each)
        first_cut = np.repeat(np.cumsum(cuts_each) - cuts_each, cuts_each)
        cut = np.arange(len(which), dtype=np.int64) - first_cut + 1
        at = starts[which] + cut
        sums = hasher.prefix_sums("".join(tokens[i] for i in block))
        left_known, left = find(hasher.keys(sums, starts[which], at))
        which, cut, at, left = which[left_known], cut[left_known], at[left_known], left[left_known]  # the right side where the left is a token
        right_known, right = find(hasher.keys(sums, at, ends[which]))
        yield np.asarray(block, dtype=np.int64)[which[right_known]], cut[right_known], left[right_known], right[right_known]
