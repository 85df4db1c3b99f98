"""`train pretrain --data TEXT`: from a text file, a folder or JSON lines to shards in one command. A byte-level
BPE tokenizer sized to the corpus and the shards it encodes are made inside the run directory (RUN/data/), so
the run carries what it was trained on; the training defaults are the quickstart's, which are measured on text
of this size (docs/tutorials/own-text.md)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfcli.corpus.reader import resolve_corpus
from tfcli.data.shards import encode_corpus, load_shard_meta
from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig
from tfcli.train.command_line import parse_sets, read_toml
from tfcli.training_config import EARLY_STOP_DEFAULT

MIN_TEXT_BYTES = 4096  # below this no tokenizer, validation split and batch are worth making
DATA_DIR = "data"  # inside the run directory: tokenizer/ and shards/
VAL_FRACTION = 0.1
# A vocabulary the corpus can fill: about OCCURRENCES tokens of text per entry, guessing BYTES_PER_TOKEN
# (byte-level BPE on English); a power of two between the bounds. Below ~1.5 MB the floor applies: BPE learns
# only merges the text repeats, and 4,096 asked beat 512-2,048 on every small text measured (own-text tutorial).
BYTES_PER_TOKEN = 4
OCCURRENCES = 64
MIN_VOCAB, MAX_VOCAB = 4096, 8192
# What the quickstart trains (the `tiny` preset): measured on 100 KB to 100 MB of text (the tutorial's table).
# A small text overfits a fast machine's long run: it stops once EARLY_STOP_DEFAULT (5) evaluations in a row find
# no lower validation loss, as any --time-budget run does.
TEXT_DEFAULTS: dict[str, Any] = {"batch_size": 32, "lr": 3e-3, "max_steps": 400, "eval_every": 100, "save_every": 200, "early_stop": EARLY_STOP_DEFAULT}
# The recipe where --recipe is not given: at equal wall time on this path's model, modern's validation bits per byte
# were lower than classic's on both texts `tfcli bench recipe` trains on (docs/benchmarks.md#training-recipes).
TEXT_RECIPE = "modern"


@dataclasses.dataclass(frozen=True)
class TextStep:
    """One line for the command to print while the data is made."""

    name: str
    detail: str


def is_shard_folder(path: Path) -> bool:
    return (Path(path) / "meta.json").is_file()


def vocab_for(corpus_bytes: int) -> tuple[int, str]:
    """The vocabulary size for a corpus of this many bytes, and why.
    Example: 500,000 bytes -> 4,096 (the floor); 2,000,000 bytes -> 8,192 (about 500,000 tokens, 61 per entry)."""
    wanted = corpus_bytes / (BYTES_PER_TOKEN * OCCURRENCES)
    size = int(min(MAX_VOCAB, max(MIN_VOCAB, 2 ** round(math.log2(max(wanted, 1))))))
    tokens = corpus_bytes // BYTES_PER_TOKEN
    if size == MAX_VOCAB and wanted > MAX_VOCAB:
        why = f"the most for the small presets (the corpus could fill {int(wanted):,})"
    elif size == MIN_VOCAB and wanted < MIN_VOCAB:
        why = "the floor for small texts, where BPE learns only the merges the text repeats"
    else:
        why = f"about {OCCURRENCES} tokens of text for each entry"
    return size, f"{size:,} tokens asked: {corpus_bytes:,} bytes are about {tokens:,} tokens at {BYTES_PER_TOKEN} bytes a token; {why}"


def prepare_text_data(data: Path, run_dir: Path, *, field: str = "text", resume: bool = False) -> Iterator[TextStep]:
    """Make RUN/data/tokenizer and RUN/data/shards from the text at `data` (kept when --resume finds them);
    returns the shard folder."""
    tokenizer_dir, shard_dir = run_dir / DATA_DIR / "tokenizer", run_dir / DATA_DIR / "shards"
    if resume and is_shard_folder(shard_dir) and (tokenizer_dir / TOKENIZER_FILE).is_file():
        meta = load_shard_meta(shard_dir)
        _refuse_other_text(data, field, meta.sources, run_dir)
        yield TextStep("data", f"{shard_dir}: {meta.train_tokens:,} train / {meta.val_tokens:,} val tokens, kept")
        return shard_dir
    corpus = resolve_corpus([data], field=field)
    if corpus.has_stdin:
        raise TfcliError("train pretrain --data reads files, not standard input", hint="save the text to a file first")
    if corpus.total_bytes < MIN_TEXT_BYTES:
        raise TfcliError(
            f"{data} holds {corpus.total_bytes:,} bytes of text, too little to train on (at least {MIN_TEXT_BYTES:,})",
            hint="pass more text, or token shards made with tokenize encode",
        )
    vocab, why = vocab_for(corpus.total_bytes)
    summary = train_tokenizer(corpus, tokenizer_dir, TokenizerTrainingConfig(vocab_size=vocab))
    learned = "" if summary.vocab_size == vocab else f"; it learned {summary.vocab_size:,} (the text has no more pairs seen twice)"
    yield TextStep("tokenizer", f"{tokenizer_dir}: byte-level BPE, {why}{learned}; {summary.bytes_per_token:.2f} bytes per token")
    tokenizer = TextTokenizer.load(tokenizer_dir / TOKENIZER_FILE)
    meta = encode_corpus(corpus, tokenizer, shard_dir, val_fraction=VAL_FRACTION)
    if meta.val_tokens == 0:
        raise TfcliError(f"{data} is too short to hold out a validation split", hint="train on more text, or encode it yourself with tokenize encode")
    yield TextStep("shards", f"{shard_dir}: {meta.train_tokens:,} train / {meta.val_tokens:,} val tokens")
    return shard_dir


def _refuse_other_text(data: Path, field: str, sources: list, run_dir: Path) -> None:
    """A resumed run goes on with the shards it made: other text given to --resume (another file, or the file
    grown or cut since) would not be trained on, so it is refused rather than ignored."""
    given = sorted((Path(f.path).name, f.size) for f in resolve_corpus([data], field=field).files)
    if given != sorted((Path(source.path).name, source.bytes) for source in sources):
        made = ", ".join(f"{source.path} ({source.bytes:,} bytes)" for source in sources)
        raise TfcliError(
            f"cannot resume: {run_dir} trains on the text it encoded from {made}, not on {data} as it is now",
            hint="resume with that --data; to train on other text, start a new run with another -o",
        )


def text_defaults(given: dict[str, Any], config_file: Path | None, sets: list[str]) -> dict[str, Any]:
    """TEXT_DEFAULTS under what the command line, --set and the config file say: the options to add."""
    said = set(given)
    for key in [*(read_toml(config_file) if config_file is not None else {}), *parse_sets(sets)]:
        said.add(key.removeprefix("train."))
    if "time_budget" in said:
        said.add("max_steps")
    return {key: value for key, value in TEXT_DEFAULTS.items() if key not in said}
