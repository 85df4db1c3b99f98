"""`tfcli quickstart`: the whole chain that exists so far, on sample_data/, into one folder.

Each step is skipped when its output is already there and consistent (so a second run is instant),
unless `force` is set. It yields one `QuickstartStep` per step; the CLI renders them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from tfcli.errors import TfcliError

QUICKSTART_VOCAB_SIZE = 2048
QUICKSTART_VAL_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class QuickstartStep:
    name: str
    made: bool  # False: an existing, consistent output was kept
    path: Path
    detail: str


def find_sample_data(explicit: Path | None = None) -> Path:
    """--data if given; else ./sample_data; else the sample_data/ of the source tree tfcli runs from."""
    candidates = [explicit] if explicit is not None else [Path("sample_data"), Path(__file__).resolve().parents[1] / "sample_data"]
    for folder in candidates:
        if folder is not None and (folder / "corpus").is_dir():
            return folder
    where = explicit if explicit is not None else Path("sample_data")
    raise TfcliError(f"{where} has no corpus/ folder", hint="run from the tfcli source tree, or pass --data pointing at sample_data/")


def run_quickstart(data_dir: Path, out_dir: Path, force: bool = False) -> Iterator[QuickstartStep]:
    from tfcli.data.corpus import resolve_corpus
    from tfcli.data.shards import encode_corpus, load_shard_meta
    from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer
    from tfcli.tokenizer.train import TokenizerTrainingConfig, train_tokenizer

    corpus = resolve_corpus([data_dir / "corpus"])
    tokenizer_dir = out_dir / "tokenizer"
    tokenizer = _existing(lambda: TextTokenizer.load(tokenizer_dir / TOKENIZER_FILE)) if not force else None
    if tokenizer is None:
        summary = train_tokenizer(corpus, tokenizer_dir, TokenizerTrainingConfig(vocab_size=QUICKSTART_VOCAB_SIZE))
        tokenizer = TextTokenizer.load(tokenizer_dir / TOKENIZER_FILE)
        yield QuickstartStep("tokenizer", True, tokenizer_dir, f"{summary.vocab_size:,} tokens, {summary.bytes_per_token:.2f} bytes per token")
    else:
        yield QuickstartStep("tokenizer", False, tokenizer_dir, f"{tokenizer.vocab_size:,} tokens")

    shard_dir = out_dir / "shards"
    meta = _existing(lambda: load_shard_meta(shard_dir)) if not force else None
    if meta is not None and meta.tokenizer_sha256 == tokenizer.sha256:
        yield QuickstartStep("shards", False, shard_dir, f"{meta.train_tokens:,} train / {meta.val_tokens:,} val tokens")
    else:
        meta = encode_corpus(corpus, tokenizer, shard_dir, val_fraction=QUICKSTART_VAL_FRACTION)
        yield QuickstartStep("shards", True, shard_dir, f"{meta.train_tokens:,} train / {meta.val_tokens:,} val tokens")


def _existing(load):
    """The loaded artifact, or None when it is missing or unusable (then the step runs again)."""
    try:
        return load()
    except TfcliError:
        return None
