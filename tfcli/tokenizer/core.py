"""`TextTokenizer`: a trained tokenizer.json loaded, validated and wrapped for tfcli's use.

User text is always encoded with special tokens split into ordinary text (a literal `<|endoftext|>` in a
corpus or prompt never becomes the end-of-text id); special ids are inserted by id, never by text.

A tokenizer.json is read as transformers reads it: padding and truncation saved in it are off (transformers'
encode turns them off unless a call asks for them), tokenizer_config.json's word on added tokens
(`added_tokens_decoder`, the named special tokens) is applied over the file's, and `decode` cleans up
spaces where tokenizer_config.json asks for it (`clean_up_tokenization_spaces`), leaves special tokens out by id
(`kept_ids`) and reads CLIP's end-of-word "</w>" as a space (`decoder_for_word_suffix`), as transformers' decode does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders

from tfcli import limits
from tfcli.corpus.reader import replace_lone_surrogates
from tfcli.errors import TfcliError
from tfcli.jsontext import loads_json
from tfcli.limits import nesting_depth, read_file_capped, read_text_capped
from tfcli.tokenizer.cleanup import clean_up_spaces
from tfcli.tokenizer.specials import CONFIG_KEYS, KNOWN_NAMES, LOADED_ROLES

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
MAX_VOCAB_SIZE = 1 << 22
WORDPIECE_PREFIX = "##"  # a WordPiece token that continues the word before it
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback piece, as the ByteFallback decoder reads it
_MODEL_FAMILIES = {"BPE": "bpe", "WordPiece": "wordpiece", "Unigram": "unigram", "WordLevel": "word"}


@dataclasses.dataclass
class TextTokenizer:
    """A Hugging Face tokenizer plus what tfcli needs to know about it.

    `special_ids` maps a role (eos, pad, unk, mask, cls; bos and sep in pretrained models' tokenizers) to its
    id, for the roles this tokenizer has.
    """

    hf: Tokenizer
    path: Path
    sha256: str
    special_ids: dict[str, int]
    model_max_length: int | None = None
    adds_bos: bool = False  # a pretrained decoder's prompts start with its bos token (Llama's <s>: add_bos_token)
    adds_eos: bool = False  # and end with its eos token (add_eos_token: a T5's </s>, a GGUF that asks for it)
    cleans_up_spaces: bool = False  # decode takes out spaces before punctuation (tokenizer_config.json's clean_up_tokenization_spaces)

    @classmethod
    def load(cls, path: Path) -> TextTokenizer:
        """Load `path` (a tokenizer.json, or a folder holding one); every problem is a TfcliError."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise TfcliError(f"tokenizer file {path} does not exist", hint="train one with `tfcli tokenize train`")
        _refuse_other_formats(path)
        text = ""
        try:
            raw = read_file_capped(path, limits.TOKENIZER_FILE)
            text = raw.decode("utf-8")
            hf = Tokenizer.from_str(text)
        except TfcliError:
            raise
        except Exception as exc:  # OSError, UnicodeDecodeError, and the plain Exception tokenizers raises on bad JSON
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "recursion limit" in first_line or nesting_depth(text, 128) >= 128:  # the parser's own words for it
                first_line = "nested too deeply"
            raise TfcliError(
                f"{path} is not a tokenizer.json ({first_line})", hint="pass a file written by `tfcli tokenize train` or a Hugging Face tokenizer.json"
            ) from exc
        vocab_size = hf.get_vocab_size(with_added_tokens=True)
        if vocab_size > MAX_VOCAB_SIZE:
            raise TfcliError(f"{path} has {vocab_size:,} tokens, more than tfcli supports ({MAX_VOCAB_SIZE:,})")
        # transformers' encode runs with padding and truncation off unless a call asks for them
        # (TokenizersBackend.set_truncation_and_padding); a file saved with them on pads "Hello" to 8 ids
        hf.no_padding()
        hf.no_truncation()
        hf.encode_special_tokens = True
        suffix_decoder = decoder_for_word_suffix(hf)
        if suffix_decoder is not None:
            hf.decoder = suffix_decoder
        config = _read_tokenizer_config(path.parent / TOKENIZER_CONFIG_FILE)
        _apply_added_tokens(hf, config)
        special_ids = _find_special_ids(hf, config)
        max_length = config.get("model_max_length")
        bos = special_ids.get("bos")
        # add_bos_token as transformers' Llama tokenizers write it, or a post-processor that puts bos first
        adds_bos = bos is not None and config.get("add_bos_token", hf.encode("", add_special_tokens=True).ids[:1] == [bos]) is True
        # add_eos_token only where tokenizer_config.json says it (transformers 4's Llama tokenizers, tfcli's GGUF import): a
        # post-processor's [SEP] or </s> last (BERT's, T5's, tfcli's WordPiece) is for a pair or a source, not a decoder's prompt
        adds_eos = "eos" in special_ids and config.get("add_eos_token") is True
        return cls(
            hf=hf,
            path=path,
            sha256=hashlib.sha256(raw).hexdigest(),
            special_ids=special_ids,
            model_max_length=max_length if isinstance(max_length, int) and max_length < 1 << 40 else None,
            adds_bos=adds_bos,
            adds_eos=adds_eos,
            cleans_up_spaces=_cleans_up_spaces(hf, config),
        )

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def copies_into(self, folder: Path) -> list[tuple[Path, Path]]:
        """(origin, destination) of the files a run directory in `folder` keeps of this tokenizer
        (tokenizer.json and, where there is one, tokenizer_config.json), but for those already there."""
        pairs = [(self.path, folder / TOKENIZER_FILE), (self.path.parent / TOKENIZER_CONFIG_FILE, folder / TOKENIZER_CONFIG_FILE)]
        return [(origin, destination) for origin, destination in pairs if origin.is_file() and origin.resolve() != destination.resolve()]

    @cached_property
    def spec(self) -> dict[str, Any]:
        """tokenizer.json as a dictionary. Its ids are checked first: the library writes a vocabulary by
        walking every id up to the largest, so one token numbered 1,000,000,000 costs it gigabytes."""
        self.check_ids(max(self.hf.get_vocab(with_added_tokens=True).values(), default=-1))  # an empty vocabulary has no id past it
        return json.loads(self.hf.to_str())

    @cached_property
    def pre_tokenizer_kind(self) -> str:
        """ "byte-level", "whitespace", "metaspace", "bert" (WordPiece's), "characters" (char's), or the
        library's type name for anything else."""
        spec = self.spec.get("pre_tokenizer") or {}
        if self.family == "char":
            return "characters"
        kinds = {"ByteLevel": "byte-level", "Whitespace": "whitespace", "Metaspace": "metaspace", "BertPreTokenizer": "bert"}
        return kinds.get(spec.get("type"), spec.get("type") or "none")

    @cached_property
    def family(self) -> str:
        """ "bpe", "wordpiece", "unigram", "char" (a word-level vocabulary of single characters), "word" (any other
        word-level vocabulary), or the library's model type for anything else."""
        kind = (self.spec.get("model") or {}).get("type", "")
        family = _MODEL_FAMILIES.get(kind, kind.lower() or "none")
        if family == "word":
            added = {token.content for token in self.hf.get_added_tokens_decoder().values()}
            if all(len(token) == 1 for token in self.hf.get_vocab(with_added_tokens=False) if token not in added):
                return "char"
        return family

    @cached_property
    def continuation_prefix(self) -> str | None:
        """WordPiece's mark of a token that continues a word ("##"), or None for other families."""
        if self.family != "wordpiece":
            return None
        return (self.spec.get("model") or {}).get("continuing_subword_prefix") or WORDPIECE_PREFIX

    @property
    def words_carry_their_space(self) -> bool:
        """Whether a word-initial token stands for the space before the word too (byte-level and metaspace
        vocabularies, and WordPiece and word-level ones as tfcli spells their tokens), so a filler at a mask brings its own space."""
        return self.pre_tokenizer_kind in ("byte-level", "metaspace") or self.family in ("wordpiece", "word")

    def require(self, role: str) -> int:
        """The id of the token playing `role`, or a clear error if this tokenizer has none."""
        if role not in self.special_ids:
            raise TfcliError(
                f"tokenizer {self.path} has no {role} token",
                hint=f"retrain it with `tfcli tokenize train` (it adds one), or name it in {TOKENIZER_CONFIG_FILE} as {CONFIG_KEYS[role]}",
            )
        return self.special_ids[role]

    def encode(self, text: str) -> list[int]:
        """Token ids of user text; special-token text in it stays ordinary text."""
        ids = self.hf.encode(replace_lone_surrogates(text), add_special_tokens=False).ids
        self.check_ids(max(ids, default=0))
        return ids

    def prompt_ids(self, ids: Sequence[int], room: int | None = None) -> list[int]:
        """A decoder's prompt from its text's ids, as llama.cpp's llama_tokenize(add_special=true) and transformers'
        tokenizer(text) give it: bos first where the tokenizer adds one, eos last where it adds one (a file's
        add_eos_token; llama-cpp-python's and llama.cpp's server's completions end the prompt with it too), the text's
        last ids kept where `room` caps the whole.

        Example: [15043] with <s> = 1 and </s> = 2 both added -> [1, 15043, 2]"""
        head = [self.special_ids["bos"]] if self.adds_bos else []
        tail = [self.special_ids["eos"]] if self.adds_eos else []
        kept = list(ids) if room is None else list(ids)[max(len(ids) - room + len(head) + len(tail), 0) :]
        return [*head, *kept, *tail]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many texts, encoded in parallel on all cores."""
        encodings = self.hf.encode_batch_fast([replace_lone_surrogates(t) for t in texts], add_special_tokens=False)
        ids = [e.ids for e in encodings]
        self.check_ids(max((max(row) for row in ids if row), default=0))
        return ids

    def check_ids(self, largest: int) -> None:
        """A tokenizer.json may map a token to any id (its vocabulary is a table); an id past the vocabulary
        would be cut short in a shard or index past the model's embeddings."""
        if largest >= self.vocab_size:
            raise TfcliError(
                f"{self.path} gives the token id {largest:,}, past its vocabulary of {self.vocab_size:,} tokens",
                hint="its ids must run from 0 to the vocabulary size - 1, without gaps; use a tokenizer.json written by tfcli or transformers "
                "(for one transformers converted from a GGUF file, `tfcli import FILE.gguf` reads the file's own tokenizer)",
            )

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of `ids`, as transformers' decode gives it: the library's decoder, then the space clean-up
        where tokenizer_config.json asks for it. The one way from ids to text (streaming: `detokenize.py`)."""
        text = self.library_decode(ids, skip_special_tokens)
        return clean_up_spaces(text) if self.cleans_up_spaces else text

    def decode_batch(self, batch: Sequence[Sequence[int]], *, skip_special_tokens: bool = False) -> list[str]:
        """`decode` of each row, the rows decoded in parallel."""
        rows = [self.kept_ids(ids, skip_special_tokens) for ids in batch]
        decoded = iter(self.hf.decode_batch([row for row in rows if row], skip_special_tokens=skip_special_tokens))
        texts = [next(decoded) if row else "" for row in rows]
        return [clean_up_spaces(text) for text in texts] if self.cleans_up_spaces else texts

    def library_decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        """The library's decoder on `ids` (the special tokens' left out first where skipped), before any space
        clean-up. No ids are "" (a decoder sequence with a Strip step panics on none)."""
        kept = self.kept_ids(ids, skip_special_tokens)
        return self.hf.decode(kept, skip_special_tokens=skip_special_tokens) if kept else ""

    def kept_ids(self, ids: Sequence[int], skip_special_tokens: bool) -> list[int]:
        """`ids` less the special tokens' where a decode skips them. The library's own skip misses a special token
        marked `normalized` when the tokenizer has a normalizer (it looks the token up by its normalized text:
        Llama 2's legacy files, whose "<s>" and "</s>" are normalized, decode "<s> Hello"); transformers' Llama
        tokenizer, rebuilt without that normalizer, leaves them out, and so does tfcli, by id.

        Example: [1, 15043] with <s> = 1 special, skipping -> [15043]"""
        if not skip_special_tokens:
            return list(ids)
        skipped = self.skipped_ids
        return [i for i in ids if i not in skipped]

    @cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of the pieces `<0x00>` .. `<0xFF>` where the decoder has a ByteFallback step (Llama 2's), which
        writes a run of them as its UTF-8 text, or as U+FFFD for every byte when any byte of it is invalid."""
        if not _has_decoder_step(self.spec.get("decoder"), "ByteFallback"):
            return frozenset()
        return frozenset(i for token, i in self.hf.get_vocab(with_added_tokens=False).items() if _BYTE_PIECE.fullmatch(token))

    @property
    def decodes_byte_symbols(self) -> bool:
        """Whether the decoder reads each symbol of a token as one byte (GPT-2's ByteLevel)."""
        return _has_decoder_step(self.spec.get("decoder"), "ByteLevel")

    @cached_property
    def skipped_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special: what the library's decode(skip_special_tokens=True) leaves out."""
        return frozenset(i for i, token in self.hf.get_added_tokens_decoder().items() if token.special)


def decoder_for_word_suffix(hf: Tokenizer) -> decoders.Decoder | None:
    """The decoder transformers gives a byte-level BPE whose tokens end words with a suffix (CLIP's "</w>"), where
    the file's decoder, ByteLevel alone, leaves the suffix in the text ("a</w>photo</w>"); None for any other
    tokenizer. transformers' CLIPTokenizer wraps decode: the suffix becomes a space and the text is stripped. Here
    the suffix becomes the byte-level space ("Ġ") before the bytes are read, and the last space goes, so the
    library itself (and any tool reading the run's tokenizer.json) decodes the text transformers gives.

    Example: ["a</w>", "photo</w>", "<|endoftext|>"] -> "a photo <|endoftext|>"
    """
    suffix = getattr(hf.model, "end_of_word_suffix", None)
    if type(hf.model).__name__ != "BPE" or not suffix or type(hf.decoder).__name__ != "ByteLevel":
        return None
    return decoders.Sequence([decoders.Replace(suffix, "\u0120"), decoders.ByteLevel(), decoders.Strip(" ", 0, 1)])


def _has_decoder_step(decoder: dict[str, Any] | None, kind: str) -> bool:
    if not isinstance(decoder, dict):
        return False
    return decoder.get("type") == kind or any(_has_decoder_step(step, kind) for step in decoder.get("decoders") or [])


def _refuse_other_formats(path: Path) -> None:
    """A GGUF file (llama.cpp's) holds a tokenizer too, but not as a tokenizer.json: say how to get one."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError:
        return  # reading it properly reports the problem
    if magic == b"GGUF":
        raise TfcliError(
            f"{path} is a GGUF file (llama.cpp's), not a tokenizer.json",
            hint=f"import it first (tfcli import {path} -o RUN), then pass the run folder: -t RUN",
        )


def _read_tokenizer_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = loads_json(read_text_capped(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TfcliError(f"{path} is not valid JSON ({exc})", hint="fix it or delete it") from exc
    if not isinstance(data, dict):
        raise TfcliError(f"{path} must hold a JSON object")
    return data


def _cleans_up_spaces(hf: Tokenizer, config: dict[str, Any]) -> bool:
    """Whether decode cleans up spaces, as transformers 5 decides (TokenizersBackend._decode): where
    tokenizer_config.json says clean_up_tokenization_spaces, but for a BPE model, unless it also says
    clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output (the clean-up was made for
    WordPiece; on BPE text it takes out spaces the text had)."""
    if config.get("clean_up_tokenization_spaces") is not True:
        return False
    return type(hf.model).__name__ != "BPE" or config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output") is True


_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")
_NAMED_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")  # transformers' order


def _apply_added_tokens(hf: Tokenizer, config: dict[str, Any]) -> None:
    """tokenizer_config.json's word on added tokens over tokenizer.json's, as transformers 5 loads a fast
    tokenizer (TokenizersBackend.__init__): it adds again every entry of `added_tokens_decoder` (without one,
    every added token of tokenizer.json), then each named special token (bos_token ... mask_token,
    additional/extra_special_tokens) that is not an added token yet, as special (normalized off); an entry
    whose text a named token has is made special. The library keeps a token's id and takes its new flags when it
    is added again. A token the vocabulary lacks is left out: transformers would give it a new id, past the
    model's embeddings.

    Example: tokenizer.json's "<sep>" with lstrip and rstrip, tokenizer_config.json's entry without: "a <sep> b"
    encodes with its spaces, as transformers encodes it; eos_token "</s>" that tokenizer.json has only in its
    vocabulary is special (a decode that skips special tokens leaves it out).
    """
    current = hf.get_added_tokens_decoder()
    entries = config.get("added_tokens_decoder")
    if isinstance(entries, dict):  # transformers refuses an entry that is not an object; tfcli passes it by
        keys = sorted((key for key in entries if isinstance(entries[key], dict)), key=lambda key: int(key) if str(key).isdigit() else -1)
        updates = [token for token in (_added_token(entries[key], special=False) for key in keys) if token is not None]
    else:
        updates = [current[i] for i in sorted(current)]
    seen = {token.content for token in current.values()} | {token.content for token in updates}
    named = [config.get(key) for key in _NAMED_KEYS]
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens")
    named_texts = {token.content for token in (_added_token(value, special=True) for value in named) if token is not None}
    for value in named + (extra if isinstance(extra, list) else []):
        token = _added_token(value, special=True)
        if token is not None and token.content not in seen:
            updates.append(token)
            seen.add(token.content)
    now = {token.content: _flags(token) for token in current.values()}
    changed: dict[str, AddedToken] = {}  # the last word on each token, added in one call (each call rebuilds the matcher)
    for token in updates:
        if not token.special and token.content in named_texts:
            token = AddedToken(token.content, **{**_flags(token), "special": True})
        if now.get(token.content) != _flags(token) and hf.token_to_id(token.content) is not None:
            changed[token.content] = token
            now[token.content] = _flags(token)
    if changed:
        hf.add_tokens(list(changed.values()))


def _added_token(value: Any, *, special: bool) -> AddedToken | None:
    """An added token as tokenizer_config.json writes one: its text alone (for a named special token, special
    with normalized off, as transformers makes it), or {"content": ..., "lstrip": ..., ...}. None for anything else."""
    if isinstance(value, str) and value:
        return AddedToken(value, special=True, normalized=False) if special else AddedToken(value)
    if not isinstance(value, dict) or not isinstance(value.get("content"), str) or not value["content"]:
        return None
    flags = {flag: value[flag] for flag in _ADDED_TOKEN_FLAGS if isinstance(value.get(flag), bool)}
    if special:
        flags["special"] = True
    return AddedToken(value["content"], **flags)


def _flags(token: AddedToken) -> dict[str, bool]:
    return {flag: getattr(token, flag) for flag in _ADDED_TOKEN_FLAGS}


def _find_special_ids(hf: Tokenizer, config: dict[str, Any]) -> dict[str, int]:
    """Roles from tokenizer_config.json where it names them, else from well-known token names."""
    ids: dict[str, int] = {}
    for role in LOADED_ROLES:
        named = config.get(CONFIG_KEYS[role])
        if isinstance(named, dict):  # transformers sometimes writes {"content": ..., ...}
            named = named.get("content")
        if isinstance(named, str):
            token_id = hf.token_to_id(named)
            if token_id is None:
                raise TfcliError(f"{TOKENIZER_CONFIG_FILE} names {named!r} as {CONFIG_KEYS[role]}, but the tokenizer has no such token")
            ids[role] = token_id
            continue
        for candidate in KNOWN_NAMES[role]:
            token_id = hf.token_to_id(candidate)
            if token_id is not None:
                ids[role] = token_id
                break
    return ids
