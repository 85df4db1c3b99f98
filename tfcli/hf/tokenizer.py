"""A Hugging Face folder's tokenizer, written into a run directory as tokenizer.json + tokenizer_config.json.

Whatever the folder holds: tokenizer.json (BPE, WordPiece, Unigram...), GPT-2's vocab.json + merges.txt,
or BERT's vocab.txt alone; padding and truncation saved in a tokenizer.json are off in the run's copy (as
transformers encodes with it: `without_padding`), and a CLIP-style "</w>" BPE gets the decoder transformers decodes
it with (`decoder_for_word_suffix`). The roles of its special tokens (bos, eos, pad, unk, mask,
cls, sep) come from tokenizer_config.json and special_tokens_map.json, merged into the run's tokenizer_config.json,
with the chat template of chat_template.jinja where the folder has one (as transformers 4.50 and later save it),
and every id transformers' generate stops at (generation_config.json's eos_token_id, often a list) where they are
more than the eos token (`end_of_generation_ids`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from tfcli import limits
from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_json, atomic_write_text, refuse_git_lfs_pointer
from tfcli.hf.folder import read_json_object
from tfcli.jsontext import dumps_json, loads_json
from tfcli.limits import read_text_capped
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer, decoder_for_word_suffix
from tfcli.tokenizer.specials import CONFIG_KEYS, END_OF_GENERATION_KEY, LOADED_ROLES

SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
GENERATION_CONFIG_FILE = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # transformers' own file for the template; it wins over tokenizer_config.json's
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or {"content": text, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _byte_level_bpe(src: Path) -> str:
    for name in ("vocab.json", "merges.txt"):
        if (src / name).stat().st_size > limits.TOKENIZER_FILE.value:
            raise limits.TOKENIZER_FILE.exceeded(str(src / name))
    try:
        hf = Tokenizer(models.BPE.from_file(str(src / "vocab.json"), str(src / "merges.txt")))
    except Exception as exc:  # tokenizers raises a plain Exception for a bad file
        raise TfcliError(f"{src / 'vocab.json'} and merges.txt do not make a BPE tokenizer ({str(exc).splitlines()[0]})") from exc
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    if hf.token_to_id("<|endoftext|>") is not None:
        hf.add_special_tokens(["<|endoftext|>"])
    return hf.to_str(pretty=True)


def _wordpiece(src: Path, settings: dict[str, Any]) -> str:
    """BERT's tokenizer from vocab.txt, one token a line, as transformers builds it (BertTokenizerFast)."""
    try:
        lines = read_text_capped(src / "vocab.txt", limits.TOKENIZER_FILE).split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise TfcliError(f"cannot read {src / 'vocab.txt'} ({exc})") from exc
    if lines and lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for token in lines:
        vocab.setdefault(token.rstrip("\r"), len(vocab))
    if len(vocab) != len(lines) or not vocab:
        raise TfcliError(f"{src / 'vocab.txt'} is empty or lists a token twice")
    unk = _token_text(settings.get("unk_token")) or "[UNK]"
    if unk not in vocab:
        raise TfcliError(f"{src / 'vocab.txt'} has no unknown token {unk!r}", hint="WordPiece needs one; name it in tokenizer_config.json as unk_token")
    hf = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)),
        strip_accents=settings.get("strip_accents"),
        lowercase=bool(settings.get("do_lower_case", True)),
    )
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    named = [_token_text(settings.get(CONFIG_KEYS[role])) for role in LOADED_ROLES]
    hf.add_special_tokens([t for t in dict.fromkeys([*BERT_SPECIALS, *named]) if t is not None and t in vocab])
    return hf.to_str(pretty=True)


