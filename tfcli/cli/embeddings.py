"""`tfcli inspect-embeddings RUN`: nearest neighbours, analogies, a map and the word-vector evaluations of any
run's token vectors (tfcli/inspect/embedding_report.py), rendered as tables, a scatter or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import print_json, print_table, require_utf8, stdout_console
from tfcli.cli.options import Device, JsonFlag

EvalAnalogies = Annotated[
    Optional[str],
    typer.Option(
        "--eval-analogies",
        help="Analogy accuracy on a questions-words.txt file (': section' lines, then 'a b c d'), or `stories` for the file shipped with tfcli.",
        show_default=False,
    ),
]
EvalSimilarity = Annotated[
    Optional[str],
    typer.Option(
        "--eval-similarity",
        help="Spearman's rho against human scores: a file of 'word word score' lines, or `stories` for the file shipped with tfcli.",
        show_default=False,
    ),
]
Layer = Annotated[
    Optional[int],
    typer.Option("--layer", "-l", help="Contextual vectors: the residual stream at this block's input (0: the embeddings), with --data.", show_default=False),
]


def inspect_embeddings(
    run: Annotated[Path, typer.Argument(help="A run directory: word2vec, a trained transformer or an imported one.", show_default=False)],
    words: Annotated[Optional[list[str]], typer.Argument(help="The words for --neighbours or --map.", show_default=False)] = None,
    neighbours: Annotated[bool, typer.Option("--neighbours", "--neighbors", help="The nearest tokens of each WORD by cosine similarity.")] = False,
    k: Annotated[int, typer.Option("-k", help="How many neighbours or answers.")] = 10,
    analogy: Annotated[
        Optional[str],
        typer.Option("--analogy", help='An analogy to complete, e.g. "paris - france + italy" (the query words are left out).', show_default=False),
    ] = None,
    method: Annotated[str, typer.Option("--method", help="3cosadd (Mikolov et al.) or 3cosmul (Levy and Goldberg) for analogies.")] = "3cosadd",
    map_words: Annotated[bool, typer.Option("--map", help="A 2-D PCA map of the WORDs (or of --top N): a terminal scatter, or -o FILE.")] = False,
    top: Annotated[Optional[int], typer.Option("--top", help="--map the N most frequent tokens.", show_default=False)] = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Write the map: .png (a picture), .html (hover labels) or .json.", show_default=False)
    ] = None,
    eval_analogies: EvalAnalogies = None,
    eval_similarity: EvalSimilarity = None,
    table: Annotated[str, typer.Option("--table", help="input (the token embeddings) or output (the unembedding, where it is untied).")] = "input",
    layer: Layer = None,
    data: Annotated[
        Optional[Path], typer.Option("--data", help="Contextual vectors: a UTF-8 text file; each token's vectors are averaged over it.", show_default=False)
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse a word that is not one token instead of using its longest piece.")] = False,
    device: Device = "cpu",
    json_output: JsonFlag = False,
) -> None:
    """Nearest neighbours, analogies and a map of a run's token vectors, and the word2vec papers' evaluations.

    Works on a word2vec run (`train pretrain --objective word2vec`), a trained transformer's input embeddings
    (--table output: its unembedding) or an imported GPT-2, Llama or BERT, and on contextual vectors
    (--layer L --data FILE). A word that is not one token says how it tokenizes and uses its longest piece.
    Also: --analogy "he - boy + girl", --map red blue cat dog one two -o map.png, --eval-analogies stories.

    \b
    Example: tfcli inspect-embeddings runs/w2v --neighbours mom seven
    """
    from tfcli.inspect.embedding_report import EmbeddingRequest, explore
    from tfcli.inspect.labels import quoted

    for word in words or []:
        require_utf8(word, f"the word {quoted(word)}")
    require_utf8(analogy, "--analogy")
    text = _read_data(data) if data is not None else None
    request = EmbeddingRequest(
        run=run,
        words=list(words or []),
        neighbours=neighbours,
        k=k,
        analogy=analogy,
        method=method,
        map=map_words,
        top=top,
        output=output,
        eval_analogies=eval_analogies,
        eval_similarity=eval_similarity,
        table=table,
        layer=layer,
        data=text,
        strict=strict,
        device=device,
    )
    report = explore(request)
    if json_output:
        print_json(report.to_json())
        return
    _render(report)


DATA_BYTES_CAP = 16 << 20  # --data read for contextual vectors: its first 16 MB (the vectors are means; more adds little)


def _read_data(path: Path) -> str:
    """--data's text: its first DATA_BYTES_CAP bytes (said on stderr when there is more), UTF-8 with bad bytes replaced."""
    from rich.text import Text

    from tfcli.cli.common import stderr_console
    from tfcli.corpus.reader import binary_file_error, looks_binary
    from tfcli.errors import TfcliError

    if not path.is_file():
        raise TfcliError(f"--data {path} does not exist or is not a file", hint="pass a UTF-8 text file")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(DATA_BYTES_CAP + 1)
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if looks_binary(raw):
        raise binary_file_error(path)
    if len(raw) > DATA_BYTES_CAP:
        raw = raw[:DATA_BYTES_CAP]
        stderr_console().print(
            Text(f"note: --data {path} is larger than {DATA_BYTES_CAP >> 20} MB; its first {DATA_BYTES_CAP >> 20} MB are read", style="yellow")
        )
    return raw.decode("utf-8", errors="replace")


