"""A word2vec run's settings, torch-free and validated on creation: the vectors (`Word2VecConfig`, config.json's
"word2vec") and how they are trained (`Word2VecTraining`, its "training.config"). The defaults are gensim's."""

from __future__ import annotations

import dataclasses

from tfcli.errors import TfcliError
from tfcli.schema import JsonRecord

ALGORITHMS = ("skipgram", "cbow")
MAX_DIM = 4096
MAX_WINDOW = 100
MAX_NEGATIVES = 100


@dataclasses.dataclass
class Word2VecConfig(JsonRecord):
    """The vectors and the objective that made them."""

    vocab_size: int  # rows of each table: the tokenizer's vocabulary
    algorithm: str = "skipgram"  # skipgram: each word predicts its neighbours; cbow: the mean of the neighbours predicts the word
    dim: int = 100  # the length of each vector
    window: int = 5  # the most words on each side; each word draws its own window in 1..window
    negatives: int = 5  # noise words per example, drawn from the unigram distribution ** ns_exponent
    subsample: float = 1e-3  # frequent words are dropped with probability 1 - (sqrt(f / t) + 1) * t / f, t = subsample * words (0: none)
    ns_exponent: float = 0.75  # the power of the counts in the noise distribution

    def __post_init__(self) -> None:
        checks = [
            ("algorithm", self.algorithm in ALGORITHMS, f"one of {', '.join(ALGORITHMS)}"),
            ("vocab_size", 2 <= self.vocab_size <= 1 << 24, "between 2 and 16,777,216"),
            ("dim", 1 <= self.dim <= MAX_DIM, f"between 1 and {MAX_DIM}"),
            ("window", 1 <= self.window <= MAX_WINDOW, f"between 1 and {MAX_WINDOW}"),
            ("negatives", 1 <= self.negatives <= MAX_NEGATIVES, f"between 1 and {MAX_NEGATIVES}"),
            ("subsample", 0 <= self.subsample < 1, "in [0, 1)"),
            ("ns_exponent", -2 <= self.ns_exponent <= 2, "between -2 and 2"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise TfcliError(f"word2vec {name} must be {expected}, not {getattr(self, name)!r}")


@dataclasses.dataclass
class Word2VecTraining(JsonRecord):
    """How long and how fast: the learning rate falls linearly from lr to min_lr over the run (gensim's alpha
    and min_alpha), over `epochs` passes of the shards or over `time_budget` seconds."""

    epochs: int = 5
    time_budget: float | None = None  # seconds; the schedule spans it instead of the epochs
    lr: float = 0.025
    min_lr: float = 0.0001
    threads: int = 1  # threads training the same tables at once (Hogwild, as gensim's workers)
    step_tokens: int = 100_000  # tokens of the shards per step (split between the threads)
    seed: int = 1337  # the vectors' initialisation and every random draw of step s, thread t derive from (seed, s, t)
    log_every: int = 1  # steps between metrics.jsonl records (a step is 100,000 tokens: a point of the loss curve each)
    save_every: int = 500  # steps between checkpoints (0: only at the end)

    def __post_init__(self) -> None:
        checks = [
            ("epochs", 1 <= self.epochs <= 100_000, "between 1 and 100,000"),
            ("time_budget", self.time_budget is None or self.time_budget > 0, "positive"),
            ("lr", 0 < self.lr <= 10, "positive and at most 10"),
            ("min_lr", 0 <= self.min_lr <= self.lr, "between 0 and lr"),
            ("threads", 1 <= self.threads <= 256, "between 1 and 256"),
            ("step_tokens", 1000 <= self.step_tokens <= 1 << 28, "between 1,000 and 268,435,456"),
            ("log_every", self.log_every >= 1, "at least 1"),
            ("save_every", self.save_every >= 0, "0 or more"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise TfcliError(f"word2vec training setting {name} must be {expected}, not {getattr(self, name)!r}")


# settings a resumed run may change: they do not alter what the finished steps computed
RESUMABLE_CHANGES = ("time_budget", "epochs", "log_every", "save_every", "threads")


@dataclasses.dataclass
class Word2VecRecord(JsonRecord):
    """config.json's "training" of a word2vec run."""

    config: Word2VecTraining
    task: str = "word2vec"
    data: str = ""
    step: int = 0
    words: int = 0  # tokens of the shards trained on, subsampled ones included (gensim's raw words)
