"""A faster encoder for byte-level BPE: the same tokenizer rebuilt as a tiktoken encoding, used only where
it provably gives the ids `tokenizers` gives. It never changes what a tokenizer means; without tiktoken, or
for any other tokenizer, `fast_encoder` says why not and the caller stays with `tokenizers`.

Why the ids are the same (`fast_encoder` checks each condition on the tokenizer.json):

- Text is split alike: no normalizer; a ByteLevel pre-tokenizer without a prefix space whose regex is GPT-2's,
  which tiktoken runs as its `pat_str`; no post-processor but ByteLevel (which only
  moves offsets); every added token special, so with special tokens split (as tfcli always encodes user text)
  none is matched in text, and a literal `<|endoftext|>` is ordinary text on both sides.
- Each piece is merged alike. tokenizers repeatedly applies the adjacent merge of lowest rank (leftmost on
  ties); tiktoken the adjacent pair whose concatenation has the lowest id, and takes a piece that is itself a
  token whole. When (1) the model is plain BPE over the 256 byte symbols (no dropout, prefixes, suffixes or
  byte fallback), (2) each multi-byte token is made by exactly one merge and ids grow with the merge rank,
  and (3) every multi-byte token t, encoded alone by the model, comes out as t itself, the two agree: if in
  some state two adjacent parts x, y formed a token t with (x, y) not t's merge and rank(t) no later than
  the next merge, then encoding t's bytes alone (which ends in t by 3) crosses the x|y boundary with a merge
  of rank below rank(t) that the state would already have applied; so tiktoken never sees a pair tokenizers
  would not merge before the pair tokenizers merges, and a whole-piece token is what tokenizers makes too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from tfcli.corpus.reader import replace_lone_surrogates

if TYPE_CHECKING:
    import numpy as np

    from tfcli.tokenizer.core import TextTokenizer

# The regex of tokenizers' ByteLevel pre-tokenizer (use_regex=True), which is GPT-2's, spelled as there.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENCODER_ENV = "TFCLI_ENCODER"  # "tokenizers" keeps every encode on tokenizers (to compare, or to rule tiktoken out)
# tiktoken scans text for its special tokens even when none is allowed; with none registered its pattern is
# empty and matches everywhere (slow). One that is never allowed keeps the scan cheap and changes nothing.
_UNUSED_SPECIAL = "<|tfcli-never-matched|>"


def byte_of_symbol() -> dict[str, int]:
    """The inverse of GPT-2's bytes-to-unicode table: the printable stand-in character -> the byte. Only to
    spell a byte-level vocabulary as tiktoken's byte strings; text never comes out through it."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class FastEncoder:
    """Encodes texts with tiktoken into uint32 arrays, the batch split over a few threads (tiktoken
    releases the GIL while it encodes)."""

    name = "tiktoken"

    def __init__(self, encoding: Any, threads: int | None = None) -> None:
        self.encoding = encoding
        if threads is None:
            threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="tfcli-tiktoken") if self.threads > 1 else None

    def encode(self, text: str) -> np.ndarray:
        return self.encoding.encode_to_numpy(replace_lone_surrogates(text), disallowed_special=())

    def _encode_all(self, texts: Sequence[str]) -> list[np.ndarray]:
        encode = self.encoding.encode_to_numpy
        return [encode(replace_lone_surrogates(t), disallowed_special=()) for t in texts]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of many texts, in order: contiguous slices of the batch, one per thread."""
        if self._pool is None or len(texts) < 2:
            return self._encode_all(texts)
        step = -(-len(texts) // self.threads)
        slices = [texts[i : i + step] for i in range(0, len(texts), step)]
        return [ids for part in self._pool.map(self._encode_all, slices) for ids in part]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def fast_encoder(tokenizer: TextTokenizer, threads: int | None = None) -> tuple[FastEncoder | None, str]:
    """A tiktoken encoder equivalent to `tokenizer` (see the module docstring), or None and why not."""
    if os.environ.get(ENCODER_ENV, "").strip().lower() == "tokenizers":
        return None, f"{ENCODER_ENV}=tokenizers"
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    if not hasattr(tiktoken.Encoding, "encode_to_numpy"):
        return None, "tiktoken is older than 0.8"
    spec = tokenizer.spec
    ranks, why = tiktoken_ranks(spec, tokenizer.hf.model)
    if ranks is None:
        return None, why
    encoding = tiktoken.Encoding(
        name=f"tfcli-{tokenizer.sha256[:12]}", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={_UNUSED_SPECIAL: max(ranks.values()) + 1}
    )
    return FastEncoder(encoding, threads), ""


def tiktoken_ranks(spec: dict, model: Any) -> tuple[dict[bytes, int] | None, str]:
    """The mergeable ranks (token bytes -> id) of a tokenizer.json (`spec`, parsed) whose ids tiktoken
    reproduces, or None and the first condition it fails. `model` is its tokenizers model (to check that
    every token encodes to itself)."""
    # a file's padding and truncation are switched off when tfcli loads it (as transformers encodes), so they do not count
    if spec.get("normalizer"):
        return None, f"it has a normalizer ({spec['normalizer'].get('type')})"
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        return None, "its pre-tokenizer is not byte-level with GPT-2's regex and no prefix space"
    post = spec.get("post_processor")
    if post and post.get("type") != "ByteLevel":
        return None, f"it has a post-processor ({post.get('type')})"
    bpe = spec.get("model") or {}
    if bpe.get("type") != "BPE":
        return None, f"its model is {bpe.get('type')}, not BPE"
    if bpe.get("dropout") or bpe.get("continuing_subword_prefix") or bpe.get("end_of_word_suffix") or bpe.get("byte_fallback"):
        return None, "its BPE has dropout, a subword prefix, a word suffix or byte fallback"
    added = spec.get("added_tokens") or []
    if any(not t.get("special") for t in added):
        return None, "it has added tokens that are not special (they would be matched in text)"
    added_ids = {t["id"] for t in added}
    byte_of = byte_of_symbol()
    vocab: dict[str, int] = bpe.get("vocab") or {}
    ranks: dict[bytes, int] = {}
    for token, token_id in vocab.items():
        if token_id in added_ids:
            continue
        if not all(ch in byte_of for ch in token):
            return None, f"its token {token!r} is not made of byte-level symbols"
        ranks[bytes(byte_of[ch] for ch in token)] = token_id
    if len(ranks) != len(vocab) - sum(1 for i in vocab.values() if i in added_ids):
        return None, "two of its tokens stand for the same bytes"
    if any(bytes([b]) not in ranks for b in range(256)):
        return None, "its vocabulary lacks some of the 256 bytes"
    previous = -1
    products: set[str] = set()
    for merge in bpe.get("merges") or []:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        product = left + right
        product_id = vocab.get(product)
        if product_id is None or left not in vocab or right not in vocab or product_id in added_ids:
            return None, f"its merge {left!r} + {right!r} makes no token of the vocabulary"
        if product in products:
            return None, f"two merges make {product!r}"
        if product_id <= previous:
            return None, "its token ids do not grow with the merge order"
        products.add(product)
        previous = product_id
    for token, token_id in vocab.items():
        if token_id in added_ids or len(token) < 2:
            continue
        if token not in products:
            return None, f"its token {token!r} is made by no merge"
        if [t.id for t in model.tokenize(token)] != [token_id]:
            return None, f"its token {token!r}, encoded alone, does not come out as itself"
    return ranks, ""
