"""A tokenizer in GGUF's `tokenizer.ggml.*` metadata, and back to a tokenizer.json.

Five of llama.cpp's tokenizer models are spoken:
- `gpt2`: byte-level BPE with its merges, after the pre-tokenizer llama.cpp knows by name
  (`tokenizer.ggml.pre`: gpt-2, llama-bpe, qwen2, smollm, and every name llama.cpp splits by regexes alone,
  deepseek-coder, falcon, starcoder, gpt-4o, tekken, ..., with llama.cpp's own regexes: `PRES`);
- `llama`: SentencePiece-style pieces with scores (spaces written as U+2581, byte fallback `<0xXX>`);
  llama.cpp merges the adjacent pair whose joined piece scores highest, which a BPE reproduces with a
  merge for every split of every piece, ranked by the piece's score (as transformers reads a GGUF).
- `bert`: WordPiece as llama.cpp's WPM tokenizer reads it: text NFD-normalized, its marks dropped (accents and
  vowel signs), lowercased, control characters dropped, split at whitespace, punctuation, ASCII symbols and CJK characters, each word
  matched longest piece first, a word with a part no piece matches one unknown token. Its converter writes a
  word-initial piece with U+2581 before it and a continuation without BERT's ##; tfcli's tokenizer.json spells
  them back as BERT does (import only: tfcli writes no WordPiece GGUF);
- `t5`: Unigram as llama.cpp's UGM tokenizer reads it: the text through SentencePiece's precompiled character
  map, runs of spaces merged where remove_extra_whitespaces says, spaces written as U+2581 and one put first,
  then the pieces of highest total score over the whole text (import only);
- `gemma4`: Gemma 4's BPE over UTF-8 text (no byte-level alphabet), spaces written as U+2581, split only into lines
  and runs of newlines, byte fallback `<0xXX>`, prompts started with bos whatever the file says (import only).
Exported, a BPE's merge rank becomes its piece's score (the earlier the merge, the higher).
Whether a prompt starts with bos and ends with eos (`add_bos_token`, `add_eos_token`: llama.cpp's defaults where the
file is silent) goes to tokenizer_config.json, which tfcli reads, and to tokenizer.json's post-processor, which
transformers 5 reads (it ignores the two keys beside a tokenizer.json).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from tfcli import limits
from tfcli.errors import TfcliError
from tfcli.gguf.splits import token_splits
from tfcli.tokenizer.chat_template import ChatTemplate
from tfcli.tokenizer.specials import CONFIG_KEYS, END_OF_GENERATION_KEY, end_of_generation_ids

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
    "cls": "tokenizer.ggml.cls_token_id",
}
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
HANGUL_TAIL = "(?<=[\u1100-\u1112])[\u1161-\u11c2]+"  # a decomposed syllable's vowel and final, after its leading consonant
NO_TOKEN = 0xFFFFFFFF  # what llama.cpp's converter writes for "no such token" (LLAMA_TOKEN_NULL as a u32)
# The id llama.cpp's loader falls back to when a special-token key is out of range (llama_vocab::impl::load)
DEFAULT_IDS = {
    "llama": {"bos": 1, "eos": 2, "unk": 0},
    "gpt2": {"bos": 11, "eos": 11},
    "bert": {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103},
    "t5": {"eos": 1, "unk": 2, "pad": 0},
    "gemma4": {},
}
MODELS = ("gpt2", "llama", "bert", "t5", "gemma4")  # the tokenizer models tfcli rebuilds
# llama.cpp's other tokenizer models, by what they are
OTHER_MODELS = {
    "rwkv": " (RWKV's trie)",
    "plamo2": " (PLaMo 2's)",
    "no_vocab": " (no vocabulary)",
    "none": " (no vocabulary)",
}

# llama.cpp's end-of-generation tokens (llama_vocab::impl::load, llama_vocab_is_eog): eos, eot, eom and the
# FIM pad, repo and file-separator tokens, each from its key or else found by its text, and every token whose
# text is one of EOG_TEXTS.
EOG_KEYS = {
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}
EOG_KEY_TEXTS = {  # the texts llama.cpp finds a token by where its key is absent
    "eot": (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
EOG_TEXTS = frozenset(
    (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "[e~[",
    )
)


def llama_cpp_end_ids(tokens: list[str], ids: dict[str, int], metadata: dict[str, Any]) -> list[int]:
    """The ids llama.cpp ends a generation at, in id order: eos (ids["eos"]), the EOG_KEYS tokens (the key's id, or
    else a token with one of the key's texts), every token whose text is in EOG_TEXTS; less <|end|> where
    <|return|> and <|call|> (or <|calls|> and <|flush|>) are there too (gpt-oss), and less </s> where
    <|tool_response> or <|plamo:eos|> is (Gemma 4, PLaMo). Where a text is twice in the vocabulary, its last id.

    Example: tokens [..., "<|endoftext|>" (0), ..., "<|im_end|>" (5)], eos 0 -> [0, 5]"""
    n = len(tokens)
    by_text = {text: i for i, text in enumerate(tokens)}
    ends = {by_text[text] for text in EOG_TEXTS if text in by_text}
    if "eos" in ids:
        ends.add(ids["eos"])
    for name, key in EOG_KEYS.items():
        value = metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n:
            ends.add(value)
        else:  # llama.cpp takes the first it meets; every eot text is an EOG text anyway
            ends.update([by_text[text] for text in EOG_KEY_TEXTS[name] if text in by_text][:1])
    texts = {tokens[i] for i in ends}
    if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts) or ("<|calls|>" in texts and "<|flush|>" in texts)):
        ends.discard(by_text["<|end|>"])
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        ends.discard(by_text["</s>"])
    return sorted(ends)


def _dropped(key: str, value: int, n: int, default: int | None) -> str:
    """The note for a special-token id past the vocabulary, which tfcli drops as llama.cpp's loader does."""
    said = 'the converter\'s "no such token"' if value == NO_TOKEN else "past the vocabulary"
    if default is not None and default < n:
        return f"metadata {key} is {value:,} ({said}, not a token id below {n:,}): tfcli goes on without it; llama.cpp warns and uses its default id {default}"
    return f"metadata {key} is {value:,} ({said}, not a token id below {n:,}): tfcli goes on without it, as llama.cpp does"


# llama.cpp's pre-tokenizers past the four above, as its BPE tokenizer splits text (llm_tokenizer_bpe in
# src/llama-vocab.cpp): each regex splits the pieces the one before it left, matches and the text between them
# alike, then byte-level BPE runs on each piece. The regexes are llama.cpp's own strings, its adaptations
# included (a case-insensitive group spelled out, \p{Lu} as a lookahead), so that the pieces are its pieces.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_CASED = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+{c}|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*{c}"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
SPLITS: dict[str, tuple[str, ...]] = {
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "gpt2-regex": (GPT2_REGEX,),
    "starcoder": (r"\p{N}", GPT2_REGEX),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "deepseek-v3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!" + '"' + r"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, "[0-9][0-9][0-9]"),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", "[0-9][0-9][0-9]"),  # a file without tokenizer.ggml.pre
    "bloom": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "viking": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"),
    "tekken": (_CASED.replace("{c}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "gpt-4o": (_CASED.replace("{c}", _CONTRACTIONS + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
}


@dataclasses.dataclass(frozen=True)
class Pre:
    """How llama.cpp tokenizes after a `tokenizer.ggml.pre` name: the pre-tokenizer tfcli builds (one of the
    four it writes, or SPLITS' regexes), whether a piece in the vocabulary is taken whole before any merge
    (llama.cpp's ignore_merges), and whether prompts start with bos when the file does not say."""

    splits: str
    ignore_merges: bool = False
    add_bos: bool = False


_LLAMA3 = Pre("llama-bpe", ignore_merges=True, add_bos=True)
# llama.cpp's pre-tokenizer names (llama_vocab::impl::load) -> how tfcli rebuilds them
PRES: dict[str, Pre] = {
    **dict.fromkeys(("gpt-2", "phi-2", "roberta-bpe", "olmo", "mpt", "jais", "trillion", "granite-docling", "exaone4"), Pre("gpt-2")),
    **dict.fromkeys(
        ("jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "jina-v1-en", "jina-v2-code", "gigachat", "a.x-4.0", "mellum", "modern-bert"), Pre("gpt-2")
    ),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"), _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), Pre("llama-bpe")),  # Llama 3's regex, merges as usual
    **dict.fromkeys(("glm4", "glm5"), Pre("llama-bpe", ignore_merges=True)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"), Pre("qwen2")),
    "qwen35": Pre("qwen35"),
    "smollm": Pre("smollm"),
    **dict.fromkeys(("starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"), Pre("starcoder")),
    "deepseek-llm": Pre("deepseek-llm"),
    "deepseek-coder": Pre("deepseek-coder"),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), Pre("deepseek-v3")),
    "falcon": Pre("falcon"),
    "default": Pre("default"),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), Pre("bloom")),
    "viking": Pre("viking"),
    "tekken": Pre("tekken", ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), Pre("gpt-4o")),
    "seed-coder": Pre("seed-coder"),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), Pre("bailingmoe")),
    "grok-2": Pre("qwen2"),
    "ufakzeka": Pre("ufakzeka"),
}
# The name export writes for each pre-tokenizer and ignore_merges (the first name llama.cpp knows it by)
EXPORT_PRES = {(pre.splits, pre.ignore_merges): name for name, pre in reversed(PRES.items())}
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
    "tokenizer.ggml.precompiled_charsmap",
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
    if name in SPLITS:
        return pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in SPLITS[name]), byte_level])
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
    """The `tokenizer.ggml.pre` name llama.cpp tokenizes this byte-level BPE by: its pre-tokenizer, and for the
    Llama 3 regex whether it takes a piece in the vocabulary whole (ignore_merges: llama-bpe, else dbrx)."""
    ignore_merges = bool((spec.get("model") or {}).get("ignore_merges", False))
    for splits in dict.fromkeys(pre.splits for pre in PRES.values()):
        probe = Tokenizer(models.BPE())
        probe.pre_tokenizer = _pre_tokenizer(splits)
        if _without_offsets(spec.get("pre_tokenizer")) == _without_offsets(json.loads(probe.to_str())["pre_tokenizer"]):
            return EXPORT_PRES.get((splits, ignore_merges), EXPORT_PRES.get((splits, not ignore_merges)))
    return None


