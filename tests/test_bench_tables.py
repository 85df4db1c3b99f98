"""The benches' tables of trainers side by side (tfcli.cli.bench.common.print_comparison): every column and row
shown, and the line under the table that says whether the target was met."""

from __future__ import annotations

import pytest

from tfcli.bench.sae import SaeBenchResult, SaeBenchRow
from tfcli.bench.word2vec import Word2VecBench, Word2VecMeasurement
from tfcli.cli.bench.sae import _print_result as print_sae_result
from tfcli.cli.bench.word2vec import _print_result as print_word2vec_result

SAE_SETTINGS = {"d_sae": 512, "hook": "blocks.1.hook_resid_post", "d_in": 64, "k": 32, "lr": 4e-4, "batch_size": 1024, "tokens": 300_000, "threads": 1}
WORD2VEC_SETTINGS = {"algorithm": "skipgram", "epochs": 10, "dim": 100, "window": 5, "negatives": 5, "threads": 1}


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")


def _lines(text: str) -> list[str]:
    return [" ".join(line.replace("│", " ").replace("┃", " ").split()) for line in text.splitlines()]


@pytest.mark.parametrize("tfcli_cpu_seconds, said", [(10.0, "2.00, L0 1.000"), (40.0, "0.50, L0 1.000")])
def test_the_sae_bench_table_and_its_verdict(capsys, tfcli_cpu_seconds, said):
    rows = [
        SaeBenchRow("tfcli", tfcli_cpu_seconds, 11.0, 300_000, 32.0, 0.81, 0.9, 0.01, 700.0),
        SaeBenchRow("SAELens", 20.0, 21.0, 300_000, 32.0, 0.8, 0.89, 0.02, 900.0),
    ]
    print_sae_result(SaeBenchResult(SAE_SETTINGS, rows), "a machine")
    lines = _lines(capsys.readouterr().out)
    assert "trainer CPU s wall s tokens / CPU s L0 explained var. CE loss recovered dead peak RSS" in lines
    assert f"tfcli {tfcli_cpu_seconds:.2f} 11.00 {300_000 / tfcli_cpu_seconds:,.0f} 32.0 0.810 0.900 1.0% 700 MB" in lines
    assert "SAELens 20.00 21.00 15,000 32.0 0.800 0.890 2.0% 900 MB" in lines
    verdict = "ok" if tfcli_cpu_seconds < 20 else "MISSED"
    assert (
        lines[-1]
        == f"tfcli / SAELens: tokens per CPU second {said}, explained variance 1.012, CE loss recovered 1.011 (target: speed >= 1, quality within 5%: {verdict})"
    )


@pytest.mark.parametrize("tfcli_cpu_seconds, verdict", [(3.0, "ok"), (5.0, "MISSED")])
def test_the_word2vec_bench_table_and_its_verdict(capsys, tfcli_cpu_seconds, verdict):
    pair = (Word2VecMeasurement("tfcli", 1_100_000, tfcli_cpu_seconds, 3.1, 0.25, 300.0), Word2VecMeasurement("gensim", 1_100_000, 2.0, 2.1, 0.26, 250.0))
    print_word2vec_result(Word2VecBench(WORD2VEC_SETTINGS, 110_000, [pair]), "a machine")
    lines = _lines(capsys.readouterr().out)
    assert "trainer CPU s wall s words / CPU s words / s analogies peak RSS" in lines
    assert f"tfcli {tfcli_cpu_seconds:.2f} 3.10 {1_100_000 / tfcli_cpu_seconds:,.0f} 354,839 25.0% 300 MB" in lines
    assert "gensim 2.00 2.10 550,000 523,810 26.0% 250 MB" in lines
    assert lines[-1] == f"words per CPU second, tfcli / gensim: {2.0 / tfcli_cpu_seconds:.2f} (target >= 0.5: {verdict}); by wall time 0.68"


@pytest.mark.parametrize("count, said", [(1, "1 epoch"), (2, "2 epochs")])
def test_the_word2vec_title_counts_in_words(capsys, count, said):
    settings = WORD2VEC_SETTINGS | {"epochs": count, "negatives": count, "threads": count}
    pair = (Word2VecMeasurement("tfcli", 1_100_000, 3.0, 3.1, 0.25, 300.0), Word2VecMeasurement("gensim", 1_100_000, 2.0, 2.1, 0.26, 250.0))
    print_word2vec_result(Word2VecBench(settings, 1, [pair]), "a machine")
    title = " ".join(capsys.readouterr().out.split())
    assert f"1 word x {said}," in title
    assert f"{said.replace('epoch', 'negative')}, {said.replace('epoch', 'thread')}, best of 1" in title


@pytest.mark.parametrize("count, said", [(1, "1 thread"), (4, "4 threads")])
def test_the_sae_title_counts_in_words(capsys, count, said):
    rows = [SaeBenchRow("tfcli", 1.0, 1.0, 1, 32.0, 0.8, 0.9, 0.0, 1.0), SaeBenchRow("SAELens", 1.0, 1.0, 1, 32.0, 0.8, 0.9, 0.0, 1.0)]
    print_sae_result(SaeBenchResult(SAE_SETTINGS | {"tokens": 1, "threads": count}, rows), "a machine")
    title = " ".join(capsys.readouterr().out.split())
    assert f"1 token, {said}; a machine" in title
