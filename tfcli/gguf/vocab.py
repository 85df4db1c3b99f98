"""A tokenizer in GGUF's `tokenizer.ggml.*` metadata, and back to a tokenizer.json.

Two of llama.cpp's tokenizer models are spoken:
- `gpt2`: byte-level BPE with its merges, after a pre-tokenizer regex llama.cpp knows by name
  (`tokenizer.ggml.pre`: gpt-2, llama-bpe, qwen2, smollm);
- `llama`: SentencePiece-style pieces with scores (spaces written as U+2581, byte fallback `<0xXX>`);
  llama.cpp merges the adjacent pair whose joined piece scores highest, which a BPE reproduces with a
  merge for every split of every piece, ranked by the piece's score (as transformers reads a GGUF).
Exported, a BPE's merge rank becomes its piece's score (the earlier the merge, the higher).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from tfcli import limits
from tfcli.errors import TfcliError
from tfcli.gguf.splits import token_splits
from tfcli.tokenizer.specials import CONFIG_KEYS

if TYPE_CHECKING:
    from tfcli.tokenizer.core import TextTokenizer

SPACE = "\u2581"
# llama.cpp's token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# GGUF's special-token keys, by tfcli role
ROLE_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic: llama.cpp's spelling
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
}
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# llama.cpp's pre-tokenizer names -> the one tfcli writes for that regex
PRE_NAMES = {
    "gpt-2": "gpt-2",
    "phi-2": "gpt-2",
    "roberta-bpe": "gpt-2",
    "olmo": "gpt-2",
    "mpt": "gpt-2",
    "llama-bpe": "llama-bpe",
    "llama3": "llama-bpe",
    "llama-v3": "llama-bpe",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
    "smollm": "smollm",
}
# Keys of the tokenizer namespace read here or harmless to leave out (stop tokens of chat and infill turns)
TOKENIZER_KEYS = {
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.token_type_count",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_sep_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.remove_extra_whitespaces",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.fim_pre_token_id",
    "tokenizer.ggml.fim_suf_token_id",
    "tokenizer.ggml.fim_mid_token_id",
    "tokenizer.ggml.fim_pad_token_id",
    "tokenizer.ggml.fim_rep_token_id",
    "tokenizer.ggml.fim_sep_token_id",
    "tokenizer.ggml.prefix_token_id",
    "tokenizer.ggml.suffix_token_id",
    "tokenizer.ggml.middle_token_id",
    "tokenizer.chat_template",
    "tokenizer.chat_templates",
    "tokenizer.huggingface.json",
    *ROLE_KEYS.values(),
}


def _pre_tokenizer(name: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=name in ("gpt-2", "smollm"))
    if name == "gpt-2":
        return byte_level
    if name == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    pattern = LLAMA3_PATTERN if name == "llama-bpe" else QWEN2_PATTERN
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"), byte_level])


def _without_offsets(part: Any) -> Any:
    """A tokenizer.json part without ByteLevel's trim_offsets, which changes offsets only, never ids."""
    if isinstance(part, dict):
        return {k: _without_offsets(v) for k, v in part.items() if k != "trim_offsets"}
    if isinstance(part, list):
        return [_without_offsets(v) for v in part]
    return part


def _byte_level_pre_name(spec: dict[str, Any]) -> str | None:
    for name in ("gpt-2", "llama-bpe", "qwen2", "smollm"):
        probe = Tokenizer(models.BPE())
        probe.pre_tokenizer = _pre_tokenizer(name)
        if _without_offsets(spec.get("pre_tokenizer")) == _without_offsets(json.loads(probe.to_str())["pre_tokenizer"]):
            return name
    return None


def _merges(model: dict[str, Any]) -> list[str]:
    """A BPE's merges as GGUF writes them ("a b"), from either form tokenizer.json uses."""
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def _is_sentencepiece_style(spec: dict[str, Any]) -> bool:
    pre, normalizer = spec.get("pre_tokenizer") or {}, spec.get("normalizer") or {}
    if pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE and not normalizer:
        return True
    steps = normalizer.get("normalizers", [normalizer]) if normalizer else []
    return not pre and any(s.get("type") == "Replace" and s.get("content") == SPACE for s in steps)


