"""Special tokens and the roles they play (end of text, padding, unknown, mask, classification).

`tokenizer.json` lists special tokens but not their roles; the roles live in `tokenizer_config.json`
beside it (the Hugging Face convention), and well-known names are recognised when that file is absent.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tfcli.errors import TfcliError
from tfcli.jsontext import loads_json
from tfcli.limits import read_text_capped

ROLES: tuple[str, ...] = ("eos", "pad", "unk", "mask", "cls")
ROLE_DESCRIPTIONS = {
    "eos": "end of text: separates documents, stops generation",
    "pad": "padding in batches of unequal lengths",
    "unk": "unknown: text the vocabulary cannot express",
    "mask": "the masked-language-model mask",
    "cls": "classification: its final state feeds a classifier head",
}
DEFAULT_SPECIALS = {
    "eos": "<|endoftext|>",
    "pad": "<|pad|>",
    "unk": "<|unk|>",
    "mask": "<|mask|>",
    "cls": "<|cls|>",
}
# WordPiece's defaults: BERT's names, in the order transformers' BertTokenizer gives them ids (0-4).
BERT_SPECIALS = {
    "pad": "[PAD]",
    "unk": "[UNK]",
    "cls": "[CLS]",
    "eos": "[SEP]",
    "mask": "[MASK]",
}

# Roles a loaded tokenizer may also have (pretrained models' tokenizers: Llama's <s>, BERT's [SEP]); tfcli's
# own tokenizers are trained with ROLES only.
LOADED_ROLES: tuple[str, ...] = ROLES + ("bos", "sep")
ROLE_DESCRIPTIONS.update(
    {
        "bos": "beginning of text: a pretrained model's first token",
        "sep": "separator: ends a BERT-style encoder's text",
    }
)
# Names other tokenizers use for a role, tried when a tokenizer.json comes without tokenizer_config.json.
KNOWN_NAMES = {
    "eos": ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]"),
    "pad": ("<|pad|>", "<pad>", "[PAD]"),
    "unk": ("<|unk|>", "<unk>", "[UNK]"),
    "mask": ("<|mask|>", "<mask>", "[MASK]"),
    "cls": ("<|cls|>", "<cls>", "[CLS]", "<s>"),
    "bos": ("<s>", "<|begin_of_text|>", "<bos>"),
    "sep": ("[SEP]",),
}
# tokenizer_config.json keys, as transformers names them.
CONFIG_KEYS = {role: f"{role}_token" for role in LOADED_ROLES}


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """Role -> token text (in vocabulary order), plus extra special tokens without a role."""

    roles: Mapping[str, str]
    extra: tuple[str, ...] = ()

    def all_tokens(self) -> list[str]:
        """Every special token once: the roles in the mapping's order, then the extras."""
        ordered = [self.roles[r] for r in self.roles if r in ROLES] + list(self.extra)
        return list(dict.fromkeys(ordered))

    def get(self, role: str) -> str | None:
        return self.roles.get(role)


def default_specials(model: str) -> dict[str, str]:
    """The special tokens a tokenizer family starts from: BERT's for WordPiece, tfcli's for the others."""
    return dict(BERT_SPECIALS if model == "wordpiece" else DEFAULT_SPECIALS)


def parse_special_tokens(specs: Iterable[str], defaults: Mapping[str, str] = DEFAULT_SPECIALS) -> SpecialTokens:
    """Build the special tokens from command-line items: `ROLE=TEXT` renames a role's token,
    a bare `TEXT` adds an extra special token. Roles not named keep their `defaults` (whose order is the
    order of their ids).

    Example: ["eos=</s>", "<|user|>"] -> eos "</s>", the other roles default, extra ("<|user|>",)
    """
    roles = dict(defaults)
    extra: list[str] = []
    for spec in specs:
        try:
            spec.encode("utf-8")
        except UnicodeEncodeError as exc:  # bytes that were not UTF-8 on the command line (lone surrogates)
            raise TfcliError(f"special token {spec!r} is not UTF-8 text (character {exc.start + 1})", hint="pass it in UTF-8") from None
        role, sep, text = spec.partition("=")
        if sep and role in ROLES:
            if not text:
                raise TfcliError(f"special token {spec!r} has no text", hint=f"write {role}=TEXT, e.g. {role}={defaults[role]}")
            roles[role] = text
        elif sep and role.isidentifier() and text:
            raise TfcliError(f"unknown special-token role {role!r}", hint=f"use one of {', '.join(ROLES)}, or pass the token alone")
        else:
            if not spec or spec.isspace():
                raise TfcliError("a special token cannot be empty or blank", hint="pass its text, e.g. <|user|>")
            extra.append(spec)
    tokens = list(roles.values()) + extra
    for token in tokens:
        if len(token) == 1:
            raise TfcliError(
                f"special token {token!r} is a single character, which would stand for that character in all text",
                hint="give it a spelling that text does not contain, e.g. <|sep|>",
            )
    role_of = {}
    for role in ROLES:
        if roles[role] in role_of:
            raise TfcliError(f"roles {role_of[roles[role]]} and {role} share the token {roles[role]!r}", hint="give each role its own token")
        role_of[roles[role]] = role
    if len(set(tokens)) != len(tokens):
        dup = next(t for t in tokens if tokens.count(t) > 1)
        raise TfcliError(f"special token {dup!r} is given twice", hint="list each special token once")
    return SpecialTokens(roles=roles, extra=tuple(extra))


# tokenizer_config.json's list of the ids that end a generated text, beside eos: what a downloaded model's
# own files say (generation_config.json's eos_token_id list, a GGUF's end-of-generation tokens). tfcli's key;
# transformers keeps an unknown key of this file as it is.
END_OF_GENERATION_KEY = "end_of_generation_ids"


def end_of_generation_ids(config: Mapping[str, Any], vocab_size: int, where: str) -> frozenset[int]:
    """The ids tokenizer_config.json lists under END_OF_GENERATION_KEY; empty where it lists none.

    Example: {"end_of_generation_ids": [151645, 151643]} -> frozenset({151643, 151645})"""
    ids = config.get(END_OF_GENERATION_KEY)
    if ids is None:
        return frozenset()
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
        raise TfcliError(
            f"{where}: {END_OF_GENERATION_KEY} must be a list of token ids below {vocab_size:,}, not {str(ids)[:80]}",
            hint="fix the list in tokenizer_config.json, or delete the key to stop at the eos token alone",
        )
    return frozenset(ids)


def read_end_of_generation_ids(tokenizer_folder: Path, vocab_size: int) -> frozenset[int]:
    """end_of_generation_ids of the tokenizer_config.json in `tokenizer_folder` (empty without the file)."""
    path = Path(tokenizer_folder) / "tokenizer_config.json"
    if not path.is_file():
        return frozenset()
    try:
        config = loads_json(read_text_capped(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TfcliError(f"{path} is not valid JSON ({exc})", hint="fix it or delete it") from exc
    return end_of_generation_ids(config if isinstance(config, dict) else {}, vocab_size, str(path))
