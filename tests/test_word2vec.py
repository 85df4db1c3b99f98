"""word2vec training (`train word2vec`, or `train pretrain --objective word2vec`) against gensim's Word2Vec on
the same tokenized corpus and settings: analogy accuracy within 2 points, nearest neighbours as close to
gensim's as gensim's are to themselves; and a word2vec run as a run: resume, time budget, metrics, info,
generate's refusal."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.training import records
from tests.word_vectors import require_gensim, sentences, word_shards

COMMON = ["seven", "mom", "cat", "red", "boy", "apple", "two", "she", "tree", "dog"]
SETTINGS = {"dim": 100, "window": 5, "negatives": 5, "subsample": 1e-3, "epochs": 5}


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    return word_shards(tmp_path_factory.mktemp("stories"))


def _train(cli, shards, out, *extra):
    s = SETTINGS
    args = ["train", "pretrain", "--objective", "word2vec", "--data", shards, "-o", out]
    args += ["--dim", s["dim"], "--window", s["window"], "--negatives", s["negatives"], "--subsample", s["subsample"], *extra]
    result = cli(*args)
    assert result.code == 0, result.stderr
    return result


@pytest.mark.parametrize("algorithm", ["skipgram", "cbow"])
def test_analogies_and_neighbours_match_gensim(cli, stories, tmp_path, algorithm):
    Word2Vec = require_gensim()
    from tfcli.inspect.embedding_evals import evaluate_analogies
    from tfcli.inspect.embedding_report import shipped_file
    from tfcli.inspect.embeddings import find_word, load_table, neighbours

    questions = shipped_file("stories", 0)
    corpus = sentences(stories)
    s = SETTINGS
    common = {"vector_size": s["dim"], "window": s["window"], "negative": s["negatives"], "sample": s["subsample"], "epochs": s["epochs"], "min_count": 1}
    sg = int(algorithm == "skipgram")
    gensims = [Word2Vec(corpus, sg=sg, workers=1, seed=seed, **common) for seed in (1, 2)]
    gensim_accuracy = np.mean([model.wv.evaluate_word_analogies(str(questions))[0] for model in gensims])
    ours = []
    for seed in (1, 2):
        _train(cli, stories, tmp_path / f"w2v-{seed}", "--word2vec", algorithm, "--epochs", s["epochs"], "--seed", seed, "--threads", 1)
        ours.append(load_table(tmp_path / f"w2v-{seed}"))
    our_accuracy = np.mean([evaluate_analogies(table, questions)[-1].accuracy for table in ours])
    assert abs(our_accuracy - gensim_accuracy) <= 0.02, (our_accuracy, gensim_accuracy)
    assert our_accuracy > 0.02  # the gender and counting sections are learned at all

    table = ours[0]
    assert set(gensims[0].wv.index_to_key) == {table.label(i) for i in np.flatnonzero(table.candidates)}  # the same vocabulary
    between_gensims, with_gensim = [], []
    for word in COMMON:
        first, second = ({w for w, _ in model.wv.most_similar(word, topn=10)} for model in gensims)
        mine = {n.token for n in neighbours(table, find_word(table, word).id, 10)}
        between_gensims.append(len(first & second))
        with_gensim.append(len(first & mine))
    assert np.mean(with_gensim) >= 5 and np.mean(with_gensim) >= np.mean(between_gensims) - 1.5, (with_gensim, between_gensims)


def test_loading_the_kernel_leaves_the_processs_arithmetic_alone(tmp_path, monkeypatch):
    """A library built with -ffast-math turns on flush-to-zero in every thread of the process that loads it."""
    import subprocess
    import sys

    monkeypatch.setenv("TFCLI_CACHE_DIR", str(tmp_path))
    code = (
        "import numpy as np\nfrom tfcli.word2vec.kernel import train_span_function\ntrain_span_function()\nprint(float(np.float32(1e-38) / np.float32(100)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(done.stdout) > 0  # a subnormal, not flushed to zero


def test_statistics_are_gensims(stories):
    """The subsampling thresholds and the noise table are gensim's (prepare_weights, make_cum_table)."""
    Word2Vec = require_gensim()
    from tfcli.word2vec.vocab import keep_thresholds, noise_table

    corpus = sentences(stories)
    model = Word2Vec(min_count=1, sample=1e-3, ns_exponent=0.75, workers=1)
    model.build_vocab(corpus)
    counts = np.array([model.wv.get_vecattr(w, "count") for w in model.wv.index_to_key], dtype=np.int64)
    ours = keep_thresholds(counts, 1e-3).astype(np.int64)
    theirs = np.array([model.wv.get_vecattr(w, "sample_int") for w in model.wv.index_to_key], dtype=np.int64)
    assert np.abs(ours - theirs).max() <= 2  # rounding of the same formula
    assert (ours < 2**32 - 1).sum() == (theirs < 2**32 - 1).sum() > 10  # the same words are subsampled
    assert np.abs(noise_table(counts, 0.75).astype(np.int64) - model.cum_table.astype(np.int64)).max() <= 1