def _merges(model: dict[str, Any]) -> list[str]:
    """A BPE's merges as GGUF writes them ("a b"), from either form tokenizer.json uses."""
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def _is_sentencepiece_style(spec: dict[str, Any]) -> bool:
    pre, normalizer = spec.get("pre_tokenizer") or {}, spec.get("normalizer") or {}
    if pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE and not normalizer:
        return True
    steps = normalizer.get("normalizers", [normalizer]) if normalizer else []
    spaces_replaced = any(s.get("type") == "Replace" and s.get("pattern") == {"String": " "} and s.get("content") == SPACE for s in steps)
    # Gemma's tokenizer.json splits at " " after its normalizer has replaced every " ": a split that never splits
    splits_nothing = spaces_replaced and pre.get("type") == "Split" and pre.get("pattern") == {"String": " "}
    return (not pre or splits_nothing) and any(s.get("type") == "Replace" and s.get("content") == SPACE for s in steps)


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
    meta["tokenizer.ggml.add_eos_token"] = bool(tokenizer.adds_eos)
    template = tokenizer_config.get("chat_template")
    if isinstance(template, str) and template:
        meta["tokenizer.chat_template"] = template
    return meta


def end_of_generation_keys(tokenizer: TextTokenizer, tokens: list[str], tokenizer_config: dict[str, Any]) -> tuple[dict[str, int], str | None]:
    """The keys that make llama.cpp end where the run ends: a chat run's end-of-turn token and the ids its
    tokenizer_config.json lists (end_of_generation_ids), less eos and those llama.cpp finds by their text
    anyway, as tokenizer.ggml.eot_token_id, then eom_token_id; a note for any left over (GGUF has no third key).

    Example: a ChatML run (<|im_end|> id 5), eos <|endoftext|> -> ({}, None): llama.cpp knows both texts"""
    where = str(tokenizer.path.parent / "tokenizer_config.json")
    ends = list(tokenizer_config.get(END_OF_GENERATION_KEY) or []) if end_of_generation_ids(tokenizer_config, tokenizer.vocab_size, where) else []
    ends = _turn_ends(tokenizer, tokenizer_config, where) + ends
    eos = tokenizer.special_ids.get("eos")
    found = set(llama_cpp_end_ids(tokens, {"eos": eos} if eos is not None else {}, {}))
    unsaid = [i for i in dict.fromkeys(ends) if i is not None and i not in found]
    keys = dict(zip((EOG_KEYS["eot"], EOG_KEYS["eom"]), unsaid))
    if len(unsaid) <= len(keys):
        return keys, None
    left = ", ".join(f"{tokens[i]!r} (id {i})" for i in unsaid[len(keys) :])
    return (
        keys,
        f"llama.cpp will not end a text at {left}: GGUF names two end-of-generation tokens beside eos (eot, eom), and llama.cpp finds others by their text alone",
    )


