"""Train a tokenizer with Hugging Face `tokenizers` on text read (and streamed) by tfcli: byte-pair encoding
(GPT-2 style, the default), WordPiece (BERT's), Unigram (SentencePiece's, as T5 uses) or one token per
character (nanoGPT's `shakespeare_char`).

Writes `tokenizer.json` (the HF format) and `tokenizer_config.json` (roles of the special tokens, so
`transformers.AutoTokenizer.from_pretrained(DIR)` works) atomically, and for WordPiece also BERT's
`vocab.txt`. It never prints: progress goes to a callback and the result comes back as a `TrainSummary`
for the CLI to render.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tfcli.corpus.reader import Corpus, ReadStats, empty_corpus_error, iter_text_batches, split_long
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind, commit_staged, discard_staged, prepare_output_dir, stage_file
from tfcli.jsontext import dumps_json
from tfcli.tokenizer.core import MAX_VOCAB_SIZE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, WORDPIECE_PREFIX, TextTokenizer
from tfcli.tokenizer.specials import CONFIG_KEYS, ROLES, SpecialTokens, default_specials

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ModelKind = Literal["bpe", "wordpiece", "unigram", "char"]
MODELS: tuple[str, ...] = ("bpe", "wordpiece", "unigram", "char")
PreTokenizerKind = Literal["byte-level", "whitespace", "metaspace"]
PRE_TOKENIZERS: tuple[str, ...] = ("byte-level", "whitespace", "metaspace")
BYTE_ALPHABET_SIZE = 256
SAMPLE_CHARS = 500_000  # text kept, spread over the corpus, to measure bytes per token after training
END_OF_WORD = "</w>"
METASPACE = "\u2581"
VOCAB_TXT = "vocab.txt"  # BERT's vocabulary file: one token per line, the line number is the id
FAMILY_NAMES = {"bpe": "BPE", "wordpiece": "WordPiece", "unigram": "Unigram", "char": "character"}

ProgressCallback = Callable[[str, int, int], None]  # (stage, done, total)


@dataclasses.dataclass(frozen=True)
class TokenizerTrainingConfig:
    """What to train. Options left as None take the family's default: `pre_tokenizer` byte-level (BPE only),
    `min_frequency` 2 (BPE, WordPiece) or 1 (char: every character seen), `special_tokens` BERT's for
    WordPiece and tfcli's for the others, `strip_accents` following `lowercase` (WordPiece only, as BERT's
    normalizer does). An option that does not apply to the family is an error, not ignored."""

    vocab_size: int = 8192  # for char: a cap; rarer characters become the unk token
    min_frequency: int | None = None
    special_tokens: SpecialTokens | None = None
    pre_tokenizer: PreTokenizerKind | None = None
    lowercase: bool = False
    limit_alphabet: int | None = None
    model_max_length: int = 1024
    model: ModelKind = "bpe"
    strip_accents: bool | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise TfcliError(f"unknown --model {self.model!r}", hint=f"use one of {', '.join(MODELS)}")
        self._refuse_options_that_do_not_apply()
        if self.pre_tokenizer is None and self.model == "bpe":
            object.__setattr__(self, "pre_tokenizer", "byte-level")
        if self.min_frequency is None and self.model != "unigram":
            object.__setattr__(self, "min_frequency", 1 if self.model == "char" else 2)
        if self.special_tokens is None:
            object.__setattr__(self, "special_tokens", SpecialTokens(roles=default_specials(self.model)))
        n_special = len(self.special_tokens.all_tokens())
        if self.pre_tokenizer is not None and self.pre_tokenizer not in PRE_TOKENIZERS:
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
                raise TfcliError(
                    "--limit-alphabet does not apply to the byte-level pre-tokenizer (its alphabet is the 256 bytes)",
                    hint="drop it, or use --pre-tokenizer whitespace or metaspace",
                )
        elif self.vocab_size < n_special + 1:
            room = "for a character " if self.model == "char" else ""
            raise TfcliError(
                f"--vocab-size {self.vocab_size} leaves no room {room}beside {n_special} special tokens", hint=f"pass --vocab-size {n_special + 1} or more"
            )
        if self.min_frequency is not None and self.min_frequency < 1:
            raise TfcliError(f"--min-frequency must be at least 1, not {self.min_frequency}")
        if self.limit_alphabet is not None and self.limit_alphabet < 1:
            raise TfcliError(f"--limit-alphabet must be at least 1, not {self.limit_alphabet}")
        if self.model_max_length < 1:
            raise TfcliError(f"--max-length must be at least 1, not {self.model_max_length}")
        if self.model == "wordpiece":
            for token in self.special_tokens.all_tokens():
                if any(ch in token for ch in "\n\r"):
                    raise TfcliError(
                        f"special token {token!r} holds a line break, which {VOCAB_TXT} (one token per line) cannot hold", hint="spell it on one line"
                    )
            for role in ("cls", "eos"):  # they are named in the post-processor's template, "[CLS]:0 $A:0 [SEP]:0"
                token = self.special_tokens.get(role)
                if token and (token.startswith("$") or ":" in token or any(ch.isspace() for ch in token)):
                    raise TfcliError(
                        f"special token {token!r} ({role}) holds a space or ':' or starts with '$', which BERT's [CLS] A [SEP] template cannot name",
                        hint=f"spell it without them, e.g. {role}={default_specials('wordpiece')[role]}",
                    )

    def _refuse_options_that_do_not_apply(self) -> None:
        """Options another family has: a clear error rather than a silent no-op."""
        model = self.model
        if self.pre_tokenizer is not None and model != "bpe":
            how = {
                "wordpiece": "splits words at spaces and punctuation, as BERT does",
                "unigram": "uses metaspace (\u2581 before each word)",
                "char": "takes every character as it is",
            }[model]
            raise TfcliError(f"--pre-tokenizer applies to --model bpe only; {model} {how}", hint="drop --pre-tokenizer")
        if self.min_frequency is not None and model == "unigram":
            raise TfcliError(
                "--min-frequency does not apply to --model unigram (it keeps the pieces that best explain the corpus)",
                hint="drop --min-frequency; --vocab-size sets how many pieces it keeps",
            )
        if self.limit_alphabet is not None and model in ("unigram", "char"):
            hint = "--vocab-size caps the characters, the rarest becoming the unk token" if model == "char" else "drop --limit-alphabet"
            raise TfcliError(f"--limit-alphabet does not apply to --model {model}", hint=hint)
        if self.strip_accents is not None and model != "wordpiece":
            raise TfcliError(f"--strip-accents / --keep-accents apply to --model wordpiece (BERT's normalizer), not {model}", hint="drop the option")

    @property
    def accents_stripped(self) -> bool:
        """WordPiece strips accents when asked, else when it lowercases (BERT's rule); the others never do."""
        if self.model != "wordpiece":
            return False
        return self.lowercase if self.strip_accents is None else self.strip_accents


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


def _normalizer(config: TokenizerTrainingConfig):
    from tokenizers import normalizers

    if config.model == "wordpiece":  # BERT's: control characters dropped, CJK characters spaced, then case and accents
        return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=config.accents_stripped, lowercase=config.lowercase)
    return normalizers.Lowercase() if config.lowercase else None


