"""One attention module for training, decoding and inspection.

Scaled dot-product attention with multi-head, grouped-query and multi-query layouts (`n_kv_heads`),
causal and padding masks, cross-attention, and a KV cache. Two paths compute the same function: the fast
one (`F.scaled_dot_product_attention`) and an explicit one, softmax(q k^T / sqrt(hs)) v, taken only when a hook
reads or edits the scores or the weights `[batch, head, query_pos, key_pos]` (`hook_attn_scores`,
`hook_pattern`); a test holds them equal. A local layer (Gemma 3's) also limits each query to a sliding
window of the keys before it.

The KV cache is static: preallocated to its capacity, written in place at the columns the new tokens take,
and read in whole blocks of columns, its unwritten and padding columns hidden by the mask, so a decoding
step's shapes change once a block (64 positions), not at every step; read whole (`read_block` None, as
the compiled step reads it), they never change (what torch.compile and CUDA graphs need). The cache is the one
place that knows its capacity; `AttentionMask.over_cache` builds the length mask.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.config import ModelConfig
from tfcli.model.hook_point import add_hook_points
from tfcli.model.layers import RotaryEmbedding, make_norm


@dataclasses.dataclass
class AttentionMask:
    """Which keys each query may see. `allowed` is (B or 1, 1, T, S) bool, True = attend; None with
    `causal` means the plain lower-triangular mask (T == S, no offset), which the fast path fuses.
    `positions` (B, T), optional: each query's own position when rows do not start together (left padding),
    which rotary attention turns q and k by (default: the cache's length + 0..T-1). `slots` (T,), over a
    static cache: the cache column each query's key and value are written to (`over_cache`)."""

    allowed: torch.Tensor | None = None
    causal: bool = False
    positions: torch.Tensor | None = None
    slots: torch.Tensor | None = None

    @staticmethod
    def build(
        T: int, S: int, *, causal: bool, key_padding: torch.Tensor | None = None, offset: int = 0, positions: torch.Tensor | None = None
    ) -> AttentionMask:
        """T queries at positions offset..offset+T-1 over S keys at 0..S-1; key_padding (B, S), True = real token."""
        if key_padding is None and (not causal or (offset == 0 and T == S)):
            return AttentionMask(None, causal, positions)
        if key_padding is None and T == 1 and offset + 1 == S:
            return AttentionMask(None, False, positions)  # one new token after the cache sees every key: no mask at all
        device = key_padding.device if key_padding is not None else None
        allowed = torch.ones(1, 1, T, S, dtype=torch.bool, device=device)
        if causal:
            query_pos = torch.arange(offset, offset + T, device=device).unsqueeze(1)  # (T, 1)
            allowed = allowed & (torch.arange(S, device=device).unsqueeze(0) <= query_pos)  # (1, 1, T, S)
        if key_padding is not None:
            allowed = allowed & key_padding.bool()[:, None, None, :]  # (B, 1, T, S)
        # A query that may see nothing (a padding position) attends everywhere instead of producing NaN;
        # its output is padding and is never used.
        return AttentionMask(allowed | ~allowed.any(dim=-1, keepdim=True), False, positions)

    @staticmethod
    def over_cache(slots: torch.Tensor, capacity: int, *, key_padding: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> AttentionMask:
        """T queries written to cache columns `slots` (T,) of a static cache of `capacity` columns, read whole:
        query t sees column j only when j <= slots[t] (written, and not after it). key_padding (B, C), C <=
        capacity, True = real token, covers the columns written so far and the new ones (the rest count as
        padding). positions (B, T): each query's position (default: its column, the same for every row).
        Example: slots [2], capacity 4, no padding -> allowed [[[[True, True, True, False]]]]."""
        T = slots.shape[0]
        allowed = (torch.arange(capacity, device=slots.device).unsqueeze(0) <= slots.unsqueeze(1))[None, None]  # (1, 1, T, S)
        if key_padding is not None:
            real = F.pad(key_padding.bool(), (0, capacity - key_padding.shape[1]), value=False)  # (B, S)
            allowed = allowed & real[:, None, None, :]  # (B, 1, T, S)
            allowed = allowed | ~allowed.any(dim=-1, keepdim=True)  # as `build`: a padding query sees every key, never NaN
        if positions is None:
            positions = slots.view(1, T)  # (1, T)
        return AttentionMask(allowed, False, positions, slots)

    def within(self, window: int, T: int, S: int, offset: int, device: torch.device) -> AttentionMask:
        """This causal mask with each query also limited to the last `window` keys up to its own (sliding-window
        attention): the query in cache slot i sees slot j only when i - window < j <= i. Slots are positions
        for rows whose real tokens are contiguous (the left padding tfcli decodes with), as transformers counts them.
        The query slots are this mask's `slots` over a static cache, else offset..offset+T-1."""
        if S <= window:
            return self  # every key is in every query's window
        query_slot = self.slots.unsqueeze(1) if self.slots is not None else torch.arange(offset, offset + T, device=device).unsqueeze(1)  # (T, 1)
        near = torch.arange(S, device=device).unsqueeze(0) > query_slot - window  # (T, S)
        allowed = self.dense(T, S, device)
        allowed = near[None, None] if allowed is None else allowed & near  # (B or 1, 1, T, S)
        return AttentionMask(allowed | ~allowed.any(dim=-1, keepdim=True), False, self.positions, self.slots)  # as `build`: no query sees nothing

    def dense(self, T: int, S: int, device: torch.device) -> torch.Tensor | None:
        if self.allowed is not None:
            return self.allowed
        if self.causal:
            return torch.ones(T, S, dtype=torch.bool, device=device).tril()[None, None]
        return None


class LayerKVCache:
    """One layer's view of a KVCache: its preallocated keys/values, written in place, read in whole blocks."""

    def __init__(self, parent: KVCache, index: int) -> None:
        self.parent, self.index = parent, index

    @property
    def offset(self) -> int:
        return self.parent.length

    def write(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, n_kv, T, hs) in columns `slots` (T,) (default: the T after the cached ones); return the
        cache's first `width` columns (B, n_kv, width, hs), whose unwritten ones the mask hides."""
        # without slots, the caller's own mask (`AttentionMask.build`) covers exactly the keys written so far
        width = self.parent.width if slots is not None else self.parent.length + k.shape[2]
        if slots is None:
            slots = self.parent.next_slots(k.shape[2])
        layer = torch.full((1,), self.index, dtype=torch.long, device=slots.device)
        # indexed on the whole (L, B, n_kv, S, hs) buffer, not on a view of it: compiled, the write stays in place
        self.parent.keys[layer, :, :, slots] = k.permute(2, 0, 1, 3).to(self.parent.keys.dtype)  # (T, B, n_kv, hs)
        self.parent.values[layer, :, :, slots] = v.permute(2, 0, 1, 3).to(self.parent.values.dtype)
        keys, values = self.parent.keys[self.index], self.parent.values[self.index]  # (B, n_kv, S, hs)
        return keys[:, :, :width], values[:, :, :width]  # (B, n_kv, width, hs)

    @property
    def cross(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.parent.cross[self.index]

    @cross.setter
    def cross(self, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.parent.cross[self.index] = kv


class KVCache:
    """Keys and values of every decoder layer for incremental decoding, preallocated to `capacity` columns.
    Rows share the column count `length` (rows of different lengths are left-padded, their padding hidden by
    the mask, their positions their own). Attention reads the first `width` columns: the written ones rounded
    up to whole blocks of `read_block` (a 1,024-position cache holding 40 tokens reads 64 columns, not 1,024:
    reading them all made 16 rows of gpt2-small decode 1.9x slower on a CPU), or every column where
    `read_block` is None (one shape at every step, for compiling and capturing). Grouped- and multi-query
    attention store only their n_kv_heads, which is what makes them cheaper to decode."""

    READ_BLOCK = 64

    def __init__(self, config: ModelConfig, batch: int, capacity: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        shape = (config.decoder_layers, batch, config.kv_heads, capacity, config.head_dim)  # (L, B, n_kv, S, hs)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * config.decoder_layers
        self.capacity = capacity
        self.length = 0
        self.read_block: int | None = self.READ_BLOCK
        self.width = capacity  # the columns attention reads (`mask` sets it for each call)

    @classmethod
    def over(cls, keys: torch.Tensor, values: torch.Tensor, cross: list, length: int, read_block: int | None = READ_BLOCK) -> KVCache:
        """A cache over existing buffers (L, B, n_kv, S, hs), e.g. the first rows of another's: no copy.
        read_block None: read whole."""
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.cross = keys, values, cross
        cache.capacity, cache.length, cache.read_block, cache.width = keys.shape[3], length, read_block, keys.shape[3]
        return cache

    def layer(self, index: int) -> LayerKVCache:
        return LayerKVCache(self, index)

    def next_slots(self, T: int) -> torch.Tensor:
        """The columns (T,) the next T tokens are written to."""
        if self.length + T > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; {self.length + T} asked")
        return torch.arange(self.length, self.length + T, device=self.keys.device)

    def mask(self, T: int, padding: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> AttentionMask:
        """The mask for T new tokens after the cached ones over the columns attention reads (it sets `width`):
        each sees the written keys up to its own, within `padding` (B, length + T) where rows are left-padded."""
        slots = self.next_slots(T)
        written = self.length + T
        self.width = self.capacity if self.read_block is None else min(self.capacity, -(-written // self.read_block) * self.read_block)
        return AttentionMask.over_cache(slots, self.width, key_padding=padding, positions=positions)

    def advance(self, steps: int) -> None:
        self.length += steps


class Attention(nn.Module):
    """Hook points (see `HookPoint`), named, shaped and placed as TransformerLens's: hook_q (B, T, nh, hs),
    hook_k and hook_v (B, T, n_kv, hs), the new positions' queries, keys and values before rotary and the
    cache (cross-attention: hook_k and hook_v (B, S, n_kv, hs), once per source); rotary models also
    hook_rot_q and hook_rot_k, the same after rotary; hook_attn_scores (B, nh, T, S), q k^T / sqrt(hs) with
    the masked keys at -inf, and hook_pattern (B, nh, T, S), its softmax (hooking either takes the explicit
    path); hook_z (B, T, nh, hs): each head's output, the input of the output projection `out`. The
    attention itself is computed heads first, (B, nh, T, hs), as the fused kernel and the cache take it.
    With `qk_norm` (Qwen3), q_norm and k_norm normalise each head's query and key (hs wide) after hook_q
    and hook_k, before rotary. Heads are d_model / nh wide unless `d_head` sets hs apart: then q and hook_z
    are nh * hs wide, and `out` maps that back to d_model. Scores are q k^T / sqrt(hs) unless `attn_scale`
    says otherwise (Gemma 3); a local layer's `window` limits each query to that many keys, its own and the
    ones before it."""

    def __init__(self, config: ModelConfig, *, causal: bool, cross: bool = False, rotary: RotaryEmbedding | None = None, window: int | None = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.kv_heads, config.head_dim
        self.causal, self.cross, self.window = causal, cross, window
        self.scale = config.attn_scale  # None: 1 / sqrt(hs)
        self.dropout = config.dropout
        q_width, kv_width = config.q_width, 2 * self.n_kv_heads * self.head_dim
        if cross:
            self.q = nn.Linear(config.d_model, q_width, bias=config.has_qkv_bias)
            self.kv = nn.Linear(config.d_model, kv_width, bias=config.has_qkv_bias)
        else:
            self.qkv = nn.Linear(config.d_model, q_width + kv_width, bias=config.has_qkv_bias)
        if config.qk_norm:
            self.q_norm = make_norm(config, self.head_dim)  # over each head's query, shared by the heads
            self.k_norm = make_norm(config, self.head_dim)
        self.qk_norm = config.qk_norm
        self.out = nn.Linear(q_width, config.d_model, bias=config.bias)
        self.rotary = None if cross else rotary  # the model's one rotary module (no state of its own here), or None
        add_hook_points(self, "hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
        if self.rotary is not None:
            add_hook_points(self, "hook_rot_q", "hook_rot_k")

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim)  # (B, T, n, hs)

    def forward(self, x: torch.Tensor, mask: AttentionMask, *, memory: torch.Tensor | None = None, cache: LayerKVCache | None = None) -> torch.Tensor:
        """x: (B, T, d); memory (B, S, d): what cross-attention reads. Returns (B, T, d)."""
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        if self.cross:
            q = self.hook_q(self._heads(self.q(x), self.n_heads))  # (B, T, nh, hs)
            q = (self.q_norm(q) if self.qk_norm else q).transpose(1, 2)  # (B, nh, T, hs)
            if cache is not None and cache.cross is not None:
                k, v = cache.cross  # (B, nkv, S, hs)
            else:
                k, v = self.kv(memory).split(kv_width, dim=-1)
                k, v = self.hook_k(self._heads(k, self.n_kv_heads)), self.hook_v(self._heads(v, self.n_kv_heads))  # (B, S, nkv, hs)
                k = self.k_norm(k) if self.qk_norm else k
                k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, nkv, S, hs)
                if cache is not None:
                    cache.cross = (k, v)
        else:
            q, k, v = self.qkv(x).split([q_width, kv_width, kv_width], dim=-1)
            q = self.hook_q(self._heads(q, self.n_heads))  # (B, T, nh, hs)
            k, v = self.hook_k(self._heads(k, self.n_kv_heads)), self.hook_v(self._heads(v, self.n_kv_heads))  # (B, T, nkv, hs)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)  # each head's query and key normalised over its hs features
            # a mask over the static cache says where the new tokens are (its slots and positions); another
            # mask (a caller's own, as activation patching builds) counts them from the cache's length
            offset = cache.offset if cache is not None and mask.slots is None else 0
            if self.rotary is not None:
                q = self.hook_rot_q(self.rotary(q, offset, mask.positions))  # (B, T, nh, hs)
                k = self.hook_rot_k(self.rotary(k, offset, mask.positions))  # (B, T, nkv, hs)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh, T, hs), (B, nkv, T, hs) twice
            if cache is not None:
                k, v = cache.write(k, v, mask.slots)  # (B, nkv, S, hs), S = the cache's capacity
            if self.window is not None:
                mask = mask.within(self.window, q.shape[2], k.shape[2], offset, q.device)
        dropout = self.dropout if self.training else 0.0
        if self.hook_pattern.hooked or self.hook_attn_scores.hooked:
            y = self._explicit(q, k, v, mask, dropout)
        else:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask.allowed,
                dropout_p=dropout,
                is_causal=mask.causal and mask.allowed is None,
                scale=self.scale,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )
        z = self.hook_z(y.transpose(1, 2))  # (B, T, nh, hs)
        return self.out(z.flatten(2))  # (B, T, nh * hs) -> (B, T, d)

    def _explicit(self, q, k, v, mask: AttentionMask, dropout: float) -> torch.Tensor:
        """softmax(q k^T / sqrt(hs) + mask) v (or q k^T * attn_scale), the scores passed through hook_attn_scores
        and the weights through hook_pattern."""
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, S, hs)
        scores = q @ k.transpose(-2, -1)  # (B, nh, T, S)
        scores = scores / math.sqrt(self.head_dim) if self.scale is None else scores * self.scale
        allowed = mask.dense(q.shape[2], k.shape[2], q.device)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = self.hook_pattern(torch.softmax(self.hook_attn_scores(scores), dim=-1))
        dropped = F.dropout(weights, p=dropout) if dropout else weights
        return dropped @ v  # (B, nh, T, hs)