def test_a_run_is_a_run(cli, stories, tmp_path):
    """Metrics and loss curve, the run directory, info, generate's one-line refusal; the loss falls."""
    run = tmp_path / "w2v"
    result = _train(cli, stories, run, "--epochs", 3, "--log-every", 1, "--json")
    summary = json.loads(result.stdout)
    assert summary["stopped_by"] == "steps" and summary["step"] == 4  # 3 x 112k tokens in steps of 100k
    logged = records(run)
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert logged[-1]["loss"] < logged[0]["loss"]
    assert logged[-1]["lr"] < logged[0]["lr"] <= 0.025  # linear decay
    assert (run / "loss.png").is_file() and (run / "tokenizer.json").is_file()
    config = json.loads((run / "config.json").read_text())
    assert config["word2vec"]["algorithm"] == "skipgram" and config["training"]["config"]["epochs"] == 3

    info = cli("info", run, "--json")
    assert info.code == 0, info.stderr
    described = json.loads(info.stdout)
    assert described["word2vec"]["dim"] == 100 and described["parameters"]["total"] == 2 * 100 * described["word2vec"]["vocab_size"]
    assert described["problems"] == []
    shown = cli("info", run)
    assert shown.code == 0 and "word2vec" in shown.stdout

    refused = cli("generate", run, "--prompt", "the bird")
    assert refused.code == 2 and "word2vec run" in refused.stderr and "Traceback" not in refused.stderr
    assert len([line for line in refused.stderr.splitlines() if line.strip()]) <= 2  # the error and its hint


def test_resume_is_exact_and_budget_stops(cli, stories, tmp_path):
    """A run stopped after its first step and resumed ends with the vectors of a run never stopped (one thread:
    every draw of a step derives from the seed and the step)."""
    from safetensors.numpy import load_file

    from tfcli.train.events import Saved
    from tfcli.train.loop import train
    from tfcli.train.word2vec import word2vec_job

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    _train(cli, stories, whole, "--epochs", 2, "--save-every", 1, "--log-every", 1)
    vectors = {"dim": 100, "window": 5, "negatives": 5, "subsample": 1e-3}
    job = word2vec_job(
        data=stories, output=stopped, vectors=vectors, settings={"epochs": 2, "save_every": 1, "log_every": 1}, tokenizer_path=None, resume=False
    )
    events = train(job)
    for event in events:
        if isinstance(event, Saved):
            events.close()  # as a crash right after the first checkpoint
            break
    assert json.loads((stopped / "trainer" / "state.json").read_text())["step"] == 1
    resumed = _train(cli, stories, stopped, "--epochs", 2, "--save-every", 1, "--log-every", 1, "--resume")
    assert "from step 1" in resumed.stderr
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(stopped / "model.safetensors"))
    np.testing.assert_array_equal(a["input_vectors"], b["input_vectors"])
    np.testing.assert_array_equal(a["output_vectors"], b["output_vectors"])
    assert [r["step"] for r in records(stopped)] == [1, 2, 3]
    assert [(r["loss"], r["lr"]) for r in records(stopped)] == [(r["loss"], r["lr"]) for r in records(whole)]

    changed = cli("train", "pretrain", "--objective", "word2vec", "--data", stories, "-o", stopped, "--dim", 50, "--resume")
    assert changed.code == 2 and "cannot resume: word2vec dim was 100, now 50" in changed.stderr
    budget = _train(cli, stories, tmp_path / "budget", "--time-budget", "1s", "--json")
    assert json.loads(budget.stdout)["stopped_by"] == "budget"