def build_untrained(config: TokenizerTrainingConfig) -> tuple[Tokenizer, object]:
    """An empty tokenizer of the chosen family, with its normalizer, pre-tokenizer and decoder, and its
    trainer (None for char, whose vocabulary `train_tokenizer` counts itself)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = config.special_tokens
    assert specials is not None  # set in __post_init__
    unk = specials.get("unk")
    trainer_options: dict = {
        "vocab_size": config.vocab_size,
        "special_tokens": specials.all_tokens(),
        "show_progress": False,
    }
    if config.model in ("bpe", "wordpiece"):
        trainer_options["min_frequency"] = config.min_frequency
    if config.limit_alphabet is not None:
        trainer_options["limit_alphabet"] = config.limit_alphabet
    trainer: object = None
    if config.model == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=unk, continuing_subword_prefix=WORDPIECE_PREFIX))
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix=WORDPIECE_PREFIX, cleanup=True)
        trainer = trainers.WordPieceTrainer(continuing_subword_prefix=WORDPIECE_PREFIX, **trainer_options)
    elif config.model == "unigram":
        # Only unk is a piece of the model (Unigram needs one); the other special tokens are added after the
        # pieces by `_finish_unigram`, so the model can never spell them from text.
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
        trainer_options["special_tokens"] = [unk]
        trainer_options["vocab_size"] = config.vocab_size - (len(specials.all_tokens()) - 1)
        trainer = trainers.UnigramTrainer(unk_token=unk, **trainer_options)
    elif config.model == "char":
        tokenizer = Tokenizer(models.WordLevel({}, unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
        tokenizer.decoder = decoders.Fuse()  # characters joined as they are
    elif config.pre_tokenizer == "byte-level":
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
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    if config.model == "bpe":
        trainer = trainers.BpeTrainer(**trainer_options)
    normalizer = _normalizer(config)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    return tokenizer, trainer


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


@dataclasses.dataclass(frozen=True)
class CharVocabulary:
    """The characters a char tokenizer keeps, and what it leaves to the unk token."""

    kept: list[str]  # in code-point order, as nanoGPT's shakespeare_char numbers them
    seen: int
    unknown: int
    unknown_occurrences: int


def char_vocabulary(counts: Counter[str], cap: int, min_frequency: int = 1) -> CharVocabulary:
    """The `cap` most frequent characters seen at least `min_frequency` times (a tie goes to the lower code
    point), in code-point order.

    Example: Counter("abracadabra"), cap=3 -> kept ["a", "b", "r"], seen 5, unknown 2 ("c", "d"), 2 occurrences
    """
    frequent = sorted((ch for ch, n in counts.items() if n >= min_frequency), key=lambda ch: (-counts[ch], ch))[:cap]
    kept = sorted(frequent)
    left_out = set(counts) - set(kept)
    return CharVocabulary(kept=kept, seen=len(counts), unknown=len(left_out), unknown_occurrences=sum(counts[ch] for ch in left_out))


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
    if corpus.total_bytes == 0 and not corpus.has_stdin:
        raise TfcliError("the corpus is empty (every file has 0 bytes)", hint="pass files that hold text")
    if artifact_kind(Path(out_dir)) == "a run directory":
        raise TfcliError(
            f"{out_dir} is a run directory; a new tokenizer there would replace the one its model was trained with",
            hint="write the tokenizer to another folder with -o",
        )
    out_dir = prepare_output_dir(out_dir, "tokenizer output")
    specials = config.special_tokens
    assert specials is not None  # set in __post_init__
    tokenizer, trainer = build_untrained(config)
    stats = ReadStats()
    sample: list[str] = []
    batches = _line_batches(corpus, stats, sample, progress)
    chars: CharVocabulary | None = None
    if config.model == "char":
        normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer is not None else None
        chars = char_vocabulary(_count_characters(batches, normalize), config.vocab_size - len(specials.all_tokens()), config.min_frequency or 1)
        tokenizer.model = _char_model(specials, chars.kept)
        tokenizer.add_special_tokens(specials.all_tokens())  # already in the vocabulary: they keep their ids
    else:
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
    if progress:
        progress("merges", 1, 1)

    if stats.bytes_read == 0 or not sample or not any(line.strip() for line in sample):
        raise empty_corpus_error(corpus, stats)
    if config.model == "wordpiece":
        tokenizer.post_processor = _bert_template(tokenizer, specials)
    if config.model == "unigram":
        _finish_unigram(tokenizer, specials)
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
        alphabet = chars.seen - chars.unknown if chars else _alphabet_size(tokenizer, specials.all_tokens())
    if vocab_size > config.vocab_size:
        tokens = alphabet
        if config.model == "wordpiece":  # a character may be there twice, as `a` and as `##a`
            tokens = sum(len(t.removeprefix(WORDPIECE_PREFIX)) == 1 for t in tokenizer.get_vocab(with_added_tokens=False))
        written = f"{alphabet} characters" + (f", {tokens} tokens with their ## forms" if tokens != alphabet else "")
        raise TfcliError(
            f"--vocab-size {config.vocab_size} is smaller than the alphabet ({written}) plus {n_special} special tokens",
            hint=f"pass --vocab-size {tokens + n_special} or more, or cap the alphabet with --limit-alphabet",
        )
    _refuse_specials_in_the_vocabulary(tokenizer, specials.all_tokens(), specials.get("unk"), config.model)

    files = {TOKENIZER_FILE: text, TOKENIZER_CONFIG_FILE: dumps_json(tokenizer_config(config), indent=2) + "\n"}
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
        vocab_size=vocab_size,
        requested_vocab_size=config.vocab_size,
        merges=merges,
        alphabet_size=alphabet,
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


def _char_model(specials: SpecialTokens, kept: list[str]):
    """The char vocabulary as a `WordLevel` model: the special tokens first, then the characters."""
    from tokenizers import models

    vocab = {token: i for i, token in enumerate(specials.all_tokens())}
    for ch in kept:
        vocab[ch] = len(vocab)
    return models.WordLevel(vocab, unk_token=specials.get("unk"))


def _finish_unigram(tokenizer: Tokenizer, specials: SpecialTokens) -> None:
    """Make the trained Unigram model safe for special tokens. The trainer scores every special token 0.0
    (probability 1), so the best segmentation of ordinary text spelled `<|unk|>` would be the unk piece; its
    score becomes lower than any spelling of it by known characters (each piece scores at least the lowest
    score). The other special tokens are added after the pieces, outside the model, so text never becomes them.
    """
    from tokenizers import models

    spec = json.loads(tokenizer.to_str())["model"]
    pieces = [(piece, score) for piece, score in spec["vocab"]]
    unk_id = spec["unk_id"]
    lowest = min((score for i, (_, score) in enumerate(pieces) if i != unk_id), default=0.0)
    pieces[unk_id] = (pieces[unk_id][0], len(pieces[unk_id][0]) * lowest - 10.0)
    tokenizer.model = models.Unigram(pieces, unk_id=unk_id, byte_fallback=False)
    unk = specials.get("unk")
    tokenizer.add_special_tokens([token for token in specials.all_tokens() if token != unk])


def _bert_template(tokenizer: Tokenizer, specials: SpecialTokens):
    """BERT's post-processor: `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]` when transformers adds special tokens
    (tfcli itself never asks it to: it inserts special ids itself)."""
    from tokenizers import processors

    cls, sep = specials.get("cls"), specials.get("eos")
    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )


def _alphabet_size(tokenizer: Tokenizer, specials: list[str]) -> int:
    """Distinct single characters in the vocabulary (WordPiece's `a` and `##a` count once, Unigram's `▁` counts)."""
    special = set(specials)
    pieces = (token.removeprefix(WORDPIECE_PREFIX) for token in tokenizer.get_vocab(with_added_tokens=False) if token not in special)
    return len({piece for piece in pieces if len(piece) == 1})


def wordpiece_vocab_txt(tokenizer: Tokenizer) -> str:
    """BERT's vocab.txt: every token, one a line, in id order. Example: {"[PAD]": 0, "a": 1} -> "[PAD]\na\n"."""
    by_id = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    assert [i for _, i in by_id] == list(range(len(by_id))), "a WordPiece vocabulary has no gaps"
    return "".join(token + "\n" for token, _ in by_id)


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


def tokenizer_config(config: TokenizerTrainingConfig) -> dict:
    """The tokenizer_config.json transformers reads: class, special tokens by role, max length; for
    WordPiece, BertTokenizerFast and its normalizer settings (transformers rebuilds the normalizer from them).

    `split_special_tokens` makes transformers, like tfcli, encode special-token text in user input as text.
    """
    specials = config.special_tokens
    assert specials is not None
    wordpiece = config.model == "wordpiece"
    data: dict = {"tokenizer_class": "BertTokenizerFast" if wordpiece else "PreTrainedTokenizerFast"}
    for role in ROLES:
        token = specials.get(role)
        if token is not None:
            data[CONFIG_KEYS[role]] = token
    if wordpiece:
        data["sep_token"] = specials.get("eos")  # BERT's separator plays tfcli's end-of-text role
        data["do_lower_case"] = config.lowercase
        data["strip_accents"] = config.accents_stripped
        data["tokenize_chinese_chars"] = True
    if specials.extra:
        data["additional_special_tokens"] = list(specials.extra)
    data["model_max_length"] = config.model_max_length
    data["split_special_tokens"] = True
    data["clean_up_tokenization_spaces"] = wordpiece  # BERT's decoder joins "word ." back into "word."
    return data