def _roles(src: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json's settings, with the special tokens special_tokens_map.json names where it does not."""
    merged = dict(settings)
    if (src / SPECIAL_TOKENS_MAP_FILE).is_file():
        for role in LOADED_ROLES:
            key = CONFIG_KEYS[role]
            text = _token_text(read_json_object(src / SPECIAL_TOKENS_MAP_FILE).get(key))
            if text is not None and _token_text(merged.get(key)) is None:
                merged[key] = text
    return merged


def _chat_template(src: Path) -> str | None:
    """The template of the folder's chat_template.jinja, or None without one."""
    path = src / CHAT_TEMPLATE_FILE
    if not path.is_file():
        return None
    try:
        return read_text_capped(path, limits.CHAT_TEMPLATE_FILE)
    except (OSError, UnicodeDecodeError) as exc:
        raise TfcliError(f"cannot read {path} ({exc})", hint="download it again, or delete it to import the model without its chat template") from exc


def generation_end_ids(src: Path) -> list[int]:
    """The ids transformers' generate stops at for the folder's model: generation_config.json's eos_token_id
    (one id or a list), or, without that file, config.json's (GenerationConfig.from_model_config); [] where
    neither names one. What is not an id (null, -1) is left out.

    Example: generation_config.json {"eos_token_id": [151645, 151643]} -> [151645, 151643]"""
    for name in (GENERATION_CONFIG_FILE, "config.json"):
        if (src / name).is_file():
            path = src / name
            value = read_json_object(path).get("eos_token_id")
            ids = value if isinstance(value, list) else [value]
            return list(dict.fromkeys(i for i in ids if isinstance(i, int) and not isinstance(i, bool) and i >= 0))
    return []


def _record_end_ids(src: Path, vocabulary: Tokenizer, settings: dict[str, Any]) -> list[str]:
    """Put the ids generation stops at into settings (tokenizer_config.json) where they are more than the
    eos token; returns notes for ids past the tokenizer's vocabulary, which tfcli never writes."""
    ids = generation_end_ids(src)
    size = vocabulary.get_vocab_size(with_added_tokens=True)
    past = [i for i in ids if i >= size]
    kept = [i for i in ids if i < size]
    eos = _token_text(settings.get(CONFIG_KEYS["eos"]))
    eos_id = vocabulary.token_to_id(eos) if eos is not None else None
    if set(kept) - {eos_id}:
        settings[END_OF_GENERATION_KEY] = kept
    return [f"eos_token_id {i} is past the tokenizer's {size:,} tokens: tfcli never writes it, so it ends no text" for i in past]


def without_padding(text: str) -> str:
    """tokenizer.json text with its padding and truncation off (`null`), as transformers encodes with it: a
    sentence-transformers file pads every text to a multiple of 8 and cuts it at 256 tokens, which would
    travel with the run to every other tool. The rest of the file is kept as it is; a file without either
    comes back unchanged, byte for byte.

    Example: '{..., "truncation": {"max_length": 256, ...}, "padding": {...}, ...}' -> '{..., "truncation": null, "padding": null, ...}'
    """
    spec = loads_json(text, finite=False)
    if not isinstance(spec, dict) or (spec.get("padding") is None and spec.get("truncation") is None):
        return text
    spec.update({key: None for key in ("truncation", "padding") if key in spec})
    return dumps_json(spec, indent=2) + "\n"


def import_tokenizer(src: Path, run_dir: Path) -> tuple[TextTokenizer, list[str]]:
    """Write the folder's tokenizer into run_dir; returns it and notes (special tokens named but absent)."""
    settings = read_json_object(src / TOKENIZER_CONFIG_FILE) if (src / TOKENIZER_CONFIG_FILE).is_file() else {}
    settings = _roles(src, settings)
    template = _chat_template(src)
    if template is not None:
        settings["chat_template"] = template
    if (src / TOKENIZER_FILE).is_file():
        try:
            text = read_text_capped(src / TOKENIZER_FILE, limits.TOKENIZER_FILE)
        except (OSError, UnicodeDecodeError) as exc:
            raise TfcliError(f"cannot read {src / TOKENIZER_FILE} ({exc})") from exc
    elif (src / "vocab.json").is_file() and (src / "merges.txt").is_file():
        text = _byte_level_bpe(src)
    elif (src / "vocab.txt").is_file():
        text = _wordpiece(src, settings)
    elif (src / "tokenizer.model").is_file():
        raise TfcliError(
            f"{src} has a SentencePiece tokenizer.model but no tokenizer.json",
            hint="write one with transformers: AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)",
        )
    else:
        raise TfcliError(
            f"{src} has no tokenizer (tokenizer.json, vocab.json and merges.txt, or vocab.txt)", hint="copy the model's tokenizer files into the folder"
        )
    try:
        vocabulary = Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a plain Exception for bad JSON
        if (src / TOKENIZER_FILE).is_file():
            refuse_git_lfs_pointer(src / TOKENIZER_FILE)
        raise TfcliError(f"{src / TOKENIZER_FILE} is not a tokenizer.json ({str(exc).splitlines()[0] if str(exc) else exc})") from exc
    written = without_padding(text)
    suffix_decoder = decoder_for_word_suffix(vocabulary)
    if suffix_decoder is not None:  # CLIP's "</w>": the run's file gets the decoder transformers decodes with
        vocabulary.decoder = suffix_decoder
        spec = loads_json(written, finite=False)
        spec["decoder"] = loads_json(vocabulary.to_str(), finite=False)["decoder"]
        written = dumps_json(spec, indent=2) + "\n"
    atomic_write_text(run_dir / TOKENIZER_FILE, written)
    notes = []
    for role in LOADED_ROLES:  # a role naming a token the vocabulary lacks is dropped, and said
        key = CONFIG_KEYS[role]
        token = _token_text(settings.get(key))
        if token is not None and vocabulary.token_to_id(token) is None:
            notes.append(f"{key} {token!r} is not in the vocabulary; the tokenizer has no {role} token")
            settings[key] = None
    notes += _record_end_ids(src, vocabulary, settings)
    if settings:
        atomic_write_json(run_dir / TOKENIZER_CONFIG_FILE, json.loads(json.dumps(settings, default=str)))
    return TextTokenizer.load(run_dir / TOKENIZER_FILE), notes