def _adds_space_prefix(spec: dict[str, Any]) -> bool:
    pre, normalizer = spec.get("pre_tokenizer") or {}, spec.get("normalizer") or {}
    if pre.get("type") == "Metaspace":
        return pre.get("prepend_scheme", "always") != "never"
    steps = normalizer.get("normalizers", [normalizer]) if normalizer else []
    return any(s.get("type") == "Prepend" for s in steps)


def tokenizer_metadata(tokenizer: TextTokenizer, vocab_size: int, tokenizer_config: dict[str, Any]) -> dict[str, Any]:
    """The `tokenizer.*` keys of this tokenizer, for a model with `vocab_size` rows (rows past the
    tokenizer's are written as unused [PAD{i}] tokens, as llama.cpp's converter does)."""
    spec = tokenizer.spec
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise TfcliError(
            f"GGUF cannot hold a {tokenizer.family} tokenizer: llama.cpp's tokenizers are byte-level BPE (gpt2) and SentencePiece-style pieces (llama)",
            hint="train the run with a byte-level BPE tokenizer (tfcli tokenize train's default)",
        )
    if spec.get("normalizer") and not _is_sentencepiece_style(spec):
        raise TfcliError(
            f"GGUF cannot hold the tokenizer's normalizer ({spec['normalizer'].get('type')}): llama.cpp does not normalize text",
            hint="train without --lowercase",
        )
    pre_name = _byte_level_pre_name(spec)
    sentencepiece = pre_name is None and _is_sentencepiece_style(spec)
    if pre_name is None and not sentencepiece:
        kind = (spec.get("pre_tokenizer") or {}).get("type", "none")
        raise TfcliError(
            f"GGUF cannot hold a BPE tokenizer with the {kind} pre-tokenizer: llama.cpp knows byte-level BPE (GPT-2's, Llama 3's, Qwen2's, SmolLM's regex) and SentencePiece-style pieces",
            hint="train the run with a byte-level or metaspace BPE tokenizer",
        )
    if sentencepiece and any(tokenizer.hf.token_to_id(f"<0x{b:02X}>") is None for b in range(256)):
        raise TfcliError(
            "GGUF's SentencePiece-style tokenizer needs the 256 byte pieces <0x00> .. <0xFF>: llama.cpp spells a character "
            "outside the vocabulary with them (and stops without them), and this metaspace tokenizer has none",
            hint="train the run with a byte-level BPE tokenizer (tfcli tokenize train's default)",
        )
    size = tokenizer.vocab_size
    by_id = {i: t for t, i in tokenizer.hf.get_vocab(with_added_tokens=True).items()}
    added = tokenizer.hf.get_added_tokens_decoder()
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i) if i < size else None
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(token)
            types.append(CONTROL if added[i].special else USER_DEFINED)
        elif sentencepiece and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            tokens.append(token)
            types.append(BYTE)
        else:
            tokens.append(token)
            types.append(NORMAL)
    meta: dict[str, Any] = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    merges = _merges(model)
    if sentencepiece:
        meta["tokenizer.ggml.model"] = "llama"
        scores = [0.0] * vocab_size
        for rank, merge in enumerate(merges):
            token_id = tokenizer.hf.token_to_id(merge.replace(" ", "", 1))
            if token_id is not None and scores[token_id] == 0.0:
                scores[token_id] = -float(rank + 1)
        meta["tokenizer.ggml.scores"] = scores
        meta["tokenizer.ggml.add_space_prefix"] = _adds_space_prefix(spec)
    else:
        meta["tokenizer.ggml.model"] = "gpt2"
        meta["tokenizer.ggml.pre"] = pre_name
        meta["tokenizer.ggml.merges"] = merges
    ids = tokenizer.special_ids
    eos = ids.get("eos")
    for role, key in ROLE_KEYS.items():
        # llama.cpp assumes a bos of its own when none is named (id 11 for BPE): end of text stands in, unused
        value = ids.get(role, eos if role == "bos" else None)
        if value is not None:
            meta[key] = value
    meta["tokenizer.ggml.add_bos_token"] = bool(tokenizer.adds_bos)
    meta["tokenizer.ggml.add_eos_token"] = False
    template = tokenizer_config.get("chat_template")
    if isinstance(template, str) and template:
        meta["tokenizer.chat_template"] = template
    return meta


