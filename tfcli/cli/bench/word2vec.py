"""`tfcli bench word2vec`: tfcli's word2vec training beside gensim's Word2Vec on the same corpus and settings (tfcli.bench.word2vec)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.bench.common import machine_line, print_comparison, require_peer, scratch, verdict
from tfcli.cli.common import counted, print_json, stderr_console
from tfcli.cli.options import JsonFlag, Repeat, SampleData, Workdir


def word2vec(
    algorithm: Annotated[str, typer.Option("--word2vec", help="skipgram or cbow.")] = "skipgram",
    dim: Annotated[int, typer.Option("--dim", help="The length of each vector.")] = 100,
    window: Annotated[int, typer.Option("--window", help="The most words on each side.")] = 5,
    negatives: Annotated[int, typer.Option("--negatives", help="Noise words per example.")] = 5,
    subsample: Annotated[float, typer.Option("--subsample", help="The frequent-word threshold (0: none).")] = 1e-3,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the corpus (sample_data's stories, 110k words).")] = 10,
    threads: Annotated[int, typer.Option("--threads", help="Threads for both (gensim's workers).")] = 1,
    repeat: Repeat = 2,
    workdir: Workdir = None,
    data: SampleData = None,
    json_output: JsonFlag = False,
) -> None:
    """Time word2vec training against gensim's Word2Vec (its optimized C) on the same tokenized corpus.

    Same threads, dimension, window, negatives, subsampling and epochs; each side trains in a fresh process
    and only its training is timed. Target: tfcli's words per CPU second >= 0.5x gensim's. The analogy
    accuracy on the questions shipped with tfcli shows both learned alike. The default run takes about 20
    seconds on 2 CPU cores.

    \b
    Example: tfcli bench word2vec --epochs 10 --threads 1
    """
    from tfcli.bench.word2vec import run_word2vec_bench
    from tfcli.errors import TfcliError
    from tfcli.quickstart import find_sample_data

    if algorithm not in ("skipgram", "cbow"):
        raise TfcliError(f"--word2vec must be skipgram or cbow, not {algorithm!r}")
    for name, value in (("--epochs", epochs), ("--threads", threads), ("--repeat", repeat), ("--dim", dim), ("--window", window), ("--negatives", negatives)):
        if value < 1:
            raise TfcliError(f"{name} must be at least 1, not {value}")
    require_peer("bench word2vec", "gensim")
    sample = find_sample_data(data) / "corpus"
    with scratch(workdir) as folder, stderr_console().status("benchmarking") as status:
        result = run_word2vec_bench(
            folder,
            sample,
            algorithm=algorithm,
            dim=dim,
            window=window,
            negatives=negatives,
            subsample=subsample,
            epochs=epochs,
            threads=threads,
            repeat=repeat,
            progress=lambda job: status.update(f"benchmarking: {job}"),
        )
    machine = machine_line()
    if json_output:
        print_json({"machine": machine, **result.to_json()})
        return
    _print_result(result, machine)


def _print_result(result, machine: str) -> None:
    from tfcli.bench.word2vec import TARGET_RATIO

    s = result.settings
    title = (
        f"word2vec bench: {s['algorithm']}, {counted(result.corpus_words, 'word')} x {counted(s['epochs'], 'epoch')}, dim {s['dim']}, "
        f"window {s['window']}, {counted(s['negatives'], 'negative')}, {counted(s['threads'], 'thread')}, best of {len(result.rounds)}; {machine}"
    )
    columns = ("trainer", "CPU s", "wall s", "words / CPU s", "words / s", "analogies", "peak RSS")
    rows = [
        (
            m.job,
            f"{m.cpu_seconds:.2f}",
            f"{m.wall_seconds:.2f}",
            f"{m.words_per_cpu_second:,.0f}",
            f"{m.words_per_second:,.0f}",
            f"{m.analogy_accuracy:.1%}",
            f"{m.peak_rss_mb:.0f} MB",
        )
        for m in result.best
    ]
    summary = (
        f"words per CPU second, tfcli / gensim: {result.cpu_ratio:.2f} (target >= {TARGET_RATIO}: {verdict(result.cpu_ratio >= TARGET_RATIO)}); "
        f"by wall time {result.wall_ratio:.2f}"
    )
    print_comparison(title, columns, rows, summary)