# A word2vec run in a child process, in steps of 1,000 tokens (the command line's are 100,000), saying each save.
_CHILD = """
import json, sys
from pathlib import Path
from tfcli.train.events import Saved
from tfcli.train.loop import train
from tfcli.train.word2vec import word2vec_job
job = word2vec_job(data=Path(sys.argv[1]), output=Path(sys.argv[2]), vectors={"dim": 20}, settings=json.loads(sys.argv[3]), tokenizer_path=None, resume=False)
for event in train(job):
    if isinstance(event, Saved):
        print("saved", event.step, flush=True)
"""
_SMALL_STEPS = {"epochs": 2, "step_tokens": 1000, "save_every": 10, "log_every": 5, "threads": 1, "seed": 5}


def _run_in_process(stories, out, resume):
    from tfcli.train.events import Started
    from tfcli.train.loop import train
    from tfcli.train.word2vec import word2vec_job

    job = word2vec_job(data=stories, output=out, vectors={"dim": 20}, settings=_SMALL_STEPS, tokenizer_path=None, resume=resume)
    return [event.step for event in train(job) if isinstance(event, Started)][0]


def test_a_run_killed_after_a_checkpoint_resumes_to_the_vectors_of_one_never_stopped(stories, tmp_path):
    """SIGKILL in the middle of a run (nothing gets to save): what the last checkpoint holds survives, --resume
    starts from its step and ends with the vectors and metrics of an uninterrupted run (one thread: exact)."""
    import subprocess
    import sys

    from safetensors.numpy import load_file

    killed, whole = tmp_path / "killed", tmp_path / "whole"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(stories), str(killed), json.dumps(_SMALL_STEPS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        first = child.stdout.readline()  # the first checkpoint is written; the run goes on
        child.kill()
    finally:
        child.wait(timeout=60)
    assert first == "saved 10\n", child.stderr.read()
    assert child.returncode == -9  # killed, not finished: 2 x 112,152 tokens are 225 steps
    saved = json.loads((killed / "trainer" / "state.json").read_text())["step"]
    assert saved % 10 == 0 and 10 <= saved < 225

    assert _run_in_process(stories, killed, resume=True) == saved
    assert _run_in_process(stories, whole, resume=False) == 0
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    np.testing.assert_array_equal(a["input_vectors"], b["input_vectors"])
    np.testing.assert_array_equal(a["output_vectors"], b["output_vectors"])
    same = ("step", "loss", "lr", "tokens", "words_kept")  # not the speed and the time
    assert [[r[k] for k in same] for r in records(killed)] == [[r[k] for k in same] for r in records(whole)]


def test_sigterm_saves_a_checkpoint_also_without_periodic_saves(stories, tmp_path):
    """SIGTERM (as Ctrl-C) ends the step in hand, saves and exits 143, also with no periodic save (--save-every 0)."""
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    args = ["train", "word2vec", "--data", stories, "-o", run, "--epochs", 100, "--dim", 20, "--save-every", 0, "--log-every", 1]
    child = subprocess.Popen([sys.executable, "-m", "tfcli", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 143, stderr
    step = json.loads((run / "trainer" / "state.json").read_text())["step"]
    assert 1 <= step < 113 and f"stopped at step {step}; the checkpoint is saved in {run}" in stderr, stderr
    assert "Traceback" not in stderr
    assert json.loads((run / "config.json").read_text())["training"]["step"] == step


def test_options_that_do_not_apply(cli, stories, tmp_path):
    for extra, message in (
        (["--objective", "word2vec", "--arch", "encoder"], "--arch does not apply to --objective word2vec"),
        (["--objective", "word2vec", "--word2vec", "glove"], "--word2vec must be one of skipgram, cbow"),
        (["--objective", "word2vec", "--dim", "0"], "word2vec dim must be between 1 and 4096"),
        (["--dim", "50"], "--dim does not apply to a transformer's pretraining"),
        (["--objective", "word2vec", "--epochs", "2", "--time-budget", "1s"], "--epochs and --time-budget do not go together"),
    ):
        result = cli("train", "pretrain", "--data", stories, "-o", tmp_path / "never", *extra)
        assert result.code == 2 and message in result.stderr, result.stderr
        assert not (tmp_path / "never").exists()


def test_train_word2vec_is_pretrain_with_objective_word2vec(cli, stories, tmp_path):
    """`train word2vec` makes the very run `train pretrain --objective word2vec` makes, and takes only word2vec's options."""
    from safetensors.numpy import load_file

    common = ["--data", stories, "--epochs", 1, "--dim", 20, "--seed", 3]
    assert cli("train", "word2vec", *common, "-o", tmp_path / "a").code == 0
    assert cli("train", "pretrain", "--objective", "word2vec", *common, "-o", tmp_path / "b").code == 0
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    np.testing.assert_array_equal(a["input_vectors"], b["input_vectors"])
    for extra, message in (
        (["--word2vec", "glove"], "--word2vec must be one of skipgram, cbow"),
        (["--epochs", "2", "--time-budget", "1s"], "--epochs and --time-budget do not go together"),
        (["--arch", "encoder"], "No such option: --arch"),
    ):
        result = cli("train", "word2vec", "--data", stories, "-o", tmp_path / "never", *extra)
        assert result.code == 2 and message in result.stderr, result.stderr
        assert not (tmp_path / "never").exists()


def test_data_that_is_another_artifact_is_named_for_what_it_is(cli, tmp_path):
    """`train word2vec --data RUN` said 'RUN has no meta.json', as if a run were a shard folder missing a file."""
    run, tokenizer, shards = tmp_path / "run", tmp_path / "tokenizer", tmp_path / "shards"
    for folder, files in (
        (run, ("config.json", "model.safetensors", "tokenizer.json")),
        (tokenizer, ("tokenizer.json",)),
        (shards, ("meta.json", "train.bin")),
    ):
        folder.mkdir()
        for name in files:
            (folder / name).write_bytes(b"{}")
    for data, message, hint in (
        (run, f"{run} is a run directory, not a folder of token shards", "as `tfcli tokenize encode` writes"),
        (tokenizer, f"{tokenizer} is a tokenizer folder, not a folder of token shards", "as `tfcli tokenize encode` writes"),
        (shards / "meta.json", "is meta.json of a token-shard folder, not a folder of token shards", f"pass the folder {shards}"),
    ):
        for command in (["train", "word2vec"], ["train", "pretrain", "--objective", "word2vec"]):
            result = cli(*command, "--data", data, "-o", tmp_path / "never")
            assert result.code == 2 and message in result.stderr and hint in result.stderr, result.stderr
            assert "has no meta.json" not in result.stderr and not (tmp_path / "never").exists()


def test_word_tokenizer(cli, tmp_path):
    from tfcli.tokenizer.core import TextTokenizer

    text = tmp_path / "t.txt"
    text.write_text("The cat sat. The cat ran, the dog sat!\nA zebra once.\n", encoding="utf-8")
    result = cli("tokenize", "train", text, "-o", tmp_path / "tok", "--model", "word", "--lowercase", "--min-frequency", "2")
    assert result.code == 0, result.stderr
    tokenizer = TextTokenizer.load(tmp_path / "tok" / "tokenizer.json")
    assert tokenizer.family == "word" and tokenizer.pre_tokenizer_kind == "whitespace"
    pieces = [tokenizer.hf.id_to_token(i) for i in tokenizer.encode("The cat sat, the zebra.")]
    assert pieces == ["the", "cat", "sat", "<|unk|>", "the", "<|unk|>", "."]  # the comma and zebra are seen once: unk
    from transformers import PreTrainedTokenizerFast

    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")
    assert loaded.convert_ids_to_tokens(loaded("the cat sat")["input_ids"]) == ["the", "cat", "sat"]


@pytest.mark.slow
def test_bench_word2vec_smoke(cli):
    """`tfcli bench word2vec`: both sides train on the same words and report a ratio."""
    require_gensim()
    result = cli("bench", "word2vec", "--epochs", 1, "--repeat", 1, "--json")
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tfcli"]["words"] == report["gensim"]["words"] == report["corpus_words"] > 100_000
    assert report["cpu_ratio"] == pytest.approx(report["tfcli"]["words_per_cpu_second"] / report["gensim"]["words_per_cpu_second"], rel=1e-3)
    assert report["settings"]["threads"] == 1 and report["target"] == 0.5