def _turn_ends(tokenizer: TextTokenizer, tokenizer_config: dict[str, Any], where: str) -> list[int]:
    """The id of the run's chat template's end-of-turn token, where it has one (tfcli's chat stops there)."""
    try:
        template = ChatTemplate.for_tokenizer(tokenizer, tokenizer_config, where)
    except TfcliError:  # a template jinja2 cannot compile travels as it is; its turns end where the file says
        template = None
    if template is None:
        return []
    return [i for i in (tokenizer.hf.token_to_id(text) for text in template.end_of_turn_texts) if i is not None]


def llama_cpp_only_ends_note(tokenizer: TextTokenizer, metadata: dict[str, Any], tokenizer_config: dict[str, Any]) -> str | None:
    """A note naming the tokens the file's `metadata` makes llama.cpp end a text at (by their spelling, as
    `llama_cpp_end_ids` finds them) where tfcli's generate goes on (eos and end_of_generation_ids are its ends),
    with the fix; None where the two end alike.

    Example: a run with special <|end|> (id 5), eos <|endoftext|> -> a note: llama.cpp ends a text at '<|end|>' (id 5), ..."""
    where = str(tokenizer.path.parent / "tokenizer_config.json")
    tokens = metadata["tokenizer.ggml.tokens"]
    eos = metadata.get(ROLE_KEYS["eos"])
    theirs = llama_cpp_end_ids(tokens, {"eos": eos} if eos is not None else {}, metadata)
    ours = end_of_generation_ids(tokenizer_config, tokenizer.vocab_size, where) | {tokenizer.special_ids.get("eos")}
    only = [i for i in theirs if i not in ours]
    if not only:
        return None
    named = ", ".join(f"{tokens[i]!r} (id {i})" for i in only)
    turn_ends = set(_turn_ends(tokenizer, tokenizer_config, where))
    chat = " (its chat does, at the chat template's end of turn)" if set(only) <= turn_ends else ""
    return (
        f"llama.cpp ends a text at {named}, an end of generation to it by the text alone, and tfcli does not{chat}; "
        f"add {only} to {END_OF_GENERATION_KEY} in {where} to stop tfcli there too"
    )


