"""Byte-pair and WordPiece merges replayed step by step on a small text, in pure Python, as a lecture does
on a blackboard.

Conventions for BPE (the blackboard's, documented in `tfcli tokenize trace --help`):
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

WordPiece (`wordpiece_trace`) differs in three ways:
- words are cut at whitespace (and `_`) with each punctuation character and CJK ideograph a word of its own, as BERT's
  pre-tokenizer does, and a character that continues a word is written `##c`; so pairs never span words;
- the pair merged is the one with the highest score count(ab) / (count(a) * count(b)), not the highest
  count: a pair of tokens that are rare apart but often together wins; `a + ##b` makes `ab`, `##a + ##b`
  makes `##ab`; ties, `max_merges` and `min_count` (a pair occurring fewer times is never merged) work as
  for BPE, a code point's plain form ranking before its `##` form;
- the text is also encoded as WordPiece encodes, longest vocabulary match first, which may cut a word
  differently from the merges that built the vocabulary.

Example: on "hug hug hug pug pun bun hugs" WordPiece first merges ##g + ##s (count 1, score 1/(5*1)), where
BPE merges u + g (count 5, score 5/(7*5)).
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections import Counter
from fractions import Fraction

WHITESPACE_SYMBOL = "_"
CONTINUATION = "##"


@dataclasses.dataclass(frozen=True)
class MergeStep:
    number: int
    left: str
    right: str
    count: int
    table: list[tuple[str, int]]  # every token and its count after this merge, most frequent first
    # WordPiece: the counts of the two tokens before the merge, and the score count / (left_count * right_count)
    left_count: int | None = None
    right_count: int | None = None
    score: Fraction | None = None
    prefix: str = ""  # WordPiece's "##": dropped from the right token when it joins the left

    @property
    def token(self) -> str:
        return join_tokens(self.left, self.right, self.prefix)

    def to_json(self) -> dict:
        data = {"merge": self.number, "pair": [self.left, self.right], "token": self.token, "count": self.count}
        if self.score is not None:
            data.update(
                {
                    "left_count": self.left_count,
                    "right_count": self.right_count,
                    "score": float(self.score),
                    "score_fraction": f"{self.score.numerator}/{self.score.denominator}",
                }
            )
        data["table"] = [{"token": t, "count": c} for t, c in self.table]
        return data


@dataclasses.dataclass(frozen=True)
class MergeTrace:
    text: str  # BPE: the blackboard text; WordPiece: the words, one space apart
    initial_table: list[tuple[str, int]]
    steps: list[MergeStep]
    tokens: list[str]  # the text as tokens after the last merge
    model: str = "bpe"
    encoded: list[str] | None = None  # WordPiece: the text encoded with the final vocabulary, longest match first

    def to_json(self) -> dict:
        data = {
            "model": self.model,
            "text": self.text,
            "initial": [{"token": t, "count": c} for t, c in self.initial_table],
            "merges": [s.to_json() for s in self.steps],
            "tokens": self.tokens,
        }
        if self.encoded is not None:
            data["encoded"] = self.encoded
        return data


BpeTrace = MergeTrace  # the name before WordPiece joined


def join_tokens(left: str, right: str, prefix: str = "") -> str:
    """The token a merge makes; WordPiece's `##` (the prefix) is kept only in front.

    Example: ("h", "##u", "##") -> "hu"; ("##g", "##s", "##") -> "##gs"; ("a", "##", "") -> "a##"
    """
    return left + (right.removeprefix(prefix) if prefix else right)


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


def merge_pair(tokens: list[str], pair: tuple[str, str], prefix: str = "") -> list[str]:
    """Replace every occurrence of `pair`, left to right (`prefix`: see `join_tokens`).

    Example: (["a","a","a"], ("a","a")) -> ["aa","a"]
    """
    merged, i = [], 0
    while i < len(tokens):
        if i + 1 < len(tokens) and (tokens[i], tokens[i + 1]) == pair:
            merged.append(join_tokens(tokens[i], tokens[i + 1], prefix))
            i += 2
        else:
            merged.append(tokens[i])
            i += 1
    return merged


def _table(tokens: list[str], rank: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(Counter(tokens).items(), key=lambda item: (-item[1], rank[item[0]]))


def bpe_trace(text: str, max_merges: int | None = None, min_count: int = 1) -> MergeTrace:
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
    return MergeTrace(text=board, initial_table=initial, steps=steps, tokens=tokens)


# CJK ideographs, which BERT's normalizer spaces apart, each a word of its own (BertNormalizer's ranges)
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def _stands_alone(ch: str) -> bool:
    """A character BERT makes a word of its own: ASCII punctuation and symbols, Unicode punctuation (P*),
    CJK ideographs. Accents, other symbols (emoji) and letters stay in their word."""
    code = ord(ch)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126 or unicodedata.category(ch).startswith("P"):
        return True
    return any(low <= code <= high for low, high in _CJK_RANGES)


def wordpiece_words(text: str) -> list[str]:
    """Words as BERT cuts them (its normalizer, then its pre-tokenizer): at whitespace and `_` (the blackboard's
    space), each punctuation character and CJK ideograph a word of its own, control and format characters dropped.

    Example: "the cat's_hat." -> ["the", "cat", "'", "s", "hat", "."]; "東京 café" -> ["東", "京", "café"]
    """
    words: list[str] = []
    word = ""
    for ch in text.replace(WHITESPACE_SYMBOL, " "):
        if ch == "\ufffd" or (unicodedata.category(ch) in ("Cc", "Cf") and not ch.isspace()):
            continue  # BERT's normalizer drops control and format characters (a zero-width joiner too)
        if ch.isspace() or _stands_alone(ch):
            if word:
                words.append(word)
            word = ""
            if not ch.isspace():
                words.append(ch)
        else:
            word += ch
    if word:
        words.append(word)
    return words


def wordpiece_split(word: str) -> list[str]:
    """A word as characters, each after the first marked as continuing it. Example: "hug" -> ["h", "##u", "##g"]."""
    return [word[0]] + [CONTINUATION + ch for ch in word[1:]]


def longest_match_first(word: str, vocabulary: set[str]) -> list[str] | None:
    """WordPiece's encoding of one word: the longest vocabulary entry from the start, then the longest
    `##` entry from there, and so on; None when some point has no entry (the word becomes [UNK]).

    Example: ("hugs", {"h", "hu", "hug", "##s", "##g", "##gs"}) -> ["hug", "##s"]
    """
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else CONTINUATION + word[start:end]
            if piece in vocabulary:
                pieces.append(piece)
                start = end
                break
        else:
            return None
    return pieces


def wordpiece_trace(text: str, max_merges: int | None = None, min_count: int = 1) -> MergeTrace:
    """Learn WordPiece merges on `text` (see the module docstring), recording each step with its score."""
    words = wordpiece_words(text)
    frequency = Counter(words)
    splits = {word: wordpiece_split(word) for word in frequency}

    def token_counts() -> Counter[str]:
        counts: Counter[str] = Counter()
        for word, n in frequency.items():
            for token in splits[word]:
                counts[token] += n
        return counts

    def table(counts: Counter[str]) -> list[tuple[str, int]]:
        return sorted(counts.items(), key=lambda item: (-item[1], rank[item[0]]))

    initial_tokens = {token for split in splits.values() for token in split}
    rank = {token: i for i, token in enumerate(sorted(initial_tokens, key=lambda t: (t.removeprefix(CONTINUATION), t.startswith(CONTINUATION))))}
    counts = token_counts()
    initial = table(counts)
    steps: list[MergeStep] = []
    while max_merges is None or len(steps) < max_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, n in frequency.items():
            for pair, c in pair_counts(splits[word]).items():
                pairs[pair] += c * n
        candidates = [(pair, c, Fraction(c, counts[pair[0]] * counts[pair[1]])) for pair, c in pairs.items() if c >= min_count]
        if not candidates:
            break
        (left, right), count, score = min(candidates, key=lambda item: (-item[2], rank[item[0][0]], rank[item[0][1]]))
        left_count, right_count = counts[left], counts[right]
        for word in splits:
            splits[word] = merge_pair(splits[word], (left, right), CONTINUATION)
        rank.setdefault(join_tokens(left, right, CONTINUATION), len(rank))
        counts = token_counts()
        steps.append(MergeStep(len(steps) + 1, left, right, count, table(counts), left_count, right_count, score, CONTINUATION))
    vocabulary = set(rank)
    encoded = [piece for word in words for piece in (longest_match_first(word, vocabulary) or ["[UNK]"])]
    tokens = [token for word in words for token in splits[word]]
    return MergeTrace(text=" ".join(words), initial_table=initial, steps=steps, tokens=tokens, model="wordpiece", encoded=encoded)