class Vocab:
    """The tokenizer metadata of a file, checked."""

    def __init__(self, metadata: dict[str, Any], where: str) -> None:
        for key in metadata:
            if key.startswith("tokenizer.") and key not in TOKENIZER_KEYS and not key.startswith("tokenizer.chat_template."):
                raise TfcliError(f"{where}: metadata {key} is not something tfcli's tokenizer can express")
        self.where = where
        self.kind = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if self.kind is None or tokens is None:
            missing = "tokenizer.ggml.model" if self.kind is None else "tokenizer.ggml.tokens"
            raise TfcliError(f"{where} has no tokenizer (metadata {missing} is missing)", hint="tfcli needs the tokenizer inside the GGUF file")
        if self.kind not in ("gpt2", "llama"):
            raise TfcliError(f"{where}: metadata tokenizer.ggml.model is {self.kind!r}; tfcli reads gpt2 (byte-level BPE) and llama (SentencePiece-style)")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise TfcliError(f"{where}: metadata tokenizer.ggml.tokens is not a list of strings")
        self.tokens: list[str] = tokens
        n = len(tokens)
        self.types = self._numbers(metadata, "tokenizer.ggml.token_type", n, [NORMAL] * n)
        self.scores = self._numbers(metadata, "tokenizer.ggml.scores", n, [0.0] * n, number=float)
        self.ids: dict[str, int] = {}
        for role, key in ROLE_KEYS.items():
            value = metadata.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
                raise TfcliError(f"{where}: metadata {key} is {value!r}, not a token id below {n:,}")
            self.ids[role] = value
        self.add_bos = self._flag(metadata, "tokenizer.ggml.add_bos_token", self.kind == "llama")
        self.add_space_prefix = self._flag(metadata, "tokenizer.ggml.add_space_prefix", True)
        for key in ("tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token", "tokenizer.ggml.remove_extra_whitespaces"):
            if self._flag(metadata, key, False):
                raise TfcliError(f"{where}: metadata {key} is true; tfcli's tokenizers do not add that")
        if self.kind == "gpt2":
            pre = metadata.get("tokenizer.ggml.pre")
            if pre not in PRE_NAMES:
                raise TfcliError(
                    f"{where}: metadata tokenizer.ggml.pre is {pre!r}; tfcli rebuilds the pre-tokenizers {', '.join(sorted(PRE_NAMES))}",
                    hint="a file without it uses llama.cpp's 'default' regex, which no Hugging Face tokenizer has",
                )
            self.pre = PRE_NAMES[pre]
            merges = metadata.get("tokenizer.ggml.merges")
            if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m[1:] for m in merges):
                raise TfcliError(f"{where}: metadata tokenizer.ggml.merges is missing or not a list of 'a b' pairs")
            self.merges = merges
        template = metadata.get("tokenizer.chat_template")
        self.chat_template = template if isinstance(template, str) and template else None

    def _numbers(self, metadata: dict[str, Any], key: str, n: int, default: list, number: type = int) -> list:
        value = metadata.get(key)
        if value is None:
            return default
        if isinstance(value, list) or getattr(value, "ndim", 0) != 1 or len(value) != n:
            raise TfcliError(f"{self.where}: metadata {key} is not {n:,} numbers, one a token")
        return [number(v) for v in value.tolist()]

    def _flag(self, metadata: dict[str, Any], key: str, default: bool) -> bool:
        value = metadata.get(key, default)
        if not isinstance(value, bool):
            raise TfcliError(f"{self.where}: metadata {key} is {value!r}, not true or false")
        return value

    def tokenizer_json(self) -> str:
        """The tokenizer.json that encodes and decodes as llama.cpp does."""
        vocab: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            if token in vocab:
                raise TfcliError(f"{self.where}: metadata tokenizer.ggml.tokens lists {token!r} twice (ids {vocab[token]} and {i})")
            vocab[token] = i
        if self.kind == "gpt2":
            pairs = [tuple(m.split(" ", 1)) for m in self.merges]
            try:
                hf = Tokenizer(models.BPE(vocab, pairs, ignore_merges=self.pre == "llama-bpe"))
            except Exception as exc:  # tokenizers raises a plain Exception for merges of unknown tokens
                raise TfcliError(f"{self.where}: metadata tokenizer.ggml.merges do not fit its tokens ({str(exc).splitlines()[0]})") from None
            hf.pre_tokenizer = _pre_tokenizer(self.pre)
            hf.decoder = decoders.ByteLevel()
        else:
            unk = self.ids.get("unk")
            byte_fallback = any(t == BYTE for t in self.types)
            hf = Tokenizer(
                models.BPE(
                    vocab,
                    self._sentencepiece_merges(vocab),
                    unk_token=self.tokens[unk] if unk is not None else None,
                    fuse_unk=True,
                    byte_fallback=byte_fallback,
                )
            )
            steps = [normalizers.Prepend(SPACE)] if self.add_space_prefix else []
            hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
            tail = [decoders.Strip(" ", 1, 0)] if self.add_space_prefix else []
            hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *tail])
        special = [AddedToken(t, special=True, normalized=False) for t, kind in zip(self.tokens, self.types) if kind in (CONTROL, UNKNOWN)]
        user = [AddedToken(t, special=False, normalized=False) for t, kind in zip(self.tokens, self.types) if kind == USER_DEFINED]
        hf.add_tokens(user)
        hf.add_special_tokens(special)
        return hf.to_str(pretty=True)

    def _sentencepiece_merges(self, vocab: dict[str, int]) -> list[tuple[str, str]]:
        """A merge (a, b) for every piece a + b, both pieces too, ranked by the joined piece's score (highest
        first; ties by id), so a BPE joins pairs in the order llama.cpp's SentencePiece tokenizer does.

        The splits are found in time linear in the vocabulary's characters (`token_splits`), each checked on
        the strings; their characters together are capped by what a tokenizer.json may hold, as they go into one."""
        tokens = self.tokens
        pieces = [i for i, (t, kind) in enumerate(zip(tokens, self.types)) if kind == NORMAL and len(t) > 1]
        budget, spent = limits.TOKENIZER_FILE.value, 0
        merges = []
        for piece_ids, cuts, lefts, rights in token_splits(tokens, pieces):
            spent += sum(len(tokens[i]) for i in piece_ids.tolist())
            if spent > budget:
                raise TfcliError(
                    f"{self.where}: the merges its SentencePiece-style pieces imply (one for every split of a piece in two tokens) "
                    f"come to more than {limits.shown(budget)} of text, the limit on {limits.TOKENIZER_FILE.what}",
                    hint=limits.TOKENIZER_FILE.how_to_raise(),
                )
            for i, cut, left_id, right_id in zip(piece_ids.tolist(), cuts.tolist(), lefts.tolist(), rights.tolist()):
                piece, left, right = tokens[i], tokens[left_id], tokens[right_id]
                if not (len(left) == cut and len(right) == len(piece) - cut and piece.startswith(left) and piece.endswith(right)):
                    left, right = piece[:cut], piece[cut:]  # two hashes alike: the strings decide
                    if left not in vocab or right not in vocab:
                        continue
                merges.append((-self.scores[i], i, cut, left, right))
        merges.sort()
        return [(left, right) for *_, left, right in merges]

    def tokenizer_config(self, block_size: int) -> dict[str, Any]:
        """tokenizer_config.json: the special tokens by role, whether prompts start with bos, the chat template."""
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size}
        for role, token_id in self.ids.items():
            if role == "bos" and not self.add_bos and token_id == self.ids.get("eos"):
                continue  # end of text standing in for a bos the model never uses
            config[CONFIG_KEYS[role]] = self.tokens[token_id]
        config["add_bos_token"] = self.add_bos and "bos" in self.ids
        config["split_special_tokens"] = True
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config
