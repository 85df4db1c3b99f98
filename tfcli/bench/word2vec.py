"""`tfcli bench word2vec`: tfcli's word2vec training beside gensim's Word2Vec (its optimized C), on the same
tokenized corpus, threads, dimension, window, negatives, subsampling and epochs, in one run.

Each side trains in a fresh subprocess (`python -m tfcli.bench.word2vec JOB ...`); only the training is
timed (gensim's `train` after `build_vocab`; tfcli's steps, from the loop's start to its last step), in CPU
seconds of the whole process (every thread) and wall seconds. Words are the corpus's tokens that are not
special tokens, once an epoch, as gensim counts its raw words. The analogy accuracy on the questions shipped
with tfcli checks that both learned the same thing.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from tfcli.bench.common import peak_rss_mb, run_worker
from tfcli.corpus.reader import resolve_corpus
from tfcli.data.shards import encode_corpus, open_shard
from tfcli.errors import TfcliError
from tfcli.inspect.embedding_evals import evaluate_analogies
from tfcli.inspect.embedding_report import shipped_file
from tfcli.inspect.embeddings import load_table, make_table
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig
from tfcli.train.events import Started, StepDone
from tfcli.train.loop import train
from tfcli.train.word2vec import word2vec_job
from tfcli.word2vec.kernel import train_span_function

TARGET_RATIO = 0.5  # tfcli's words per CPU second / gensim's


@dataclasses.dataclass
class Word2VecMeasurement:
    job: str
    words: int
    cpu_seconds: float
    wall_seconds: float
    analogy_accuracy: float
    peak_rss_mb: float

    @property
    def words_per_cpu_second(self) -> float:
        return self.words / self.cpu_seconds if self.cpu_seconds else 0.0

    @property
    def words_per_second(self) -> float:
        return self.words / self.wall_seconds if self.wall_seconds else 0.0

    def to_json(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "words_per_cpu_second": round(self.words_per_cpu_second, 1),
            "words_per_second": round(self.words_per_second, 1),
        }


@dataclasses.dataclass
class Word2VecBench:
    settings: dict
    corpus_words: int
    rounds: list[tuple[Word2VecMeasurement, Word2VecMeasurement]]  # (tfcli, gensim) per round

    @property
    def best(self) -> tuple[Word2VecMeasurement, Word2VecMeasurement]:
        """Each side's round with the least CPU time."""
        return min((r[0] for r in self.rounds), key=lambda m: m.cpu_seconds), min((r[1] for r in self.rounds), key=lambda m: m.cpu_seconds)

    @property
    def cpu_ratio(self) -> float:
        """tfcli's words per CPU second / gensim's (target >= 0.5)."""
        ours, theirs = self.best
        return ours.words_per_cpu_second / theirs.words_per_cpu_second

    @property
    def wall_ratio(self) -> float:
        ours, theirs = self.best
        return ours.words_per_second / theirs.words_per_second

    def to_json(self) -> dict:
        ours, theirs = self.best
        return {
            "settings": self.settings,
            "corpus_words": self.corpus_words,
            "tfcli": ours.to_json(),
            "gensim": theirs.to_json(),
            "rounds": [[a.to_json(), b.to_json()] for a, b in self.rounds],
            "cpu_ratio": round(self.cpu_ratio, 4),
            "wall_ratio": round(self.wall_ratio, 4),
            "target": TARGET_RATIO,
        }


def prepare_corpus(sample_corpus: Path, folder: Path) -> Path:
    """A lowercased word-level tokenizer and shards of `sample_corpus` in `folder`; returns the shards."""
    train_tokenizer(resolve_corpus([sample_corpus]), folder / "tokenizer", TokenizerTrainingConfig(model="word", lowercase=True))
    encode_corpus(resolve_corpus([sample_corpus]), TextTokenizer.load(folder / "tokenizer" / "tokenizer.json"), folder / "shards", val_fraction=0.0)
    return folder / "shards"


def corpus_sentences(shards: Path) -> tuple[list[list[str]], int]:
    """train.bin as gensim reads a corpus (one list of words per document), and its word count."""
    tokenizer = TextTokenizer.load(shards.parent / "tokenizer" / "tokenizer.json")
    ids = np.asarray(open_shard(shards, "train"))
    words = np.array([tokenizer.hf.id_to_token(i) for i in range(tokenizer.vocab_size)], dtype=object)
    specials = list(tokenizer.special_ids.values())
    sentences = []
    for piece in np.split(ids, np.flatnonzero(np.isin(ids, specials))):  # each piece starts with the special token that ended the one before
        piece = piece[~np.isin(piece, specials)]
        if len(piece):
            sentences.append(words[piece].tolist())
    return sentences, sum(map(len, sentences))


