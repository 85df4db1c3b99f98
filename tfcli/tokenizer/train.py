"""Train a BPE tokenizer with Hugging Face `tokenizers` on text read (and streamed) by tfcli.

Writes `tokenizer.json` (the HF format) and `tokenizer_config.json` (roles of the special tokens, so
`transformers.AutoTokenizer.from_pretrained(DIR)` works) atomically. It never prints: progress goes to
a callback and the result comes back as a `TrainSummary` for the CLI to render.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tfcli.data.corpus import Corpus, ReadStats, empty_corpus_error, iter_text_batches, split_long
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind, atomic_write_json, atomic_write_text, prepare_output_dir
from tfcli.tokenizer.core import MAX_VOCAB_SIZE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer
from tfcli.tokenizer.specials import CONFIG_KEYS, DEFAULT_SPECIALS, ROLES, SpecialTokens

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PreTokenizerKind = Literal["byte-level", "whitespace", "metaspace"]
PRE_TOKENIZERS: tuple[str, ...] = ("byte-level", "whitespace", "metaspace")
BYTE_ALPHABET_SIZE = 256
SAMPLE_CHARS = 500_000  # text kept, spread over the corpus, to measure bytes per token after training
END_OF_WORD = "</w>"

ProgressCallback = Callable[[str, int, int], None]  # (stage, done, total)


@dataclasses.dataclass(frozen=True)
class TokenizerTrainingConfig:
    vocab_size: int = 8192
    min_frequency: int = 2
    special_tokens: SpecialTokens = dataclasses.field(default_factory=lambda: SpecialTokens(roles=dict(DEFAULT_SPECIALS)))
    pre_tokenizer: PreTokenizerKind = "byte-level"
    lowercase: bool = False
    limit_alphabet: int | None = None
    model_max_length: int = 1024

    def __post_init__(self) -> None:
        n_special = len(self.special_tokens.all_tokens())
        if self.pre_tokenizer not in PRE_TOKENIZERS:
            raise TfcliError(f"unknown pre-tokenizer {self.pre_tokenizer!r}", hint=f"use one of {', '.join(PRE_TOKENIZERS)}")
        if self.vocab_size > MAX_VOCAB_SIZE:
            raise TfcliError(f"--vocab-size {self.vocab_size:,} is absurd (the limit is {MAX_VOCAB_SIZE:,})", hint="real vocabularies hold 1k to 256k tokens")
        if self.pre_tokenizer == "byte-level":
            floor = BYTE_ALPHABET_SIZE + n_special
            if self.vocab_size < floor:
                raise TfcliError(
                    f"--vocab-size {self.vocab_size} is smaller than the byte alphabet ({BYTE_ALPHABET_SIZE}) plus {n_special} special tokens",
                    hint=f"pass --vocab-size {floor} or more",
                )
            if self.limit_alphabet is not None:
                raise TfcliError("--limit-alphabet does not apply to the byte-level pre-tokenizer (its alphabet is the 256 bytes)", hint="drop it, or use --pre-tokenizer whitespace or metaspace")
        elif self.vocab_size < n_special + 1:
            raise TfcliError(f"--vocab-size {self.vocab_size} leaves no room beside {n_special} special tokens", hint="pass a larger --vocab-size")
        if self.min_frequency < 1:
            raise TfcliError(f"--min-frequency must be at least 1, not {self.min_frequency}")
        if self.limit_alphabet is not None and self.limit_alphabet < 1:
            raise TfcliError(f"--limit-alphabet must be at least 1, not {self.limit_alphabet}")
        if self.model_max_length < 1:
            raise TfcliError(f"--max-length must be at least 1, not {self.model_max_length}")


@dataclasses.dataclass
class TrainSummary:
    path: Path
    vocab_size: int
    requested_vocab_size: int
    merges: int
    alphabet_size: int
    special_tokens: list[str]
    pre_tokenizer: str
    files: int
    skipped_binary: list[Path]
    bytes_read: int
    invalid_bytes: int
    files_with_invalid_utf8: int
    sample_bytes: int
    sample_tokens: int
    seconds: float
    skipped_records: int = 0  # records of JSON lines, CSV or Parquet without a string in the text field
    skipped_examples: list[str] = dataclasses.field(default_factory=list)

    @property
    def bytes_per_token(self) -> float:
        return self.sample_bytes / self.sample_tokens if self.sample_tokens else 0.0

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["path"] = str(self.path)
        data["skipped_binary"] = [str(p) for p in self.skipped_binary]
        data["bytes_per_token"] = round(self.bytes_per_token, 4)
        return data


def build_untrained(config: TokenizerTrainingConfig) -> tuple[Tokenizer, object]:
    """An empty BPE tokenizer with the chosen normalizer, pre-tokenizer and decoder, and its trainer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = config.special_tokens
    unk = specials.get("unk")
    trainer_options: dict = {
        "vocab_size": config.vocab_size,
        "min_frequency": config.min_frequency,
        "special_tokens": specials.all_tokens(),
        "show_progress": False,
    }
    if config.limit_alphabet is not None:
        trainer_options["limit_alphabet"] = config.limit_alphabet
    if config.pre_tokenizer == "byte-level":
        tokenizer = Tokenizer(models.BPE(unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer_options["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    elif config.pre_tokenizer == "whitespace":
        # Sennrich's original BPE: a word-final marker, so decoding knows where the spaces were.
        tokenizer = Tokenizer(models.BPE(unk_token=unk, end_of_word_suffix=END_OF_WORD))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.decoder = decoders.BPEDecoder(suffix=END_OF_WORD)
        trainer_options["end_of_word_suffix"] = END_OF_WORD
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    if config.lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    return tokenizer, trainers.BpeTrainer(**trainer_options)


def _line_batches(corpus: Corpus, stats: ReadStats, sample: list[str], progress: ProgressCallback | None) -> Iterator[list[str]]:
    """Batches of lines or record texts (a read block each) for the trainer; keeps an evenly spread sample
    of them (standard input, of unknown size, is sampled from its start)."""
    total = corpus.total_bytes
    fraction = min(1.0, SAMPLE_CHARS / max(total, 1))
    kept = 0
    for lines in iter_text_batches(corpus, stats):
        if kept < SAMPLE_CHARS:
            picked = lines[: math.ceil(len(lines) * fraction)]
            sample.extend(picked)
            if corpus.has_stdin:
                kept += sum(map(len, picked))
        yield lines
        if progress:
            progress("read", stats.bytes_read, total)
    if progress:  # the corpus is read; the trainer now computes the merges
        progress("merges", 0, 1)


def train_tokenizer(
    corpus: Corpus,
    out_dir: Path,
    config: TokenizerTrainingConfig,
    progress: ProgressCallback | None = None,
) -> TrainSummary:
    """Train on `corpus`, write DIR/tokenizer.json and DIR/tokenizer_config.json, return a summary."""
    started = time.perf_counter()
    if corpus.total_bytes == 0 and not corpus.has_stdin:
        raise TfcliError("the corpus is empty (every file has 0 bytes)", hint="pass files that hold text")
    if artifact_kind(Path(out_dir)) == "a run directory":
        raise TfcliError(f"{out_dir} is a run directory; a new tokenizer there would replace the one its model was trained with",
                         hint="write the tokenizer to another folder with -o")
    out_dir = prepare_output_dir(out_dir, "tokenizer output")
    tokenizer, trainer = build_untrained(config)
    stats = ReadStats()
    sample: list[str] = []
    tokenizer.train_from_iterator(_line_batches(corpus, stats, sample, progress), trainer=trainer)
    if progress:
        progress("merges", 1, 1)

    if stats.bytes_read == 0 or not sample or not any(line.strip() for line in sample):
        raise empty_corpus_error(corpus, stats)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    n_special = len(config.special_tokens.all_tokens())
    text = tokenizer.to_str(pretty=True)
    learned = json.loads(text)["model"]["merges"]
    merges = len(learned)
    _refuse_learned_specials(config.special_tokens.all_tokens(), learned)
    alphabet = vocab_size - merges - n_special
    if vocab_size > config.vocab_size:
        raise TfcliError(
            f"--vocab-size {config.vocab_size} is smaller than the alphabet ({alphabet} characters) plus {n_special} special tokens",
            hint=f"pass --vocab-size {alphabet + n_special} or more, or cap the alphabet with --limit-alphabet",
        )

    atomic_write_text(out_dir / TOKENIZER_FILE, text)
    atomic_write_json(out_dir / TOKENIZER_CONFIG_FILE, tokenizer_config(config))

    loaded = TextTokenizer.load(out_dir / TOKENIZER_FILE)
    sample_text = "".join(sample)
    sample_tokens = sum(len(ids) for ids in loaded.encode_batch(_chunks(sample_text)))
    return TrainSummary(
        path=out_dir / TOKENIZER_FILE,
        vocab_size=vocab_size,
        requested_vocab_size=config.vocab_size,
        merges=merges,
        alphabet_size=alphabet,
        special_tokens=config.special_tokens.all_tokens(),
        pre_tokenizer=config.pre_tokenizer,
        files=len(corpus.files),
        skipped_binary=list(corpus.skipped_binary),
        bytes_read=stats.bytes_read,
        invalid_bytes=stats.invalid_bytes,
        files_with_invalid_utf8=len(stats.files_with_invalid_utf8),
        sample_bytes=len(sample_text.encode("utf-8", errors="replace")),
        sample_tokens=sample_tokens,
        seconds=time.perf_counter() - started,
        skipped_records=stats.skipped_records,
        skipped_examples=list(stats.skipped_examples),
    )


def _refuse_learned_specials(specials: list[str], merges: list) -> None:
    """A special token spelled like a token BPE learned would share its id, and that id would then be
    skipped when decoding ordinary text."""
    learned = {"".join(m) if isinstance(m, list) else m.replace(" ", "") for m in merges}
    for token in specials:
        if token in learned:
            raise TfcliError(f"special token {token!r} is also a token BPE learned from the corpus",
                             hint="give it a spelling the text does not contain, e.g. <|sep|>")


def _chunks(text: str, size: int = 1 << 16) -> list[str]:
    return split_long(text, size) if text else []


def tokenizer_config(config: TokenizerTrainingConfig) -> dict:
    """The tokenizer_config.json transformers reads: class, special tokens by role, max length.

    `split_special_tokens` makes transformers, like tfcli, encode special-token text in user input as text.
    """
    data: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for role in ROLES:
        token = config.special_tokens.get(role)
        if token is not None:
            data[CONFIG_KEYS[role]] = token
    if config.special_tokens.extra:
        data["additional_special_tokens"] = list(config.special_tokens.extra)
    data["model_max_length"] = config.model_max_length
    data["split_special_tokens"] = True
    data["clean_up_tokenization_spaces"] = False
    return data