def _render(report) -> None:
    from rich.table import Table
    from rich.text import Text

    from tfcli.inspect.labels import quoted
    from tfcli.tokenizer.show import visible

    console = stdout_console()
    console.print(Text(visible(report.what), style="dim"), soft_wrap=True)
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"), soft_wrap=True)
    for word, found in (report.neighbours or {}).items():
        _print_scores(console, f"nearest to {quoted(word)}", found)
    if report.analogy is not None:
        _print_scores(console, visible(report.analogy[0]), report.analogy[1])
    if report.map is not None:
        found = report.map
        if found.written is not None:
            console.print(Text(f"map of {len(found.ids)} tokens written to {visible(str(found.written))}"), soft_wrap=True)
        else:
            from tfcli.inspect.embedding_map import map_text

            width = min(console.width, 100)
            console.print(Text(f"PCA map: PC1 ({found.share[0]:.0%} of the variance) across, PC2 ({found.share[1]:.0%}) up"), soft_wrap=True)
            for line in map_text(found.points, found.labels, width=width, height=min(24, max(8, len(found.ids)))):
                console.print(Text(line), soft_wrap=True, overflow="ignore", crop=False)
    if report.analogies is not None:
        grid = Table(title="analogy accuracy", title_justify="left")
        for column in ("section", "correct", "asked", "skipped", "accuracy"):
            grid.add_column(column, justify="left" if column == "section" else "right")
        for score in report.analogies:
            accuracy = f"{score.accuracy:.1%}" if score.accuracy is not None else "--"
            grid.add_row(Text(score.name), str(score.correct), str(score.total), str(score.skipped), accuracy, style="bold" if score.name == "total" else None)
        print_table(console, grid)
    if report.similarity is not None:
        s = report.similarity
        rho = f"{s.rho:.3f}" if s.rho is not None else "-- (fewer than two pairs, or constant scores)"
        console.print(Text(f"word similarity: Spearman's rho {rho} on {s.pairs} pairs ({s.skipped} skipped: a word not in the table)"), soft_wrap=True)


def _print_scores(console, title: str, found) -> None:
    from rich.table import Table
    from rich.text import Text

    grid = Table(title=Text(title), title_justify="left")
    grid.add_column("#", justify="right")
    grid.add_column("token")
    grid.add_column("cosine" if "nearest" in title else "score", justify="right")
    for rank, neighbour in enumerate(found, 1):
        grid.add_row(str(rank), Text(neighbour.label or neighbour.token), f"{neighbour.score:.3f}")
    print_table(console, grid)