def run_word2vec_bench(
    scratch: Path,
    sample_corpus: Path,
    *,
    algorithm: str,
    dim: int,
    window: int,
    negatives: int,
    subsample: float,
    epochs: int,
    threads: int,
    repeat: int,
    progress=None,
) -> Word2VecBench:
    try:
        import gensim  # noqa: F401
    except ImportError:
        raise TfcliError("bench word2vec compares tfcli with gensim's Word2Vec, which is not installed", hint="pip install 'tfcli[word2vec]'") from None
    settings = {
        "algorithm": algorithm,
        "dim": dim,
        "window": window,
        "negatives": negatives,
        "subsample": subsample,
        "epochs": epochs,
        "threads": threads,
    }
    if progress:
        progress("preparing the corpus")
    shards = prepare_corpus(sample_corpus, scratch / "corpus")
    _, corpus_words = corpus_sentences(shards)
    rounds = []
    for r in range(repeat):
        pair = []
        for job in ("tfcli", "gensim"):
            if progress:
                progress(f"round {r + 1} of {repeat}: {job}")
            result = run_worker("tfcli.bench.word2vec", [job, str(shards), str(scratch / f"{job}-{r}"), json.dumps(settings)])
            pair.append(Word2VecMeasurement(**result))
        rounds.append((pair[0], pair[1]))
    return Word2VecBench(settings, corpus_words, rounds)


# ---- the workers: one training each, in a fresh process ---------------------------------------------------


def _analogy_accuracy(table) -> float:
    return evaluate_analogies(table, shipped_file("stories", 0))[-1].accuracy or 0.0


def _tfcli_worker(shards: Path, out: Path, settings: dict) -> dict:
    train_span_function()  # built before the clock starts
    vectors = {k: settings[k] for k in ("dim", "window", "negatives", "subsample")} | {"algorithm": settings["algorithm"]}
    job = word2vec_job(
        data=shards,
        output=out,
        vectors=vectors,
        settings={"epochs": settings["epochs"], "threads": settings["threads"], "save_every": 0, "log_every": 1000},
        tokenizer_path=None,
        resume=False,
    )
    _, words = corpus_sentences(shards)
    cpu = wall = 0.0
    for event in train(job):  # the steps are timed, as gensim's train is: from the first step to the last
        if isinstance(event, Started):
            cpu, wall = time.process_time(), time.perf_counter()
        elif isinstance(event, StepDone):
            cpu_end, wall_end = time.process_time(), time.perf_counter()
    cpu, wall = cpu_end - cpu, wall_end - wall
    return dataclasses.asdict(Word2VecMeasurement("tfcli", words * settings["epochs"], cpu, wall, _analogy_accuracy(load_table(out)), peak_rss_mb()))


def _gensim_worker(shards: Path, settings: dict) -> dict:
    from gensim.models import Word2Vec

    sentences, words = corpus_sentences(shards)
    model = Word2Vec(
        vector_size=settings["dim"],
        window=settings["window"],
        negative=settings["negatives"],
        sample=settings["subsample"],
        sg=int(settings["algorithm"] == "skipgram"),
        workers=settings["threads"],
        min_count=1,
        seed=1,
    )
    model.build_vocab(sentences)
    cpu, wall = time.process_time(), time.perf_counter()
    model.train(sentences, total_examples=len(sentences), epochs=settings["epochs"])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tokenizer = TextTokenizer.load(shards.parent / "tokenizer" / "tokenizer.json")
    vectors = np.zeros((tokenizer.vocab_size, settings["dim"]), dtype=np.float32)
    seen = np.zeros(tokenizer.vocab_size, dtype=bool)
    for word in model.wv.index_to_key:
        i = tokenizer.hf.token_to_id(word)
        vectors[i], seen[i] = model.wv[word], True
    table = make_table(vectors, tokenizer, seen, "gensim")
    return dataclasses.asdict(Word2VecMeasurement("gensim", words * settings["epochs"], cpu, wall, _analogy_accuracy(table), peak_rss_mb()))


if __name__ == "__main__":
    job_name, shard_dir, out_dir, settings_json = sys.argv[1:]
    config = json.loads(settings_json)
    if job_name == "tfcli":
        measured = _tfcli_worker(Path(shard_dir), Path(out_dir), config)
    else:
        measured = _gensim_worker(Path(shard_dir), config)
    print(json.dumps(measured))
