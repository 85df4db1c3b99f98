"""What a run's token vectors say: nearest neighbours by cosine, analogies (3CosAdd, 3CosMul) and a 2-D PCA map,
on any table: a word2vec run's vectors, a transformer's input embeddings or untied unembedding, or contextual
vectors (a token's residual stream at one layer, averaged over its occurrences in a text).

Every answer is a plain numpy computation on the table's rows, made unit length; the evaluations are in
`embedding_evals.py`, the rendering in `embedding_map.py` and the CLI. A word is found as one token of the run's tokenizer; one that is several
tokens says so and uses its longest piece (or is refused with strict=True).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tfcli.errors import TfcliError
from tfcli.inspect.hooks import Hooks, lens_stack
from tfcli.inspect.labels import quoted
from tfcli.loader import load_run
from tfcli.model.transformer import HIDDEN
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.show import token_label, token_text, visible
from tfcli.word2vec.run import is_word2vec_run, load_vectors

TABLES = ("input", "output")
METHODS = ("3cosadd", "3cosmul")
CONTEXT_TOKENS_CAP = 1_000_000  # tokens of --data read for contextual vectors; the rest is left out (said)
COSMUL_EPSILON = 1e-6  # gensim's most_similar_cosmul
SHOWN_PIECES = 16  # a word's tokens a note lists, at most


@dataclasses.dataclass
class EmbeddingTable:
    """Unit-length rows, one per token id; `candidates` marks the tokens an answer may be (not special, seen)."""

    vectors: np.ndarray  # (V, d) float32, each row unit length (a zero row stays zero)
    raw: np.ndarray  # (V, d) the rows as the run holds them
    tokenizer: TextTokenizer
    candidates: np.ndarray  # (V,) bool
    what: str  # "the input embeddings of runs/x", ...
    counts: np.ndarray | None = None  # (V,) how often each token occurs (word2vec's training shards, or --data)
    notes: list[str] = dataclasses.field(default_factory=list)

    def text(self, token_id: int) -> str:
        """The token as JSON gives it, control characters escaped: a word-level token as the word, a subword
        token with the space it stands for (" mom" begins a word, "ly" continues one)."""
        if self.tokenizer.family == "word":
            return visible(self.tokenizer.hf.id_to_token(token_id) or "")
        return token_text(self.tokenizer, token_id)

    def label(self, token_id: int) -> str:
        """The token as tables and maps name it: a word as the word, a subword token's space marked ("␣mom")."""
        if self.tokenizer.family == "word":
            return self.text(token_id)
        return token_label(self.tokenizer, token_id)


@dataclasses.dataclass
class Neighbour:
    id: int
    token: str  # the text JSON gives (" mom")
    score: float
    label: str = dataclasses.field(default="", compare=False)  # as the table shows it ("␣mom")

    def to_json(self) -> dict:
        return {"id": self.id, "token": self.token, "score": round(self.score, 6)}


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row divided by its length (zero rows stay zero). Example: [[3, 4], [0, 0]] -> [[0.6, 0.8], [0, 0]]"""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def make_table(raw: np.ndarray, tokenizer: TextTokenizer, candidates: np.ndarray, what: str, counts=None, notes=None) -> EmbeddingTable:
    candidates = candidates.copy()
    candidates[list(tokenizer.special_ids.values())] = False
    candidates[tokenizer.vocab_size :] = False  # a model's padding rows past the tokenizer's vocabulary
    return EmbeddingTable(unit_rows(raw), np.asarray(raw, dtype=np.float32), tokenizer, candidates, what, counts, notes or [])


# ---- the table of a run ---------------------------------------------------------------------------------


def load_table(run: Path, *, table: str = "input", layer: int | None = None, data: str | None = None, device: str = "cpu") -> EmbeddingTable:
    """The vectors to explore: a word2vec run's, a transformer's input embeddings (`table="output"`: its
    unembedding), or with `layer` the mean residual stream of each token of `data` at that layer."""
    if table not in TABLES:
        raise TfcliError(f"--table must be input or output, not {table!r}")
    if (layer is None) != (data is None):
        raise TfcliError("contextual vectors need --layer and --data together", hint="--layer L --data FILE averages each token's vectors at layer L")
    if is_word2vec_run(run):
        if layer is not None:
            raise TfcliError(f"{run} is a word2vec run: it has no layers", hint="drop --layer and --data")
        vectors = load_vectors(run)
        raw = vectors.input_vectors if table == "input" else vectors.output_vectors
        what = f"the {'word' if table == 'input' else 'context (output)'} vectors of {run}"
        return make_table(raw, vectors.tokenizer, vectors.counts > 0, what, vectors.counts)
    checkpoint = load_run(run, "inspect", device)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    if layer is not None:
        if table != "input":
            raise TfcliError("--table output is the unembedding; contextual vectors come from the residual stream", hint="drop --table")
        return _contextual_table(checkpoint, layer, data or "", run)
    notes = []
    if table == "output":
        if model.config.tie_embeddings:
            notes.append("the model ties its unembedding to its input embeddings: --table output is the same matrix")
        raw = model.lm_head.weight.detach().float().cpu().numpy()
        what = f"the unembedding (output table) of {run}"
    else:
        raw = model.tok_emb.weight.detach().float().cpu().numpy()
        what = f"the input embeddings of {run}"
    return make_table(raw, tokenizer, np.ones(len(raw), dtype=bool), what, notes=notes)


def _contextual_table(checkpoint, layer: int, data: str, run: Path) -> EmbeddingTable:
    """Each token's residual stream at block input `layer` (0: the embeddings; n_layers: the last block's
    output), averaged over its occurrences in `data`, read in windows of the model's context."""
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    stack = lens_stack(model, "inspect-embeddings --layer")
    n_layers = len(stack.blocks)
    if not -n_layers - 1 <= layer <= n_layers:
        raise TfcliError(f"--layer {layer} is outside the residual stream: 0 (the embeddings) to {n_layers} (the last block's output)")
    layer = layer % (n_layers + 1)
    if not data.strip():
        raise TfcliError("--data holds no text", hint="pass a text file whose tokens to average")
    ids = tokenizer.encode(data)
    notes = []
    if len(ids) > CONTEXT_TOKENS_CAP:
        notes.append(f"--data holds {len(ids):,} tokens; the first {CONTEXT_TOKENS_CAP:,} are read")
        ids = ids[:CONTEXT_TOKENS_CAP]
    vocab, width = model.config.vocab_size, model.config.d_model
    sums = np.zeros((vocab, width), dtype=np.float64)
    counts = np.zeros(vocab, dtype=np.int64)
    block = model.config.block_size
    device = next(model.parameters()).device
    with torch.no_grad(), Hooks() as hooks:
        stream = hooks.residual_stream(stack)
        for start in range(0, len(ids), block):
            window = torch.tensor([ids[start : start + block]], device=device)
            stream.clear()
            model(window, head=HIDDEN)
            states = stream[layer][0].float().cpu().numpy()  # (T, d)
            np.add.at(sums, window[0].cpu().numpy(), states)
            np.add.at(counts, window[0].cpu().numpy(), 1)
    means = sums / np.maximum(counts, 1)[:, None]
    what = f"layer {layer}'s residual stream of {run}, averaged over each token's occurrences in --data"
    return make_table(means.astype(np.float32), tokenizer, counts > 0, what, counts, notes)


