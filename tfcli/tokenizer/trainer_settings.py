"""What a tokenizer is trained as: the family (BPE, WordPiece, Unigram, char, word), its vocabulary size, special
tokens, pre-tokenizer and normalization, each checked when the settings are made (an option that does not apply
to the family is an error, not ignored). Torch- and tokenizers-free."""

from __future__ import annotations

import dataclasses
from typing import Literal

from tfcli.errors import TfcliError
from tfcli.tokenizer.core import MAX_VOCAB_SIZE
from tfcli.tokenizer.specials import SpecialTokens, default_specials

ModelKind = Literal["bpe", "wordpiece", "unigram", "char", "word"]
MODELS: tuple[str, ...] = ("bpe", "wordpiece", "unigram", "char", "word")
FAMILY_NAMES = {"bpe": "BPE", "wordpiece": "WordPiece", "unigram": "Unigram", "char": "character", "word": "word-level"}
PreTokenizerKind = Literal["byte-level", "whitespace", "metaspace"]
PRE_TOKENIZERS: tuple[str, ...] = ("byte-level", "whitespace", "metaspace")
BYTE_ALPHABET_SIZE = 256
VOCAB_TXT = "vocab.txt"  # BERT's vocabulary file: one token per line, the line number is the id


@dataclasses.dataclass(frozen=True)
class TokenizerTrainingConfig:
    """What to train. Options left as None take the family's default: `pre_tokenizer` byte-level (BPE only),
    `min_frequency` 2 (BPE, WordPiece) or 1 (char, word: every character or word seen), `special_tokens` BERT's for
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
            object.__setattr__(self, "min_frequency", 1 if self.model in ("char", "word") else 2)
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
                "word": "splits text at spaces and punctuation",
            }[model]
            raise TfcliError(f"--pre-tokenizer applies to --model bpe only; {model} {how}", hint="drop --pre-tokenizer")
        if self.min_frequency is not None and model == "unigram":
            raise TfcliError(
                "--min-frequency does not apply to --model unigram (it keeps the pieces that best explain the corpus)",
                hint="drop --min-frequency; --vocab-size sets how many pieces it keeps",
            )
        if self.limit_alphabet is not None and model in ("unigram", "char", "word"):
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
