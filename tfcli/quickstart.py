"""`tfcli quickstart`: the whole chain on sample_data/, into one folder: a tokenizer, shards, a tiny decoder
pretrained on the stories, and a sentiment classifier fine-tuned from it on the reviews.

Each step is skipped when its output is already there and consistent (so a second run is instant),
unless `force` is set; an interrupted training step resumes. It yields one `QuickstartStep` per step
(and the training loop's events while a model trains); the CLI renders them.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfcli.corpus.reader import resolve_corpus
from tfcli.data.labeled import LabeledSet, read_labeled, split_validation
from tfcli.data.shards import encode_corpus, load_shard_meta
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind
from tfcli.rundir import read_run_config
from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig
from tfcli.train.evaluate import unigram_entropy
from tfcli.train.job import finetune_job, pretrain_job
from tfcli.train.loop import train
from tfcli.train.state import METRICS_FILE, read_metrics

QUICKSTART_VOCAB_SIZE = 2048
QUICKSTART_VAL_FRACTION = 0.1
PRETRAIN_STEPS = 400  # the tiny decoder, batch 32 x 128 tokens: about a minute on 2 CPU cores
CLASSIFIER_STEPS = 200


@dataclasses.dataclass(frozen=True)
class QuickstartStep:
    name: str
    made: bool  # False: an existing, consistent output was kept
    path: Path
    detail: str


@dataclasses.dataclass(frozen=True)
class QuickstartSkip:
    """A step left out because the data folder lacks what it needs."""

    name: str
    reason: str


def find_sample_data(explicit: Path | None = None) -> Path:
    """--data if given; else ./sample_data; else the sample_data/ of the source tree tfcli runs from."""
    candidates = [explicit] if explicit is not None else [Path("sample_data"), Path(__file__).resolve().parents[1] / "sample_data"]
    for folder in candidates:
        if folder is not None and (folder / "corpus").is_dir():
            return folder
    where = explicit if explicit is not None else Path("sample_data")
    raise TfcliError(f"{where} has no corpus/ folder", hint="run from the tfcli source tree, or pass --data pointing at sample_data/")


def run_quickstart(
    data_dir: Path, out_dir: Path, force: bool = False, pretrain_steps: int = PRETRAIN_STEPS, classifier_steps: int = CLASSIFIER_STEPS, device: str = "auto"
) -> Iterator[Any]:
    kind = artifact_kind(out_dir)
    if kind is not None:
        raise TfcliError(f"{out_dir} is {kind}; the quickstart makes a folder of its own", hint="pass a new folder with -o (the default is runs/quickstart)")
    corpus = resolve_corpus([data_dir / "corpus"])
    tokenizer_dir, shard_dir, model_dir = out_dir / "tokenizer", out_dir / "shards", out_dir / "model"
    tokenizer = yield from _tokenizer_step(corpus, tokenizer_dir, force)
    yield from _shards_step(corpus, tokenizer, shard_dir, force)
    made = yield from _model_step(shard_dir, model_dir, tokenizer, tokenizer_dir, force, pretrain_steps, device)
    reviews = data_dir / "reviews.jsonl"
    if not reviews.is_file():
        yield QuickstartSkip("classifier", f"{data_dir} has no reviews.jsonl (JSON lines of text and label), so no classifier is fine-tuned")
        return
    yield from _classifier_step(reviews, model_dir, out_dir / "classifier", tokenizer, force or made, classifier_steps, device)


def _tokenizer_step(corpus, tokenizer_dir: Path, force: bool) -> Iterator[Any]:
    """A BPE tokenizer of QUICKSTART_VOCAB_SIZE tokens on the corpus; returns it loaded."""
    tokenizer = _existing(lambda: TextTokenizer.load(tokenizer_dir / TOKENIZER_FILE)) if not force else None
    if tokenizer is None:
        summary = train_tokenizer(corpus, tokenizer_dir, TokenizerTrainingConfig(vocab_size=QUICKSTART_VOCAB_SIZE))
        tokenizer = TextTokenizer.load(tokenizer_dir / TOKENIZER_FILE)
        yield QuickstartStep("tokenizer", True, tokenizer_dir, f"{summary.vocab_size:,} tokens, {summary.bytes_per_token:.2f} bytes per token")
    else:
        yield QuickstartStep("tokenizer", False, tokenizer_dir, f"{tokenizer.vocab_size:,} tokens")
    return tokenizer


def _shards_step(corpus, tokenizer, shard_dir: Path, force: bool) -> Iterator[Any]:
    """The corpus encoded with the tokenizer (kept when shards of this tokenizer are there)."""
    meta = _existing(lambda: load_shard_meta(shard_dir)) if not force else None
    made = meta is None or meta.tokenizer_sha256 != tokenizer.sha256
    if made:
        meta = encode_corpus(corpus, tokenizer, shard_dir, val_fraction=QUICKSTART_VAL_FRACTION)
    yield QuickstartStep("shards", made, shard_dir, f"{meta.train_tokens:,} train / {meta.val_tokens:,} val tokens")


def _settings(steps: int, lr: float, evaluations: int, device: str) -> dict[str, Any]:
    """The training options of a quickstart run: batch 32, `evaluations` evaluations, a checkpoint halfway."""
    return {
        "max_steps": steps,
        "batch_size": 32,
        "lr": lr,
        "eval_every": max(steps // evaluations, 1),
        "save_every": max(steps // 2, 1),
        "device": device,
    }


def _model_step(shard_dir: Path, model_dir: Path, tokenizer, tokenizer_dir: Path, force: bool, steps: int, device: str) -> Iterator[Any]:
    """The tiny decoder pretrained on the shards; returns whether it trained."""
    settings = _settings(steps, 3e-3, 4, device)
    made, said = yield from _train_step(
        model_dir,
        force,
        steps,
        "--steps",
        tokenizer.sha256,
        lambda resume: pretrain_job(
            data=shard_dir,
            output=model_dir,
            arch="decoder",
            preset_name="tiny",
            config_file=None,
            sets=[],
            options=settings,
            tokenizer_path=tokenizer_dir / TOKENIZER_FILE,
            resume=resume,
        ),
    )
    val_loss = _last_metric(model_dir, "val_loss")
    entropy = unigram_entropy(shard_dir)
    yield QuickstartStep("model", made, model_dir, f"validation loss {val_loss:.3f} nats per token; the unigram entropy of the shards is {entropy:.3f}{said}")
    return made


def _classifier_step(reviews: Path, model_dir: Path, classifier_dir: Path, tokenizer, force: bool, steps: int, device: str) -> Iterator[Any]:
    """The sentiment classifier fine-tuned from the decoder on the reviews."""
    settings = _settings(steps, 2e-3, 2, device)
    made, said = yield from _train_step(
        classifier_dir,
        force,
        steps,
        "--classifier-steps",
        tokenizer.sha256,
        lambda resume: finetune_job(
            init_from=model_dir, task="classify", data=reviews, val_data=None, output=classifier_dir, config_file=None, sets=[], options=settings, resume=resume
        ),
    )
    accuracy = _last_metric(classifier_dir, "val_accuracy")
    baseline = majority_baseline(classifier_dir)
    yield QuickstartStep(
        "classifier", made, classifier_dir, f"validation accuracy {accuracy:.1%}; always answering the most common label scores {baseline:.1%}{said}"
    )


def _train_step(run_dir: Path, force: bool, steps: int, option: str, tokenizer_sha256: str, make_job) -> Iterator[Any]:
    """Train into run_dir unless a finished run of at least `steps` steps on this tokenizer is there (a longer one
    is kept, never replaced by a shorter one); resume a run of this length that was cut short; a finished shorter
    run is trained anew. Returns (whether it trained, what to say about the run that was there)."""
    config = _existing(lambda: read_run_config(run_dir)) if run_dir.exists() else None
    training = (config.training or {}) if config is not None else {}
    done, planned = training.get("step"), (training.get("config") or {}).get("max_steps")
    said = ""
    if force or config is None or config.tokenizer_sha256 != tokenizer_sha256:
        resume = False
    elif done == planned and isinstance(done, int) and _last_metric(run_dir, "val_loss") is not None:  # finished
        if done >= steps:
            return False, "" if done == steps else f" (it trained {done} steps; {option} {steps} asks fewer: --force trains it again)"
        resume, said = False, f" (the one there trained {done} steps; {option} {steps} asks more)"
    elif planned == steps:
        resume, said = True, f" (resumed at step {done})"
    else:
        resume, said = False, f" (the one there stopped at step {done} of {planned})"
    if not resume and run_dir.exists():
        shutil.rmtree(run_dir)
    yield from train(make_job(resume))
    return True, said


def _last_metric(run_dir: Path, key: str) -> float | None:
    values = [r[key] for r in read_metrics(run_dir / METRICS_FILE) if isinstance(r.get(key), (int, float))]
    return values[-1] if values else None


def majority_baseline(run_dir: Path) -> float:
    """The accuracy of always answering the most common label of the run's validation split."""
    training = read_run_config(run_dir).training or {}
    config = training.get("config") or {}
    rows = read_labeled(Path(training["data"]), "classify", training.get("fields"))
    labels = LabeledSet([[0]] * len(rows), [str(r[1]) for r in rows], training["data"])
    _, val = split_validation(labels, config.get("val_fraction", 0.1), config.get("seed", 1337))
    return Counter(val.targets).most_common(1)[0][1] / len(val.targets)


def _existing(load):
    """The loaded artifact, or None when it is missing or unusable (then the step runs again)."""
    try:
        return load()
    except TfcliError:
        return None