# ---- words to tokens --------------------------------------------------------------------------------


@dataclasses.dataclass
class Lookup:
    word: str
    id: int
    note: str | None = None  # how a word of several tokens was read


def find_word(table: EmbeddingTable, word: str, *, strict: bool = False) -> Lookup:
    """The token id standing for `word`: its one token (for vocabularies whose words carry their space, the
    form with the space first), else the longest of its tokens that has a vector, said in a note (refused
    with strict)."""
    if not word:
        raise TfcliError("a word is empty", hint="pass a word")
    tokenizer = table.tokenizer
    forms = ([" " + word] if tokenizer.words_carry_their_space else []) + [word]
    pieces: list[int] = []
    for form in forms:
        ids = tokenizer.encode(form)
        if len(ids) == 1:
            return _checked(table, word, ids[0])
        if not pieces or (ids and len(ids) < len(pieces)):
            pieces = ids
    if not pieces:
        raise TfcliError(f"{quoted(word)} has no tokens", hint="pass a word")
    shown = " ".join(repr(table.text(i)) for i in pieces[:SHOWN_PIECES]) + (" …" if len(pieces) > SHOWN_PIECES else "")
    if strict:
        raise TfcliError(f"{quoted(word)} is not one token: it tokenizes as {shown}", hint="pick a word that is one token, or drop --strict")
    distinct = list(dict.fromkeys(pieces))  # in order: a long word repeats its tokens
    usable = [i for i in distinct if table.candidates[i]] or distinct  # a piece with a vector, where one has one
    longest = max(usable, key=lambda i: len(table.text(i).strip()))
    lookup = _checked(table, word, longest)
    lookup.note = f"{quoted(word)} is {len(pieces):,} tokens ({shown}); using {table.text(longest)!r}"
    return lookup


def _checked(table: EmbeddingTable, word: str, token_id: int) -> Lookup:
    unk = table.tokenizer.special_ids.get("unk")
    if token_id == unk or token_id in table.tokenizer.special_ids.values():
        raise TfcliError(f"{quoted(word)} is not in the vocabulary", hint="pick a word the tokenizer knows")
    if not table.candidates[token_id]:
        where = "in --data" if "residual" in table.what else "in the training data"
        raise TfcliError(f"{quoted(word)} never occurs {where}, so it has no vector to compare", hint="pick a word that occurs")
    return Lookup(word, token_id)


# ---- neighbours and analogies -----------------------------------------------------------------------


