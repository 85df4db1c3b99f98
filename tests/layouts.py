"""Tokenizer layouts as the hub ships them, built locally with `tokenizers` (no network): GPT-2's byte-level
BPE, Llama 2's SentencePiece BPE (a normalizer, byte fallback, and a Replace/ByteFallback/Fuse/Strip decoder),
a Metaspace Unigram (T5 / newer Llama), BERT's WordPiece, and tfcli's own families."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tfcli.corpus.reader import resolve_corpus
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

CORPUS = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.\n"
    'One day, they went to the beach. They saw a big box!  Tom said: "Let\'s open it."\n'
    "Lily was happy, so she played with the red ball and the blue kite.\n"
) * 4 + "The café was naïve, the résumé was déjà vu.\n" * 2
LLAMA_SPECIALS = ["<unk>", "<s>", "</s>"]
HUB_LAYOUTS = ["gpt2", "llama2", "metaspace-unigram", "bert"]
TFCLI_LAYOUTS = ["tfcli-bpe", "tfcli-bpe-whitespace", "tfcli-wordpiece", "tfcli-unigram", "tfcli-char"]


def _words(text: str) -> list[str]:
    return re.findall(r"\S+", text)


def llama2_tokenizer(folder: Path) -> Path:
    """Llama 2's layout: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer, a BPE with byte fallback
    (`<0x00>`..`<0xFF>` after <unk> <s> </s>), <s> put first, and the decoder Replace → ByteFallback → Fuse → Strip."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    base = Tokenizer(models.BPE())
    base.normalizer = normalizer
    base.train_from_iterator(_words(CORPUS), trainers.BpeTrainer(vocab_size=200, show_progress=False))
    spec = json.loads(base.to_str())["model"]
    vocab = {token: i for i, token in enumerate(LLAMA_SPECIALS + [f"<0x{b:02X}>" for b in range(256)])}
    for token, _ in sorted(spec["vocab"].items(), key=lambda pair: pair[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizer
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens(LLAMA_SPECIALS)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def _hub_tokenizer(layout: str, folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if layout == "llama2":
        return llama2_tokenizer(folder)
    if layout == "gpt2":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"], show_progress=False
        )
    elif layout == "metaspace-unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
        trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False)
    else:  # bert
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(cleanup=True)
        trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False)
    tokenizer.train_from_iterator(CORPUS.splitlines(), trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def build_layout(layout: str, folder: Path) -> Path:
    """A folder holding the layout's tokenizer.json (and tokenizer_config.json where it has one)."""
    if layout in HUB_LAYOUTS:
        return _hub_tokenizer(layout, folder)
    family = layout.removeprefix("tfcli-")
    options = {"model": family, "vocab_size": {"bpe": 320, "bpe-whitespace": 320, "wordpiece": 200, "unigram": 150, "char": 100}[family]}
    if family == "bpe-whitespace":
        options |= {"model": "bpe", "pre_tokenizer": "whitespace"}
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    train_tokenizer(resolve_corpus([corpus]), folder / "tok", TokenizerTrainingConfig(**options))
    return folder / "tok"
