"""What `tfcli inspect-embeddings` does, as a plain function: load the table, find the words, and answer each
question asked (neighbours, an analogy, a map, the two evaluations) into one report the CLI renders as
tables or JSON. Every user mistake is a TfcliError before any file is written."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from tfcli.errors import TfcliError
from tfcli.inspect.embedding_evals import SectionScore, SimilarityScore, evaluate_analogies, evaluate_similarity
from tfcli.inspect.embedding_map import map_html, map_png
from tfcli.inspect.embeddings import (
    METHODS,
    Analogy,
    EmbeddingTable,
    Neighbour,
    find_word,
    load_table,
    most_frequent,
    neighbours,
    parse_analogy,
    pca_2d,
    solve_analogy,
)
from tfcli.inspect.session import check_output, write_output
from tfcli.jsontext import dumps_json

WORD_TESTS = Path(__file__).with_name("word_tests")
SHIPPED = {"stories": ("stories-analogies.txt", "stories-similarity.txt")}  # --eval-analogies stories: the shipped files
MAP_SUFFIXES = (".png", ".html", ".json")
MAX_MAP_POINTS = 2000


@dataclasses.dataclass
class EmbeddingRequest:
    run: Path
    words: list[str] = dataclasses.field(default_factory=list)  # for --neighbours or --map
    neighbours: bool = False
    k: int = 10
    analogy: str | None = None
    method: str = "3cosadd"
    map: bool = False
    top: int | None = None
    output: Path | None = None  # the map's file: .png, .html or .json
    eval_analogies: str | None = None
    eval_similarity: str | None = None
    table: str = "input"
    layer: int | None = None
    data: str | None = None  # contextual vectors: the text
    strict: bool = False
    device: str = "cpu"


@dataclasses.dataclass
class EmbeddingMap:
    labels: list[str]  # as the map names each point ("␣mom")
    ids: list[int]
    points: np.ndarray  # (n, 2)
    share: np.ndarray  # (2,) of the variance
    texts: list[str]  # as JSON gives each token (" mom")
    written: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "method": "pca",
            "explained_variance": [round(float(s), 6) for s in self.share],
            "points": [{"id": i, "token": t, "x": round(float(x), 6), "y": round(float(y), 6)} for i, t, (x, y) in zip(self.ids, self.texts, self.points)],
            "file": str(self.written) if self.written else None,
        }


@dataclasses.dataclass
class EmbeddingReport:
    what: str
    notes: list[str]
    neighbours: dict[str, list[Neighbour]] | None = None
    analogy: tuple[str, list[Neighbour]] | None = None
    map: EmbeddingMap | None = None
    analogies: list[SectionScore] | None = None
    similarity: SimilarityScore | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"table": self.what, "notes": self.notes}
        if self.neighbours is not None:
            data["neighbours"] = {word: [n.to_json() for n in found] for word, found in self.neighbours.items()}
        if self.analogy is not None:
            data["analogy"] = {"query": self.analogy[0], "answers": [n.to_json() for n in self.analogy[1]]}
        if self.map is not None:
            data["map"] = self.map.to_json()
        if self.analogies is not None:
            data["analogy_accuracy"] = [s.to_json() for s in self.analogies]
        if self.similarity is not None:
            data["similarity"] = dataclasses.asdict(self.similarity)
        return data


def shipped_file(value: str, which: int) -> Path:
    """A file path, or the name of the files shipped with tfcli (`stories`)."""
    path = Path(value)
    if not path.exists() and value in SHIPPED:
        return WORD_TESTS / SHIPPED[value][which]
    return path


def _check_request(request: EmbeddingRequest) -> None:
    asked = [request.neighbours, request.analogy is not None, request.map, request.eval_analogies is not None, request.eval_similarity is not None]
    if not any(asked):
        raise TfcliError("nothing to look at", hint="pass --neighbours WORD..., --analogy, --map, --eval-analogies or --eval-similarity")
    if request.neighbours and request.map:
        raise TfcliError("--neighbours and --map both take the words; ask one of them at a time")
    if request.words and not (request.neighbours or request.map):
        raise TfcliError(f"the words {' '.join(request.words)!r} go with --neighbours or --map", hint="put --neighbours or --map before them")
    if request.neighbours and not request.words:
        raise TfcliError("--neighbours needs at least one word", hint="tfcli inspect-embeddings RUN --neighbours bird cat")
    if request.k < 1:
        raise TfcliError(f"-k must be at least 1, not {request.k}")
    if request.method not in METHODS:
        raise TfcliError(f"--method must be 3cosadd or 3cosmul, not {request.method!r}")
    if request.top is not None and not request.map:
        raise TfcliError("--top goes with --map", hint="tfcli inspect-embeddings RUN --map --top 50")
    if request.map:
        if request.top is not None and request.words:
            raise TfcliError("--map takes words or --top N, not both")
        count = request.top if request.top is not None else len(request.words)
        if count < 2:
            raise TfcliError(f"--map needs at least two tokens, not {count}: a map of one point shows nothing", hint="pass more words, or --top N")
        if count > MAX_MAP_POINTS:
            raise TfcliError(f"--map of {count:,} tokens is more than a picture can show ({MAX_MAP_POINTS:,})")
    if request.output is not None:
        if not request.map:
            raise TfcliError("-o writes the map", hint="pass --map, or drop -o and use --json for the rest")
        if request.output.suffix.lower() not in MAP_SUFFIXES:
            raise TfcliError(f"cannot tell the map's format from {request.output}", hint="end it in .png, .html or .json")

        check_output(request.output)
    if request.analogy is not None:
        parse_analogy(request.analogy)  # a syntax error before the run is loaded
    for value, which in ((request.eval_analogies, 0), (request.eval_similarity, 1)):
        if value is not None and not shipped_file(value, which).is_file():
            raise TfcliError(f"{value} does not exist or is not a file", hint="pass a questions file, or `stories` for the files shipped with tfcli")


def explore(request: EmbeddingRequest) -> EmbeddingReport:
    _check_request(request)
    table = load_table(request.run, table=request.table, layer=request.layer, data=request.data, device=request.device)
    report = EmbeddingReport(table.what, list(table.notes))
    if request.neighbours:
        report.neighbours = {}
        for word in request.words:
            lookup = find_word(table, word, strict=request.strict)
            if lookup.note:
                report.notes.append(lookup.note)
            report.neighbours[word] = neighbours(table, lookup.id, request.k)
    if request.analogy is not None:
        positive, negative = parse_analogy(request.analogy)
        lookups = [[find_word(table, w, strict=request.strict) for w in words] for words in (positive, negative)]
        report.notes += [lookup.note for group in lookups for lookup in group if lookup.note]
        analogy = Analogy(*lookups, text=" ".join(request.analogy.split()))
        report.analogy = (analogy.text, solve_analogy(table, analogy, request.k, request.method))
    if request.map:
        report.map = _map(table, request, report.notes)
    if request.eval_analogies is not None:
        report.analogies = evaluate_analogies(table, shipped_file(request.eval_analogies, 0), request.method)
    if request.eval_similarity is not None:
        report.similarity = evaluate_similarity(table, shipped_file(request.eval_similarity, 1))
    return report


def _map(table: EmbeddingTable, request: EmbeddingRequest, notes: list[str]) -> EmbeddingMap:
    if request.top is not None:
        ids, note = most_frequent(table, request.top)
        if note:
            notes.append(note)
        if len(ids) < 2:
            raise TfcliError(f"the table has {len(ids)} token(s) to map", hint="map chosen words instead")
    else:
        ids = []
        for word in request.words:
            lookup = find_word(table, word, strict=request.strict)
            if lookup.note:
                notes.append(lookup.note)
            if lookup.id not in ids:
                ids.append(lookup.id)
        if len(ids) < 2:
            raise TfcliError("--map needs at least two different tokens", hint="pass more words")
    points, share = pca_2d(table.vectors[ids])
    found = EmbeddingMap([table.label(i) for i in ids], ids, points, share, [table.text(i) for i in ids])
    if request.output is not None:
        _write_map(found, request.output, f"PCA of {table.what}")
        found.written = request.output
    return found


def _write_map(found: EmbeddingMap, path: Path, title: str) -> None:
    suffix = path.suffix.lower()
    if suffix == ".png":
        write_output(path, map_png(found.points, found.labels, title, found.share))
    elif suffix == ".html":
        write_output(path, map_html(found.points, found.labels, title, found.share))
    else:
        write_output(path, dumps_json({"table": title, **found.to_json()}, indent=2) + "\n")
