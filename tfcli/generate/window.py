"""The context window a decoding loop runs over: each row's tokens, which are real (not left padding), and
the KV cache over them; `start` runs the prompts, `push` one new token per row.

Each step feeds one new token per row through the cache and scores only the last position. Past the
context the window slides: when it is full, the last `keep` tokens are run again to rebuild the cache
(this works for learned, sinusoidal and rotary positions alike, since every position restarts from 0).
Rows of different lengths are left-padded; each row's positions count its own real tokens, so a batched
row decodes exactly as it would alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from tfcli.model.attention import KVCache
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.specials import read_end_of_generation_ids


@dataclasses.dataclass
class Vocabulary:
    """What the loop needs from the tokenizer: the ids it may choose, the end-of-text id and every id that ends
    a text (eos and what the run's files add: a downloaded model's end-of-turn tokens)."""

    limit: int  # ids >= limit are never chosen (a model's vocabulary may be larger than its tokenizer's)
    eos_id: int | None
    pad_id: int
    suppressed: list[int]  # special ids that are never generated (pad, mask, cls, unk)
    end_ids: frozenset[int] = frozenset()  # ids that end a text: eos and tokenizer_config.json's end_of_generation_ids

    @classmethod
    def of(cls, tokenizer: TextTokenizer, model_vocab: int) -> Vocabulary:
        specials = tokenizer.special_ids
        eos = specials.get("eos")
        limit = min(tokenizer.vocab_size, model_vocab)
        recorded = read_end_of_generation_ids(tokenizer.path.parent, tokenizer.vocab_size)
        end_ids = frozenset(i for i in recorded | ({eos} if eos is not None else set()) if i < limit)
        suppressed = sorted({i for role, i in specials.items() if role != "eos" and i not in end_ids and i != eos and i < model_vocab})
        pad = specials.get("pad", eos if eos is not None else 0)
        return cls(limit=limit, eos_id=eos, pad_id=pad, suppressed=suppressed, end_ids=end_ids)


class DecoderWindow:
    """Each row's tokens inside the context window, which of them are real (not left padding), and the KV
    cache over them. `start` runs the prompts, `push` one new token per row; both return the next-token
    logits (B, vocab limit) of every row."""

    def __init__(
        self,
        model: Transformer,
        batch: int,
        vocab: Vocabulary,
        *,
        use_cache: bool = True,
        keep: int | None = None,
        memory: torch.Tensor | None = None,
        memory_padding: torch.Tensor | None = None,
        longest: int | None = None,
    ) -> None:
        config = model.config
        self.model, self.vocab = model, vocab
        # longest: the most tokens a row can come to (prompt + new tokens). Under the context, the window and
        # its cache are only that long (a pretrained model's context may be 32k or 128k tokens); it never fills.
        self.block = config.block_size if longest is None else max(1, min(config.block_size, longest))
        self.keep = min(self.block, keep if keep is not None else max(1, self.block - self.block // 4))
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype  # not lm_head.weight: a quantized head dequantizes on each read
        self.ids = torch.zeros(batch, self.block, dtype=torch.long, device=device)
        self.real = torch.zeros(batch, self.block, dtype=torch.bool, device=device)
        self.n_real = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens per row in the window
        self.length = 0
        self.padded = False
        self.cache = KVCache(config, batch, self.block, dtype, device) if use_cache else None
        self.memory, self.memory_padding = memory, memory_padding
        self.slides = 0
        # One row: a faster step that tfcli.accel attached to the model, where it has one for it (the C step).
        bind = model.fast_decode_step
        self.fast_step = bind(model, self.cache) if bind is not None and self.cache is not None and batch == 1 else None
        if vocab.suppressed:
            self._suppressed: torch.Tensor | None = torch.tensor(vocab.suppressed, dtype=torch.long, device=device)
        else:
            self._suppressed = None

    @property
    def device(self) -> torch.device:
        return self.ids.device

    def start(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """ids, real (B, T): left-padded prompts, T <= block size."""
        T = ids.shape[1]
        assert 0 < T <= self.block, "prompts are cropped to the window before they get here"
        self.ids[:, :T] = ids
        self.real[:, :T] = real
        self.length = T
        return self._run_window()

    def push(self, next_ids: torch.Tensor, on_host: Sequence[int] | None = None) -> torch.Tensor:
        """Append one token per row (B,) and return the logits that follow it. on_host: the same ids where the
        caller has already read them from the device (to emit them), so that one row's faster step, which takes
        its token as a number, does not copy it from the device a second time."""
        if self.length == self.block:  # full: slide, keeping the last keep - 1 tokens and the new one
            kept = self.keep - 1
            self.ids[:, :kept] = self.ids[:, self.length - kept : self.length].clone()
            self.real[:, :kept] = self.real[:, self.length - kept : self.length].clone()
            self.length = kept
            self._append(next_ids)
            self.slides += 1
            return self._run_window()
        self._append(next_ids)
        if self.cache is None:
            return self._run_window()
        L = self.length
        if self.fast_step is not None and not self.padded and self.fast_step.usable():
            return self._scores(self.fast_step(int(next_ids[0]) if on_host is None else on_host[0]))
        if self.padded:
            hidden = self.model.decode(
                self.ids[:, L - 1 : L],
                self.real[:, :L],
                memory=self.memory,
                memory_padding=self.memory_padding,
                cache=self.cache,
                positions=(self.n_real - 1).unsqueeze(1),
            )  # (B, 1, d)
        else:
            hidden = self.model.decode(self.ids[:, L - 1 : L], memory=self.memory, memory_padding=self.memory_padding, cache=self.cache)
        return self._logits(hidden[:, -1])

    def extend(self, ids: list[int]) -> torch.Tensor:
        """Batch of one, unpadded, with a cache: append several tokens (a conversation's next turn) and run
        only them. They must fit in the window."""
        assert self.cache is not None and not self.padded and self.length + len(ids) <= self.block
        new = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, T)
        L, T = self.length, len(ids)
        self.ids[:, L : L + T] = new
        self.real[:, L : L + T] = True
        self.length = L + T
        self.n_real += T
        hidden = self.model.decode(new, memory=self.memory, memory_padding=self.memory_padding, cache=self.cache)
        return self._logits(hidden[:, -1])

    def truncate(self, length: int) -> None:
        """Unpadded windows: forget every token after the first `length` (their cache entries too)."""
        assert not self.padded and 0 < length <= self.length
        self.length = length
        self.n_real.fill_(length)
        if self.cache is not None:
            self.cache.length = length

    def tokens(self, row: int = 0) -> list[int]:
        """The real tokens of a row in the window, oldest first."""
        return self.ids[row, : self.length][self.real[row, : self.length]].tolist()

    def reorder(self, rows: torch.Tensor, *, same_memory: bool = False) -> None:
        """Beam search: row i becomes a copy of row rows[i] (tokens, padding and cache). same_memory: every
        row moves within rows that share one source, so the encoder memory and cross keys stay as they are."""
        L = self.length
        self.ids[:, :L] = self.ids[rows, :L]
        self.real[:, :L] = self.real[rows, :L]
        self.n_real = self.n_real[rows]
        if self.cache is not None:
            self.cache.keys[:, :, :, :L] = self.cache.keys[:, rows, :, :L]
            self.cache.values[:, :, :, :L] = self.cache.values[:, rows, :, :L]
            if not same_memory:
                self.cache.cross = [None if kv is None else (kv[0][rows], kv[1][rows]) for kv in self.cache.cross]
        if self.memory is not None and not same_memory:
            self.memory = self.memory[rows]
            self.memory_padding = None if self.memory_padding is None else self.memory_padding[rows]

    def _append(self, next_ids: torch.Tensor) -> None:
        self.ids[:, self.length] = next_ids
        self.real[:, self.length] = True
        self.n_real += 1
        self.length += 1

    def _run_window(self) -> torch.Tensor:
        """Run every token in the window (no cache, or a fresh one) and return the last position's logits."""
        L = self.length
        ids, real = self.ids[:, :L], self.real[:, :L]
        self.n_real = real.sum(dim=1)
        self.padded = bool((self.n_real < L).any())
        positions = (real.long().cumsum(dim=1) - 1).clamp(min=0) if self.padded else None  # (B, L)
        if self.cache is not None:
            self.cache.length = 0  # rebuilt from the window; cross-attention keys/values stay
        hidden = self.model.decode(
            ids, real if self.padded else None, memory=self.memory, memory_padding=self.memory_padding, cache=self.cache, positions=positions
        )
        return self._logits(hidden[:, -1])

    def _logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """Next-token scores (B, vocab limit) from the last hidden state, through the model's head (its soft cap too)."""
        return self._scores(self.model.unembed(last_hidden))

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits (B, vocab) cut to the tokenizer's vocabulary, specials other than eos at -inf."""
        logits = logits[:, : self.vocab.limit]  # (B, V)
        if logits.dtype != torch.float32:
            logits = logits.float()
        if self._suppressed is not None:
            logits = logits.index_fill(1, self._suppressed, float("-inf"))
        return logits


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, longest) ids and real-token mask. Left padding (prompts) makes every row end at the last column;
    right padding (an encoder's sources) starts every row at position 0."""
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), longest), dtype=torch.bool)
    for i, r in enumerate(rows):
        where = slice(longest - len(r), longest) if left else slice(0, len(r))
        ids[i, where] = torch.tensor(list(r), dtype=torch.long)
        real[i, where] = True
    return ids.to(device), real.to(device)
