"""A continuous batch over one KV cache: sequences join (the prompts that arrive together run in one pass,
their keys and values copied into free rows) and leave (the last row moves into the freed one) between steps, and each step runs one
new token for every row at once. It works on ids only; the scheduler (`engine.py`) samples and detokenizes.

Rows share one window length L and are right-aligned in it (left padding): a row's real tokens fill the
last columns it has reached, its positions count its own real tokens, so a row decodes as it would alone.
A prompt longer than L shifts every row right; when L reaches the cache's capacity the columns every row
leaves empty are dropped. A sequence never grows past the context: prompt + new tokens fit (the API
refuses the rest), so no row ever slides.

A step runs through the model's plain `decode` over the rows in use, or, where tfcli.accel is attached and a
stored measurement (`tfcli bench serve`) chose it for this many rows, through the step compiled by
torch.compile over every row (`tfcli.accel.compiled_step.CompiledBatchStep`), once it has compiled in its
thread; both give the same tokens.
"""

from __future__ import annotations

import torch

from tfcli.accel import compiled_step
from tfcli.generate.window import Vocabulary, pad_rows
from tfcli.model.attention import KVCache
from tfcli.model.transformer import Transformer


class SlotBatch:
    """Up to `rows` sequences decoded together over a (layers, rows, kv heads, capacity, head dim) cache.
    Rows 0..active-1 are in use; `join` takes the next one, `leave` frees one, `step` runs a token per row."""

    def __init__(self, model: Transformer, rows: int, vocab: Vocabulary, capacity: int | None = None) -> None:
        config = model.config
        self.model, self.vocab = model, vocab
        self.capacity = config.block_size if capacity is None else capacity
        weight = next(model.parameters())  # not lm_head.weight: a quantized head dequantizes on each read
        self.device, self.dtype = weight.device, weight.dtype
        self.cache = KVCache(config, rows, self.capacity, self.dtype, self.device)
        self.ids = torch.zeros(rows, self.capacity, dtype=torch.long, device=self.device)
        self.real = torch.zeros(rows, self.capacity, dtype=torch.bool, device=self.device)
        self.n_real = torch.zeros(rows, dtype=torch.long, device=self.device)  # real tokens per row
        self.rows = rows
        self.active = 0
        self.length = 0  # the shared window length L
        suppressed = vocab.suppressed
        self._suppressed = torch.tensor(suppressed, dtype=torch.long, device=self.device) if suppressed else None
        # the compiled step, where tfcli.accel is attached (not with TFCLI_ACCEL=0) and a measurement chose it
        accelerated = getattr(model, "fast_decode_step", None) is not None
        self.fast_step = compiled_step.bind_rows(model, self.cache, self.real) if accelerated else None

    def compiled_state(self) -> str:
        """The compiled batch step here: "off" (not chosen), "compiling", "ready", or "failed: why"."""
        step = self.fast_step
        if step is None:
            return "off"
        if step.problem is not None:
            return f"failed: {step.problem}"
        return "ready" if step.ready.is_set() else "compiling"

    @property
    def free(self) -> int:
        return self.rows - self.active

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits (B, vocab) cut to the tokenizer's vocabulary, specials other than eos at -inf
        (as `DecoderWindow` gives them to `tfcli generate`)."""
        logits = logits[:, : self.vocab.limit].float()  # (B, V)
        if self._suppressed is not None:
            logits = logits.index_fill(1, self._suppressed, float("-inf"))
        return logits

    def prefill(self, prompts: list[list[int]]) -> tuple[KVCache, torch.Tensor]:
        """Run prompts together (left-padded, each at its own positions, one pass over the weights for all);
        their cache (len(prompts) rows, the longest prompt's positions) and the logits after each (k, V)."""
        width = max(len(p) for p in prompts)
        cache = KVCache(self.model.config, len(prompts), width, self.dtype, self.device)
        ids, real = pad_rows(prompts, self.vocab.pad_id, self.device, left=True)  # (k, width)
        if bool(real.all()):
            hidden = self.model.decode(ids, cache=cache)  # (k, width, d)
        else:
            positions = (real.long().cumsum(dim=1) - 1).clamp(min=0)  # (k, width)
            hidden = self.model.decode(ids, real, cache=cache, positions=positions)
        return cache, self.scores(self.model.unembed(hidden[:, -1]))

    def join(self, prompt: list[int], prefilled: KVCache, index: int = 0) -> int:
        """Put prompt `index` of a prefill in the next free row; returns the row."""
        assert self.active < self.rows
        P, width = len(prompt), prefilled.keys.shape[3]
        assert 0 < P < self.capacity, "prompt + new tokens fit in the context, so a prompt leaves room for one"
        if self.active == 0:
            self.length = P
        elif P > self.length:
            self._shift_right(P - self.length)
        row, L = self.active, self.length
        self.cache.keys[:, row, :, L - P : L] = prefilled.keys[:, index, :, width - P : width]
        self.cache.values[:, row, :, L - P : L] = prefilled.values[:, index, :, width - P : width]
        self.cache.keys[:, row, :, : L - P] = 0
        self.cache.values[:, row, :, : L - P] = 0
        self.ids[row, :L] = 0
        self.ids[row, L - P : L] = torch.tensor(prompt, dtype=torch.long, device=self.device)
        self.real[row, :L] = False
        self.real[row, L - P : L] = True
        self.n_real[row] = P
        self.active += 1
        return row

    def leave(self, row: int) -> int | None:
        """Free a row: the last active row moves into it. Returns the row that moved (now `row`), or None."""
        assert 0 <= row < self.active
        last = self.active - 1
        self.active -= 1
        if row == last:
            return None
        L = self.length
        self.cache.keys[:, row, :, :L] = self.cache.keys[:, last, :, :L]
        self.cache.values[:, row, :, :L] = self.cache.values[:, last, :, :L]
        self.ids[row, :L] = self.ids[last, :L]
        self.real[row, :L] = self.real[last, :L]
        self.n_real[row] = self.n_real[last]
        return last

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token to every active row (B,) and return the logits after it (B, V)."""
        B = self.active
        assert tokens.shape == (B,)
        if self.length == self.capacity:
            self._drop_empty_columns()
        L = self.length
        self.ids[:B, L] = tokens
        self.real[:B, L] = True
        positions = self.n_real[:B].unsqueeze(1).clone()  # (B, 1): each row's own next position
        self.n_real[:B] += 1
        self.length = L + 1
        if self.fast_step is not None and self.fast_step.usable():
            return self.scores(self.fast_step(tokens, positions[:, 0], L))  # every row, the cache read whole
        view = KVCache.over(self.cache.keys[:, :B], self.cache.values[:, :B], self.cache.cross, L)  # the first B rows, sharing its memory
        hidden = self.model.decode(self.ids[:B, L : L + 1], self.real[:B, : L + 1], cache=view, positions=positions)  # (B, 1, d)
        return self.scores(self.model.unembed(hidden[:, -1]))

    def tokens(self, row: int) -> list[int]:
        """A row's real tokens, oldest first."""
        return self.ids[row, : self.length][self.real[row, : self.length]].tolist()

    def _shift_right(self, by: int) -> None:
        """Move every active row `by` columns right (a longer prompt joins), padding on the left."""
        B, L = self.active, self.length
        assert L + by <= self.capacity
        for buffer in (self.cache.keys, self.cache.values):
            buffer[:, :B, :, by : L + by] = buffer[:, :B, :, :L].clone()
        self.ids[:B, by : L + by] = self.ids[:B, :L].clone()
        self.real[:B, by : L + by] = self.real[:B, :L].clone()
        self.real[:B, :by] = False
        self.length = L + by

    def _drop_empty_columns(self) -> None:
        """The window is full: drop the leading columns that are padding in every row."""
        B, L = self.active, self.length
        drop = L - int(self.n_real[:B].max())
        assert drop > 0, "no row outgrows the context"
        for buffer in (self.cache.keys, self.cache.values):
            buffer[:, :B, :, : L - drop] = buffer[:, :B, :, drop:L].clone()
        self.ids[:B, : L - drop] = self.ids[:B, drop:L].clone()
        self.real[:B, : L - drop] = self.real[:B, drop:L].clone()
        self.length = L - drop