class Vocab:
    """The tokenizer metadata of a file, checked."""

    def __init__(self, metadata: dict[str, Any], where: str) -> None:
        self.where = where
        self.notes: list[str] = []  # what llama.cpp's loader tolerates (it logs and goes on), and what tfcli did with it
        self.kind = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if self.kind is None or tokens is None:
            missing = "tokenizer.ggml.model" if self.kind is None else "tokenizer.ggml.tokens"
            raise TfcliError(f"{where} has no tokenizer (metadata {missing} is missing)", hint="tfcli needs the tokenizer inside the GGUF file")
        if self.kind not in MODELS:  # the model first: its own keys would hide the real reason
            what = OTHER_MODELS.get(self.kind, "")
            raise TfcliError(
                f"{where}: metadata tokenizer.ggml.model is {self.kind!r}{what}; tfcli rebuilds gpt2 (byte-level BPE), llama (SentencePiece-style), "
                "bert (WordPiece), t5 (Unigram) and gemma4 (BPE over UTF-8) tokenizers from GGUF"
            )
        for key in metadata:
            if key.startswith("tokenizer.") and key not in TOKENIZER_KEYS and not key.startswith("tokenizer.chat_template."):
                raise TfcliError(f"{where}: metadata {key} is not something tfcli's tokenizer can express")
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
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TfcliError(f"{where}: metadata {key} is {value!r}, not a token id below {n:,}")
            if value >= n:  # llama.cpp's loader warns "bad special token" and goes on without it
                self.notes.append(_dropped(key, value, n, DEFAULT_IDS[self.kind].get(role)))
                continue
            self.ids[role] = value
        self.add_space_prefix = self._flag(metadata, "tokenizer.ggml.add_space_prefix", True)
        # llama.cpp's llama_tokenize(add_special=true) ends a text with eos where add_eos_token says (its default: true
        # for t5, false for the others); bert's WPM always ends it with [SEP], and add_sep_token counts only in llama.cpp's
        # reranking prompts (query and document joined), which tfcli does not make: read for its type, then left be
        self.add_eos = self._flag(metadata, "tokenizer.ggml.add_eos_token", self.kind == "t5")
        self._flag(metadata, "tokenizer.ggml.add_sep_token", False)
        # read by llama.cpp's Unigram (t5) tokenizer only; the others go on without it, as tfcli does
        self.remove_extra_whitespaces = self._flag(metadata, "tokenizer.ggml.remove_extra_whitespaces", False)
        if self.remove_extra_whitespaces and self.kind != "t5":
            self.notes.append(f"metadata tokenizer.ggml.remove_extra_whitespaces is true: llama.cpp's {self.kind} tokenizer does not read it, nor does tfcli")
        self.charsmap = self._charsmap(metadata)
        bos_default = self.kind in ("llama", "bert")  # llama.cpp's WPM starts with [CLS] (its bos) and ends with [SEP]
        if self.kind in ("bert", "t5") and "unk" not in self.ids:  # llama.cpp falls back to BERT's [UNK] (id 100), T5's <unk> (2)
            unk = DEFAULT_IDS[self.kind]["unk"]
            if unk >= n:
                raise TfcliError(f"{where}: a {self.kind} vocabulary needs metadata tokenizer.ggml.unknown_token_id, the token of text no piece spells")
            self.ids["unk"] = unk
            self.notes.append(f"no metadata tokenizer.ggml.unknown_token_id: text no piece spells is {self.tokens[unk]!r} (id {unk}), as llama.cpp takes it")
        if self.kind == "gpt2":
            pre = metadata.get("tokenizer.ggml.pre")
            if pre is None:  # llama.cpp: "missing pre-tokenizer type, using: 'default'" (older files: Aquila, GPT-NeoX)
                self.notes.append("no metadata tokenizer.ggml.pre: tfcli splits text with llama.cpp's 'default' regexes, as llama.cpp does")
                pre = "default"
            if pre not in PRES:
                raise TfcliError(
                    f"{where}: metadata tokenizer.ggml.pre is {pre!r}; tfcli rebuilds the {len(PRES)} pre-tokenizers llama.cpp splits by regexes "
                    "alone (gpt-2, llama-bpe, qwen2, smollm, deepseek-coder, falcon, starcoder, gpt-4o, tekken, ...), not those it splits by hand",
                    hint="llama.cpp splits the text of that name by code of its own, which a Hugging Face pre-tokenizer cannot express",
                )
            self.pre, self.ignore_merges, bos_default = PRES[pre].splits, PRES[pre].ignore_merges, PRES[pre].add_bos
        if self.kind in ("gpt2", "gemma4"):
            merges = metadata.get("tokenizer.ggml.merges")
            if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m[1:] for m in merges):
                raise TfcliError(f"{where}: metadata tokenizer.ggml.merges is missing or not a list of 'a b' pairs")
            self.merges = merges
        # whether prompts start with bos when the file does not say: llama.cpp's default for the tokenizer (Gemma 4's
        # bos always: llama.cpp overrides a file that says false)
        self.add_bos = self._flag(metadata, "tokenizer.ggml.add_bos_token", bos_default) or self.kind == "gemma4"
        if self.add_eos and "eos" not in self.ids:
            eos = DEFAULT_IDS[self.kind].get("eos")
            if self.kind == "t5" and ROLE_KEYS["eos"] not in metadata and eos < n:  # llama.cpp's UGM takes T5's </s> (id 1)
                self.ids["eos"] = eos
                self.notes.append(f"no metadata tokenizer.ggml.eos_token_id: texts end with {self.tokens[eos]!r} (id {eos}), as llama.cpp ends them")
            else:  # llama.cpp loads the file, then stops at the first text it tokenizes with its special tokens
                self.notes.append("metadata tokenizer.ggml.add_eos_token is true, but the file names no eos token: tfcli's prompts end without one")
                self.add_eos = False
        template = metadata.get("tokenizer.chat_template")
        self.chat_template = template if isinstance(template, str) and template else None
        self.end_ids = llama_cpp_end_ids(self.tokens, self.ids, metadata)  # where llama.cpp ends a generation

    def _numbers(self, metadata: dict[str, Any], key: str, n: int, default: list, number: type = int) -> list:
        value = metadata.get(key)
        if value is None:
            return default
        if isinstance(value, list) or getattr(value, "ndim", 0) != 1 or len(value) != n:
            raise TfcliError(f"{self.where}: metadata {key} is not {n:,} numbers, one a token")
        return [number(v) for v in value.tolist()]

    def _charsmap(self, metadata: dict[str, Any]) -> bytes | None:
        """SentencePiece's precompiled character map (t5 only: llama.cpp's other tokenizers do not read it)."""
        value = metadata.get("tokenizer.ggml.precompiled_charsmap")
        if value is None or self.kind != "t5":
            return None
        if isinstance(value, list) or getattr(value, "dtype", None) is None or value.dtype.itemsize != 1 or value.ndim != 1:
            raise TfcliError(f"{self.where}: metadata tokenizer.ggml.precompiled_charsmap is not an array of bytes")
        data = value.astype("uint8").tobytes()
        blob = int.from_bytes(data[:4], "little") if len(data) >= 4 else len(data)
        if blob + 4 >= len(data):  # llama.cpp: "Index out of array bounds in precompiled charsmap!"
            raise TfcliError(f"{self.where}: metadata tokenizer.ggml.precompiled_charsmap is cut short (its table claims {blob:,} of {len(data):,} bytes)")
        return data

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
        if self.kind == "bert":
            hf = self._wordpiece()
        elif self.kind == "t5":
            hf = self._unigram()
        elif self.kind == "gpt2":
            pairs = [tuple(m.split(" ", 1)) for m in self.merges]
            try:
                hf = Tokenizer(models.BPE(vocab, pairs, ignore_merges=self.ignore_merges))
            except Exception as exc:  # tokenizers raises a plain Exception for merges of unknown tokens
                raise TfcliError(f"{self.where}: metadata tokenizer.ggml.merges do not fit its tokens ({str(exc).splitlines()[0]})") from None
            hf.pre_tokenizer = _pre_tokenizer(self.pre)
            hf.decoder = decoders.ByteLevel()
        elif self.kind == "gemma4":
            hf = self._gemma4(vocab)
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
        template = self._template()
        if template is not None:  # read from its JSON (a token's text may hold any character), by an empty tokenizer
            shell = json.loads(Tokenizer(models.BPE()).to_str())
            hf.post_processor = Tokenizer.from_str(json.dumps({**shell, "post_processor": template})).post_processor
        return hf.to_str(pretty=True)

    def _template(self) -> dict[str, Any] | None:
        """What llama.cpp's llama_tokenize(add_special=true) puts around a text, as tokenizer.json's post-processor
        (transformers encodes with it; tfcli inserts the ids itself): bos first and eos last where the file asks
        (add_bos_token, add_eos_token, else llama.cpp's defaults), a WordPiece's [CLS] first and [SEP] last always
        (llama.cpp's WPM adds both, whatever the file says: its bos, else id 101; tfcli takes the file's
        cls_token_id before that default, which llama.cpp does not read). None where nothing is added. A pair: each
        text so, one after the other (BERT's: [CLS] A [SEP] B [SEP]).

        Example: add_bos and add_eos, <s> and </s> -> single <s> $A </s>, pair <s> $A </s> <s> $B </s>
        """
        if self.kind == "bert":
            first = self.ids.get("bos", self.ids.get("cls", DEFAULT_IDS["bert"]["bos"]))
            last: int | None = self.ids.get("sep", DEFAULT_IDS["bert"]["sep"])
            if max(first, last) >= len(self.tokens):
                return None
        else:
            first = self.ids.get("bos") if self.add_bos else None
            last = self.ids.get("eos") if self.add_eos else None
        if first is None and last is None:
            return None

        def text(sequence: str, type_id: int, with_first: bool = True) -> list[dict[str, Any]]:
            around = [("first", first if with_first else None), ("text", None), ("last", last)]
            pieces = []
            for place, token_id in around:
                if place == "text":
                    pieces.append({"Sequence": {"id": sequence, "type_id": type_id}})
                elif token_id is not None:
                    pieces.append({"SpecialToken": {"id": self.tokens[token_id], "type_id": type_id}})
            return pieces

        ends = [i for i in (first, last) if i is not None]
        return {
            "type": "TemplateProcessing",
            "single": text("A", 0),
            "pair": text("A", 0) + text("B", 1, with_first=self.kind != "bert"),
            "special_tokens": {self.tokens[i]: {"id": self.tokens[i], "ids": [i], "tokens": [self.tokens[i]]} for i in ends},
        }

    def _wordpiece(self) -> Tokenizer:
        """llama.cpp's WPM tokenizer as a WordPiece: each piece spelled as BERT spells it (U+2581 + piece: a word's
        start, written without it; any other piece: a continuation, written after ##; [bracketed] pieces as they are,
        the converter's own rule backwards), the text decomposed, its marks dropped and lowercased, split as BERT
        splits it, words of any length matched."""
        vocab: dict[str, int] = {}
        for i, (token, kind) in enumerate(zip(self.tokens, self.types)):
            if kind in (CONTROL, UNKNOWN, USER_DEFINED) or (token.startswith("[") and token.endswith("]")):
                spelled = token
            else:
                spelled = token[1:] if token.startswith(SPACE) else f"##{token}"
            if spelled in vocab:
                raise TfcliError(f"{self.where}: metadata tokenizer.ggml.tokens spells the WordPiece piece {spelled!r} twice (ids {vocab[spelled]} and {i})")
            vocab[spelled] = i
        hf = Tokenizer(models.WordPiece(vocab, unk_token=self.tokens[self.ids["unk"]], max_input_chars_per_word=1 << 30))
        hf.normalizer = normalizers.Sequence(
            [
                normalizers.NFD(),
                # llama.cpp's NFD keeps the first code point of a character's decomposition: a Hangul syllable
                # is its leading consonant alone (conjoining vowels and finals typed as such stay, which tfcli drops too)
                normalizers.Replace(Regex(HANGUL_TAIL), ""),
                normalizers.Replace(Regex(r"\p{M}+"), ""),  # and it drops every mark, accents and vowel signs alike
                normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True),
            ]
        )
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        hf.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        return hf

    def _unigram(self) -> Tokenizer:
        """llama.cpp's UGM tokenizer as a Unigram over the whole normalized text (no pre-tokenizer: llama.cpp's
        Viterbi runs over all of it), with its unknown token's score (the lowest piece's less 10, as both compute it)."""
        if len(set(self.tokens)) != len(self.tokens):
            twice = next(t for i, t in enumerate(self.tokens) if t in self.tokens[:i])
            raise TfcliError(f"{self.where}: metadata tokenizer.ggml.tokens lists {twice!r} twice")
        # llama.cpp's UGM spells a piece-less character with the unknown token, byte pieces or not (no byte fallback)
        hf = Tokenizer(models.Unigram(list(zip(self.tokens, self.scores)), unk_id=self.ids["unk"], byte_fallback=False))
        steps = []
        if self.charsmap:
            # tokenizers maps a grapheme at a time, and "\r\n" is one; llama.cpp maps "\r", then "\n"
            charsmap = normalizers.Precompiled(self.charsmap)
            steps = [normalizers.Replace("\r\n", charsmap.normalize_str("\r") + charsmap.normalize_str("\n")), charsmap]
        if self.remove_extra_whitespaces:  # llama.cpp: no space before or after the text, one between its words
            steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
        if self.add_space_prefix:  # one space before the first character that is not one (none in text of spaces alone)
            steps += [normalizers.Prepend(SPACE), normalizers.Replace(Regex(f"^{SPACE}(?= *$)"), "")]
        hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
        tail = [decoders.Strip(" ", 1, 0)] if self.add_space_prefix else []
        hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *tail])
        return hf

    def _gemma4(self, vocab: dict[str, int]) -> Tokenizer:
        """llama.cpp's Gemma 4 tokenizer (LLAMA_VOCAB_PRE_TYPE_GEMMA4): spaces written as U+2581, the text split into
        its lines and its runs of newlines alone, the merges run on the UTF-8 characters (no byte-level alphabet), a
        character no piece spells written with the byte pieces <0xXX>."""
        try:
            hf = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in self.merges], byte_fallback=True))
        except Exception as exc:  # tokenizers raises a plain Exception for merges of unknown tokens
            raise TfcliError(f"{self.where}: metadata tokenizer.ggml.merges do not fit its tokens ({str(exc).splitlines()[0]})") from None
        hf.normalizer = normalizers.Replace(" ", SPACE)
        hf.pre_tokenizer = pre_tokenizers.Split(Regex("[^\n]+|\n+"), behavior="isolated")
        hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
        return hf

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
        config["add_eos_token"] = self.add_eos  # for tfcli; transformers 5 reads tokenizer.json's post-processor instead
        config["split_special_tokens"] = True
        if set(self.end_ids) - {self.ids.get("eos")}:
            config[END_OF_GENERATION_KEY] = self.end_ids
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config
