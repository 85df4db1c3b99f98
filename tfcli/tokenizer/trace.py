"""Byte-pair merges replayed step by step on a small text, in pure Python, as a lecture does on a blackboard.

Conventions (the blackboard's, documented in `tfcli tokenize trace --help`):
- every whitespace character (and a literal `_`) is shown as `_` and stays attached to the end of the
  word before it; a pair whose first token ends in `_` is never merged, so tokens never span words;
- a pair's count is how many times merging it would replace it, left to right ("aaa" holds one "aa");
- the pair with the highest count is merged; a tie goes to the pair made of older tokens: single
  characters rank in code-point order, every merged token ranks after all tokens before it, and the pair
  with the lowest (rank of first, rank of second) wins.

- merging runs until no pair is left, or until `max_merges`, or until the best count drops below
  `min_count` (2 stops where every pair is unique, as the Wikipedia example does).

Example: "aaabdaaabac" merges aa, then ab, then aa+ab; with min_count=2 it stops there, as 5 tokens:
aaab d aaab a c.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

WHITESPACE_SYMBOL = "_"


@dataclasses.dataclass(frozen=True)
class MergeStep:
    number: int
    left: str
    right: str
    count: int
    table: list[tuple[str, int]]  # every token and its count after this merge, most frequent first

    @property
    def token(self) -> str:
        return self.left + self.right


@dataclasses.dataclass(frozen=True)
class BpeTrace:
    text: str
    initial_table: list[tuple[str, int]]
    steps: list[MergeStep]
    tokens: list[str]  # the text as tokens after the last merge

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "initial": [{"token": t, "count": c} for t, c in self.initial_table],
            "merges": [
                {"merge": s.number, "pair": [s.left, s.right], "token": s.token, "count": s.count,
                 "table": [{"token": t, "count": c} for t, c in s.table]}
                for s in self.steps
            ],
            "tokens": self.tokens,
        }


def blackboard_text(text: str) -> str:
    """Show whitespace the blackboard way; a `_` already there stays one. Example: "to sea\\n" -> "to_sea_"."""
    return "".join(WHITESPACE_SYMBOL if ch.isspace() else ch for ch in text)


def pair_counts(tokens: list[str]) -> Counter[tuple[str, str]]:
    """Mergeable pairs and how many left-to-right merges each would make.

    Example: ["a", "a", "a", "b", "_", "c"] -> {("a", "a"): 1, ("a", "b"): 1}
    (("b", "_") is counted too; ("_", "c") is not, since "_" ends a word.)
    """
    counts: Counter[tuple[str, str]] = Counter()
    last_at: dict[tuple[str, str], int] = {}
    for i in range(len(tokens) - 1):
        if tokens[i].endswith(WHITESPACE_SYMBOL):
            continue
        pair = (tokens[i], tokens[i + 1])
        if last_at.get(pair) == i - 1:  # overlaps the occurrence just counted ("aaa")
            continue
        counts[pair] += 1
        last_at[pair] = i
    return counts


def merge_pair(tokens: list[str], pair: tuple[str, str]) -> list[str]:
    """Replace every occurrence of `pair`, left to right. Example: (["a","a","a"], ("a","a")) -> ["aa","a"]."""
    merged, i = [], 0
    while i < len(tokens):
        if i + 1 < len(tokens) and (tokens[i], tokens[i + 1]) == pair:
            merged.append(tokens[i] + tokens[i + 1])
            i += 2
        else:
            merged.append(tokens[i])
            i += 1
    return merged


def _table(tokens: list[str], rank: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(Counter(tokens).items(), key=lambda item: (-item[1], rank[item[0]]))


def bpe_trace(text: str, max_merges: int | None = None, min_count: int = 1) -> BpeTrace:
    """Learn merges on `text` until no pair is left (or `max_merges` is reached, or the best pair occurs
    fewer than `min_count` times), recording each step."""
    board = blackboard_text(text)
    tokens = list(board)
    rank = {ch: i for i, ch in enumerate(sorted(set(tokens)))}
    initial = _table(tokens, rank)
    steps: list[MergeStep] = []
    while max_merges is None or len(steps) < max_merges:
        counts = pair_counts(tokens)
        if not counts:
            break
        (left, right), count = min(counts.items(), key=lambda item: (-item[1], rank[item[0][0]], rank[item[0][1]]))
        if count < min_count:
            break
        tokens = merge_pair(tokens, (left, right))
        rank.setdefault(left + right, len(rank))
        steps.append(MergeStep(len(steps) + 1, left, right, count, _table(tokens, rank)))
    return BpeTrace(text=board, initial_table=initial, steps=steps, tokens=tokens)
