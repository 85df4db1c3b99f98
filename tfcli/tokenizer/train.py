"""Train a tokenizer with Hugging Face `tokenizers` on text read (and streamed) by tfcli: byte-pair encoding
(GPT-2 style, the default), WordPiece (BERT's), Unigram (SentencePiece's, as T5 uses) or one token per
character (nanoGPT's `shakespeare_char`).

Writes `tokenizer.json` (the HF format) and `tokenizer_config.json` (roles of the special tokens, so
`transformers.AutoTokenizer.from_pretrained(DIR)` works) atomically, and for WordPiece also BERT's
`vocab.txt`. It never prints: progress goes to a callback and the result comes back as a `TrainSummary`
for the CLI to render. What to train is `training_config.TokenizerTrainingConfig`; how each family is built,
finished and written is `families`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.corpus.documents import empty_corpus_error, iter_text_batches
from tfcli.corpus.reader import Corpus, ReadStats, split_long
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind, commit_staged, discard_staged, prepare_output_dir, stage_file
from tfcli.jsontext import dumps_json
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, WORDPIECE_PREFIX, TextTokenizer
from tfcli.tokenizer.families import (
    CharVocabulary,
    alphabet_size,
    bert_template,
    build_untrained,
    char_model,
    char_vocabulary,
    finish_unigram,
    tokenizer_config,
    wordpiece_vocab_txt,
)
from tfcli.tokenizer.specials import SpecialTokens
from tfcli.tokenizer.trainer_settings import FAMILY_NAMES, VOCAB_TXT, TokenizerTrainingConfig

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SAMPLE_CHARS = 500_000  # text kept, spread over the corpus, to measure bytes per token after training

ProgressCallback = Callable[[str, int, int], None]  # (stage, done, total)


@dataclasses.dataclass
class TrainSummary:
    path: Path
    vocab_size: int
    requested_vocab_size: int
    merges: int | None  # BPE's merge rules; the other families have none
    alphabet_size: int  # single characters (bytes for byte-level BPE) the vocabulary holds
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
    model: str = "bpe"
    characters_seen: int | None = None  # char: distinct characters in the corpus
    unknown_characters: int | None = None  # char: of those, how many the vocabulary left out (they become unk)
    unknown_occurrences: int | None = None  # char: how often they occur in the corpus
    unk_token: str | None = None
    lowercase: bool = False
    strip_accents: bool = False
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


def _count_characters(batches: Iterable[list[str]], normalize: Callable[[str], str] | None) -> Counter[str]:
    counts: Counter[str] = Counter()
    for lines in batches:
        text = "".join(lines)
        counts.update(normalize(text) if normalize else text)
    return counts


def train_tokenizer(
    corpus: Corpus,
    out_dir: Path,
    config: TokenizerTrainingConfig,
    progress: ProgressCallback | None = None,
) -> TrainSummary:
    """Train on `corpus`, write DIR/tokenizer.json and DIR/tokenizer_config.json (and DIR/vocab.txt for
    WordPiece), return a summary."""
    started = time.perf_counter()
    out_dir = _prepare_output(corpus, out_dir)
    specials = config.special_tokens
    assert specials is not None  # set in __post_init__
    tokenizer, trainer = build_untrained(config)
    stats = ReadStats()
    sample: list[str] = []
    chars = _fit(tokenizer, trainer, _line_batches(corpus, stats, sample, progress), config, specials)
    if progress:
        progress("merges", 1, 1)

    if stats.bytes_read == 0 or not sample or not any(line.strip() for line in sample):
        raise empty_corpus_error(corpus, stats)
    if config.model == "wordpiece":
        tokenizer.post_processor = bert_template(tokenizer, specials)
    if config.model == "unigram":
        finish_unigram(tokenizer, specials)
    vocabulary = _check_vocabulary(tokenizer, config, specials, chars)

    files = {TOKENIZER_FILE: vocabulary.text, TOKENIZER_CONFIG_FILE: dumps_json(tokenizer_config(config), indent=2) + "\n"}
    if config.model == "wordpiece":
        files[VOCAB_TXT] = wordpiece_vocab_txt(tokenizer)
    staged: list[tuple[Path, Path]] = []
    try:  # the tokenizer and its config are replaced together or not at all
        for name, data in files.items():
            staged.append((stage_file(out_dir / name, data), out_dir / name))
        commit_staged(staged)
    finally:
        discard_staged(staged)

    loaded = TextTokenizer.load(out_dir / TOKENIZER_FILE)
    sample_text = "".join(sample)
    sample_tokens = sum(len(ids) for ids in loaded.encode_batch(_chunks(sample_text)))
    return TrainSummary(
        path=out_dir / TOKENIZER_FILE,
        vocab_size=vocabulary.size,
        requested_vocab_size=config.vocab_size,
        merges=vocabulary.merges,
        alphabet_size=vocabulary.alphabet,
        special_tokens=specials.all_tokens(),
        pre_tokenizer=loaded.pre_tokenizer_kind,
        files=len(corpus.files),
        skipped_binary=list(corpus.skipped_binary),
        bytes_read=stats.bytes_read,
        invalid_bytes=stats.invalid_bytes,
        files_with_invalid_utf8=len(stats.files_with_invalid_utf8),
        sample_bytes=len(sample_text.encode("utf-8", errors="replace")),
        sample_tokens=sample_tokens,
        seconds=time.perf_counter() - started,
        model=config.model,
        characters_seen=chars.seen if chars else None,
        unknown_characters=chars.unknown if chars else None,
        unknown_occurrences=chars.unknown_occurrences if chars else None,
        unk_token=specials.get("unk"),
        lowercase=config.lowercase,
        strip_accents=config.accents_stripped,
        skipped_records=stats.skipped_records,
        skipped_examples=list(stats.skipped_examples),
    )


def _prepare_output(corpus: Corpus, out_dir: Path) -> Path:
    """Refuse an empty corpus and a run directory as the output, then make the output folder."""
    if corpus.total_bytes == 0 and not corpus.has_stdin:
        raise TfcliError("the corpus is empty (every file has 0 bytes)", hint="pass files that hold text")
    if artifact_kind(Path(out_dir)) == "a run directory":
        raise TfcliError(
            f"{out_dir} is a run directory; a new tokenizer there would replace the one its model was trained with",
            hint="write the tokenizer to another folder with -o",
        )
    return prepare_output_dir(out_dir, "tokenizer output")


def _fit(
    tokenizer: Tokenizer, trainer: object, batches: Iterator[list[str]], config: TokenizerTrainingConfig, specials: SpecialTokens
) -> CharVocabulary | None:
    """Read the corpus through `batches` and train the tokenizer's model on it: the family's trainer, or for
    char the characters counted here (returned, with what became unknown)."""
    if config.model == "char":
        normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer is not None else None
        chars = char_vocabulary(_count_characters(batches, normalize), config.vocab_size - len(specials.all_tokens()), config.min_frequency or 1)
        tokenizer.model = char_model(specials, chars.kept)
        tokenizer.add_special_tokens(specials.all_tokens())  # already in the vocabulary: they keep their ids
        return chars
    try:
        tokenizer.train_from_iterator(batches, trainer=trainer)
    except TfcliError:
        raise
    except Exception as exc:  # the trainer's own refusals (a Rust panic surfaces as an Exception subclass)
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = (
            "pass a larger --vocab-size: Unigram keeps every character of the corpus"
            if "contain all chars" in first_line
            else "try another --vocab-size, or more text"
        )
        raise TfcliError(f"the {config.model} trainer failed: {first_line}", hint=hint) from exc
    return None


@dataclasses.dataclass(frozen=True)
class _Vocabulary:
    """The trained tokenizer as tokenizer.json text, and what its vocabulary holds."""

    text: str
    size: int
    merges: int | None  # BPE's merge rules; the other families have none
    alphabet: int


def _check_vocabulary(tokenizer: Tokenizer, config: TokenizerTrainingConfig, specials: SpecialTokens, chars: CharVocabulary | None) -> _Vocabulary:
    """Count the trained vocabulary; refuse one larger than asked (the alphabet alone did not fit) and special
    tokens that ordinary text would also spell."""
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    n_special = len(specials.all_tokens())
    text = tokenizer.to_str(pretty=True)
    spec = json.loads(text)["model"]
    merges: int | None = None
    if config.model == "bpe":
        learned = spec["merges"]
        merges = len(learned)
        _refuse_learned_specials(specials.all_tokens(), learned)
        alphabet = vocab_size - merges - n_special
    else:
        alphabet = chars.seen - chars.unknown if chars else alphabet_size(tokenizer, specials.all_tokens())
    if vocab_size > config.vocab_size:
        tokens = alphabet
        if config.model == "wordpiece":  # a character may be there twice, as `a` and as `##a`
            tokens = sum(len(t.removeprefix(WORDPIECE_PREFIX)) == 1 for t in tokenizer.get_vocab(with_added_tokens=False))
        written = f"{alphabet} characters" + (f", {tokens} tokens with their ## forms" if tokens != alphabet else "")
        # Unigram's trainer prunes to the size asked only when that leaves room for a piece beside the characters and
        # unk; asked for exactly those, it returns every piece it kept (tokenizers 0.23)
        if config.model == "unigram":
            raise TfcliError(
                f"--vocab-size {config.vocab_size} leaves Unigram no piece beside the alphabet ({written}) and {n_special} special tokens",
                hint=f"pass --vocab-size {tokens + n_special + 1} or more",
            )
        raise TfcliError(
            f"--vocab-size {config.vocab_size} is smaller than the alphabet ({written}) plus {n_special} special tokens",
            hint=f"pass --vocab-size {tokens + n_special} or more, or cap the alphabet with --limit-alphabet",
        )
    _refuse_specials_in_the_vocabulary(tokenizer, specials.all_tokens(), specials.get("unk"), config.model)
    return _Vocabulary(text, vocab_size, merges, alphabet)


def _refuse_learned_specials(specials: list[str], merges: list) -> None:
    """A special token spelled like a token BPE learned would share its id, and that id would then be
    skipped when decoding ordinary text."""
    learned = {"".join(m) if isinstance(m, list) else m.replace(" ", "") for m in merges}
    for token in specials:
        if token in learned:
            raise TfcliError(
                f"special token {token!r} is also a token BPE learned from the corpus", hint="give it a spelling the text does not contain, e.g. <|sep|>"
            )


def _refuse_specials_in_the_vocabulary(tokenizer: Tokenizer, specials: list[str], unk: str | None, model: str) -> None:
    """The same for every family: the text of a special token, encoded as ordinary text, must not come out
    as a special id (a WordPiece special token spelled like a word, `EOS`, would)."""
    special_ids = {tokenizer.token_to_id(token) for token in specials} - {tokenizer.token_to_id(unk)}  # text may be unknown
    previous = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        for token in specials:
            if special_ids & set(tokenizer.encode(token, add_special_tokens=False).ids):
                raise TfcliError(
                    f"special token {token!r} would also be read from ordinary text spelled the same: the {FAMILY_NAMES[model]} vocabulary holds it as a word",
                    hint="give it a spelling that text does not contain, e.g. <|sep|>",
                )
    finally:
        tokenizer.encode_special_tokens = previous


def _chunks(text: str, size: int = 1 << 16) -> list[str]:
    return split_long(text, size) if text else []
