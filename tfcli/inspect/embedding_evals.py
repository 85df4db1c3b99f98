"""The two evaluations the word2vec and GloVe papers report, on any table of token vectors: analogy accuracy on a
questions-words.txt file (per section and overall, questions with a word the table lacks skipped) and Spearman's
rho between cosines and human scores of word pairs. A malformed line (a score that is not a finite number, a line
past MAX_LINE_BYTES) is one error naming the file and line; the file is read a block at a time."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tfcli.errors import TfcliError
from tfcli.inspect.embeddings import COSMUL_EPSILON, EmbeddingTable, find_word, unit_rows
from tfcli.limits import capped_lines

SCORE_ROWS = 256  # questions scored at a time: the score matrix stays (SCORE_ROWS, vocab), 50 MB for GPT-2's
MAX_LINE_BYTES = 64 << 10  # a line of a word test holds a few words and a number (or a comment): longer is not one


def known_token(table: EmbeddingTable, word: str) -> int | None:
    """The word's one token, or None where it is not one token with a vector (an evaluation skips the question)."""
    try:
        return find_word(table, word, strict=True).id
    except TfcliError:
        return None


@dataclasses.dataclass
class SectionScore:
    name: str
    correct: int = 0
    total: int = 0  # questions asked (all four words known)
    skipped: int = 0  # questions with a word the table lacks

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.total if self.total else None

    def to_json(self) -> dict:
        return {"section": self.name, "correct": self.correct, "total": self.total, "skipped": self.skipped, "accuracy": self.accuracy}


def read_questions(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, section, [a, b, c, d]) of a questions-words.txt file; a malformed line is one error naming it."""
    section = "(no section)"
    for number, line in _lines(path):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith(":"):
            section = text[1:].strip() or section
            continue
        words = text.split()
        if len(words) != 4:
            raise TfcliError(
                f"{path}:{number}: expected four words (a b c d) or ': section', got {text[:80]!r}", hint="the file is in word2vec's questions-words.txt format"
            )
        yield number, section, words


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a word-test file, a block at a time; a line past MAX_LINE_BYTES or not UTF-8 is
    the one line naming it."""
    if not Path(path).is_file():
        raise TfcliError(f"{path} does not exist or is not a file")

    def too_long(number: int) -> TfcliError:
        return TfcliError(
            f"{path}:{number}: the line is longer than {MAX_LINE_BYTES:,} bytes, so the file is not a word test",
            hint="one question or pair a line: a few words and a score",
        )

    try:
        with open(path, "rb") as handle:
            for number, line in capped_lines(handle, MAX_LINE_BYTES, too_long):
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TfcliError(f"{path}:{number}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
                yield number, text.removeprefix("\ufeff") if number == 1 else text
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc.strerror or exc}") from exc


def evaluate_analogies(table: EmbeddingTable, path: Path, method: str = "3cosadd") -> list[SectionScore]:
    """Accuracy per section (a question counts when b - a + c's nearest token, a, b and c left out, is d),
    then the overall score last, named "total"."""
    sections: dict[str, SectionScore] = {}
    asked: list[tuple[str, list[int]]] = []
    for _, section, words in read_questions(path):
        score = sections.setdefault(section, SectionScore(section))
        ids = [known_token(table, word) for word in words]
        if any(i is None for i in ids):
            score.skipped += 1
        else:
            asked.append((section, ids))  # type: ignore[arg-type]
    if not sections:
        raise TfcliError(f"{path} holds no questions", hint="one question a line, a b c d (b - a + c should be d), under ': section' lines")
    for start in range(0, len(asked), SCORE_ROWS):
        chunk = asked[start : start + SCORE_ROWS]
        predicted = _best_answers(table, [ids for _, ids in chunk], method)
        for (section, ids), answer in zip(chunk, predicted):
            sections[section].total += 1
            sections[section].correct += int(answer == ids[3])
    total = SectionScore("total", sum(s.correct for s in sections.values()), sum(s.total for s in sections.values()), sum(s.skipped for s in sections.values()))
    return [*sections.values(), total]


def _best_answers(table: EmbeddingTable, questions: list[list[int]], method: str) -> list[int]:
    """For each question [a, b, c, d], the best token for b - a + c (a, b, c left out), many at once."""
    x = table.vectors
    a, b, c = (np.array([q[i] for q in questions]) for i in range(3))
    if method == "3cosadd":
        scores = unit_rows(x[b] - x[a] + x[c]) @ x.T  # (Q, V)
    else:
        cos = lambda rows: (x[rows] @ x.T + 1) / 2  # noqa: E731  (Q, V)
        scores = cos(b) * cos(c) / (cos(a) + COSMUL_EPSILON)
    scores[:, ~table.candidates] = -np.inf
    rows = np.arange(len(questions))
    for column in (a, b, c):
        scores[rows, column] = -np.inf
    return [int(i) for i in scores.argmax(1)]


@dataclasses.dataclass
class SimilarityScore:
    rho: float | None
    pairs: int
    skipped: int


def read_pairs(path: Path) -> Iterator[tuple[int, str, str, float]]:
    """(line number, word, word, human score) of a word-similarity file (WordSim-353, SimLex-999: two words
    and a number per line, tabs or spaces; # comments)."""
    for number, line in _lines(path):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        fields = text.split()
        try:
            if len(fields) != 3:
                raise ValueError
            score = float(fields[2])
        except ValueError:
            if number == 1 and len(fields) == 3:
                continue  # a header line: Word 1, Word 2, Human (mean)
            raise TfcliError(f"{path}:{number}: expected two words and a score, got {text[:80]!r}", hint="one pair a line: word word score") from None
        if not math.isfinite(score):  # float() takes nan and inf, which rank as numbers and make rho meaningless
            raise TfcliError(f"{path}:{number}: the score {fields[2][:40]!r} is not a finite number", hint="give every pair a human score, e.g. 7.5")
        yield number, fields[0], fields[1], score


def rank_average(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank. Example: [10, 20, 20, 5] -> [2, 3.5, 3.5, 1]"""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rho: Pearson's correlation of the ranks (None where either side is constant)."""
    ra, rb = rank_average(np.asarray(a, dtype=np.float64)), rank_average(np.asarray(b, dtype=np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.sqrt((ra**2).sum() * (rb**2).sum())
    return float((ra * rb).sum() / denominator) if denominator > 0 else None


def evaluate_similarity(table: EmbeddingTable, path: Path) -> SimilarityScore:
    human, model = [], []
    skipped = 0
    for _, first, second, score in read_pairs(path):
        a, b = known_token(table, first), known_token(table, second)
        if a is None or b is None:
            skipped += 1
            continue
        human.append(score)
        model.append(float(table.vectors[a] @ table.vectors[b]))
    if not human and not skipped:
        raise TfcliError(f"{path} holds no word pairs", hint="one pair a line: word word score")
    rho = spearman(np.array(human), np.array(model)) if len(human) >= 2 else None
    return SimilarityScore(rho, len(human), skipped)
