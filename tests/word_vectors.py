"""What the word-vector tests share: sample_data's stories as word-level shards, the same corpus as gensim's
sentences, and gensim itself (which CI must have: a missing gensim fails there, skips elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tests.conftest import SAMPLE_DATA
from tests.helpers import missing_tool


def require_gensim():
    try:
        import gensim  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        missing_tool("gensim is not installed (pip install gensim, the word2vec extra)")
    from gensim.models import Word2Vec

    return Word2Vec


def word_shards(folder: Path) -> Path:
    """A lowercased word-level tokenizer and shards of sample_data's stories in `folder` (shards/, tokenizer/)."""
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    corpus = resolve_corpus([SAMPLE_DATA / "corpus"])
    train_tokenizer(corpus, folder / "tokenizer", TokenizerTrainingConfig(model="word", lowercase=True))
    encode_corpus(resolve_corpus([SAMPLE_DATA / "corpus"]), TextTokenizer.load(folder / "tokenizer" / "tokenizer.json"), folder / "shards", val_fraction=0.05)
    return folder / "shards"


def sentences(shards: Path) -> list[list[str]]:
    """train.bin as gensim reads a corpus: one list of words per document (special tokens end one)."""
    from tfcli.data.shards import open_shard
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(shards.parent / "tokenizer" / "tokenizer.json")
    ids = np.asarray(open_shard(shards, "train"))
    breaks = np.isin(ids, list(tokenizer.special_ids.values()))
    words = [tokenizer.hf.id_to_token(i) for i in range(tokenizer.vocab_size)]
    out, current = [], []
    for token_id, is_break in zip(ids.tolist(), breaks.tolist()):
        if is_break:
            if current:
                out.append(current)
            current = []
        else:
            current.append(words[token_id])
    if current:
        out.append(current)
    return out