def _top(table: EmbeddingTable, scores: np.ndarray, exclude: Sequence[int], k: int) -> list[Neighbour]:
    scores = np.where(table.candidates, scores, -np.inf)
    scores[list(exclude)] = -np.inf
    k = min(k, int(np.isfinite(scores).sum()))
    best = np.argpartition(-scores, k - 1)[:k] if k else np.zeros(0, dtype=np.int64)
    best = best[np.argsort(-scores[best], kind="stable")]
    return [Neighbour(int(i), table.text(int(i)), float(scores[i]), table.label(int(i))) for i in best]


def neighbours(table: EmbeddingTable, token_id: int, k: int = 10) -> list[Neighbour]:
    """The k tokens nearest `token_id` by cosine similarity, itself left out."""
    return _top(table, table.vectors @ table.vectors[token_id], [token_id], k)


@dataclasses.dataclass
class Analogy:
    positive: list[Lookup]
    negative: list[Lookup]
    text: str = ""  # as the user wrote it


def parse_analogy(expression: str) -> tuple[list[str], list[str]]:
    """The words added and subtracted. Example: "paris - france + italy" -> (["paris", "italy"], ["france"])"""
    tokens = re.findall(r"[+-]|[^\s+-]+(?:-[^\s+-]+)*", expression)
    if not tokens:
        raise TfcliError("--analogy is empty", hint='write it as "paris - france + italy"')
    positive: list[str] = []
    negative: list[str] = []
    sign = "+"
    expect_word = True
    for position, token in enumerate(tokens):
        if token in "+-":
            if expect_word:
                where = "at the start" if position == 0 else f"after {quoted(tokens[position - 1])}"
                if position == 0 and token == "-":
                    raise TfcliError(f"--analogy {quoted(expression)}: it starts with '-'", hint='start with a word: "paris - france + italy"')
                raise TfcliError(f"--analogy {quoted(expression)}: expected a word {where}, found {quoted(token)}", hint='write it as "paris - france + italy"')
            sign, expect_word = token, True
        else:
            if not expect_word:
                raise TfcliError(
                    f"--analogy {quoted(expression)}: expected + or - between {quoted(tokens[position - 1])} and {quoted(token)}",
                    hint='write it as "paris - france + italy"',
                )
            (positive if sign == "+" else negative).append(token)
            expect_word = False
    if expect_word:
        raise TfcliError(f"--analogy {quoted(expression)} ends with {quoted(tokens[-1])}", hint='write it as "paris - france + italy"')
    if len(positive) + len(negative) < 2 or not negative:
        raise TfcliError(f"--analogy {quoted(expression)} needs a word taken away and one added", hint='write it as "paris - france + italy"')
    return positive, negative


def solve_analogy(table: EmbeddingTable, analogy: Analogy, k: int = 10, method: str = "3cosadd") -> list[Neighbour]:
    """The tokens that best complete the analogy, the query words left out (as the papers score it).
    3cosadd: cos(x, sum of the positives - sum of the negatives), the unit rows summed (Mikolov et al.);
    3cosmul: prod cos'(x, p) / (prod cos'(x, n) + 1e-6), cos' = (cos + 1) / 2 (Levy and Goldberg; gensim's)."""
    if method not in METHODS:
        raise TfcliError(f"--method must be 3cosadd or 3cosmul, not {method!r}")
    x = table.vectors
    positive = [lookup.id for lookup in analogy.positive]
    negative = [lookup.id for lookup in analogy.negative]
    if method == "3cosadd":
        target = unit_rows((x[positive].sum(0) - x[negative].sum(0))[None, :])[0]
        scores = x @ target
    else:
        shifted_pos = (x @ x[positive].T + 1) / 2  # (V, P)
        shifted_neg = (x @ x[negative].T + 1) / 2  # (V, N)
        scores = shifted_pos.prod(1) / (shifted_neg.prod(1) + COSMUL_EPSILON)
    return _top(table, scores, positive + negative, k)


# ---- the map ----------------------------------------------------------------------------------------


def pca_2d(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows projected on their first two principal components (centred, SVD), and the share of the
    variance each explains. Returns ((n, 2), (2,))."""
    centred = vectors - vectors.mean(0, keepdims=True)
    _, singular, components = np.linalg.svd(centred.astype(np.float64), full_matrices=False)
    coordinates = centred @ components[:2].T
    if coordinates.shape[1] < 2:  # one dimension: the second axis is flat
        coordinates = np.pad(coordinates, ((0, 0), (0, 2 - coordinates.shape[1])))
    variance = singular**2
    share = variance[:2] / variance.sum() if variance.sum() > 0 else np.zeros(2)
    return coordinates.astype(np.float64), np.pad(share, (0, 2 - len(share)))


def most_frequent(table: EmbeddingTable, n: int) -> tuple[list[int], str | None]:
    """The n most frequent candidate tokens (by the table's counts), else the first n by id, said in a note."""
    ids = np.flatnonzero(table.candidates)
    if table.counts is not None:
        order = ids[np.argsort(-table.counts[ids], kind="stable")]
        return [int(i) for i in order[:n]], None
    return [int(i) for i in ids[:n]], "the run keeps no token counts: --top takes the first tokens by id (pass --layer and --data to count a text's)"
