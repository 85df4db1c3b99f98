"""The transformer: token embeddings, positions, a stack of pre- or post-norm blocks, and heads, in three
architectures (decoder, encoder, encoder-decoder). Read it top to bottom; every reshape says its shape."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.errors import TfcliError
from tfcli.model.attention import Attention, AttentionMask, KVCache, LayerKVCache
from tfcli.model.config import ModelConfig
from tfcli.model.hook_point import add_hook_points
from tfcli.model.layers import MLP, RotaryEmbedding, make_norm, sinusoidal_table
from tfcli.model.loss import IGNORE_INDEX, vocabulary_cross_entropy


class Block(nn.Module):
    """Self-attention, cross-attention (encoder-decoder's decoder only) and an MLP, each a sublayer on the
    residual stream: pre-norm x + f(norm(x)), or post-norm norm(x + f(x)) as in the original transformer;
    with `post_norms` (Gemma's "sandwich"), x + out_norm(f(norm(x))).
    Hook points, each (B, T, d), as TransformerLens's: hook_resid_pre (the block's input), hook_attn_out
    (self-attention's output, after its out_norm: what is added to the stream), hook_resid_mid (the stream
    before the MLP), hook_mlp_in (a copy of it, before the MLP's norm: an edit changes what the MLP reads, not
    the stream), hook_mlp_out (likewise after its out_norm), hook_resid_post (the block's output)."""

    def __init__(self, config: ModelConfig, *, causal: bool, cross: bool, rotary: RotaryEmbedding | None = None, window: int | None = None) -> None:
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.attn_norm = make_norm(config)
        self.attn = Attention(config, causal=causal, rotary=rotary, window=window)
        if cross:
            self.cross_norm = make_norm(config)
            self.cross_attn = Attention(config, causal=False, cross=True)
        self.mlp_norm = make_norm(config)
        self.mlp = MLP(config)
        self.post_norms = config.post_norms
        if self.post_norms:
            self.attn_out_norm, self.mlp_out_norm = make_norm(config), make_norm(config)
        self.drop = nn.Dropout(config.dropout)
        add_hook_points(self, "hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_in", "hook_mlp_out", "hook_resid_post")

    def _residual(self, x, y, norm):
        """Add a sublayer's output y to the residual stream x (post-norm: then normalise the sum)."""
        if self.drop.p and self.training:
            y = self.drop(y)
        return x + y if self.pre_norm else norm(x + y)

    def forward(self, x, mask: AttentionMask, *, memory: Memory | None = None, cache: LayerKVCache | None = None):
        x = self.hook_resid_pre(x)
        h = self.attn_norm(x) if self.pre_norm else x
        y = self.attn(h, mask, cache=cache)
        y = self.attn_out_norm(y) if self.post_norms else y
        x = self._residual(x, self.hook_attn_out(y), self.attn_norm)
        if memory is not None:
            h = self.cross_norm(x) if self.pre_norm else x
            x = self._residual(x, self.cross_attn(h, memory.mask, memory=memory.states, cache=cache), self.cross_norm)
        x = self.hook_resid_mid(x)
        h = self.hook_mlp_in(x.clone()) if self.hook_mlp_in.hooked else x
        h = self.mlp_norm(h) if self.pre_norm else h
        y = self.mlp(h)
        y = self.mlp_out_norm(y) if self.post_norms else y
        x = self._residual(x, self.hook_mlp_out(y), self.mlp_norm)
        return self.hook_resid_post(x)


@dataclasses.dataclass(frozen=True)
class Memory:
    """What an encoder-decoder's cross-attention reads: the encoded source (B, S, d), and which of its
    positions each target position may see."""

    states: torch.Tensor
    mask: AttentionMask


class Stack(nn.Module):
    """The encoder's or the decoder's blocks, one after another on the residual stream, then the final norm
    (pre-norm only: a post-norm block already ends in one). The `local_layers` attend within the sliding
    window, turned by their own rotary tables where they have them (Gemma 3). Hook point: hook_normalized
    (B, T, d), the stack's output after its final norm."""

    def __init__(
        self,
        config: ModelConfig,
        n_layers: int,
        *,
        causal: bool,
        cross: bool,
        rotary: RotaryEmbedding | None = None,
        local_rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        local_rotary = local_rotary if local_rotary is not None else rotary
        blocks = []
        for i in range(n_layers):
            if i in config.local_layers:
                blocks.append(Block(config, causal=causal, cross=cross, rotary=local_rotary, window=config.sliding_window))
            else:
                blocks.append(Block(config, causal=causal, cross=cross, rotary=rotary))
        self.blocks = nn.ModuleList(blocks)
        self.norm = make_norm(config) if config.norm_placement == "pre" else nn.Identity()
        add_hook_points(self, "hook_normalized")

    def forward(self, x, mask: AttentionMask, *, memory: Memory | None = None, cache: KVCache | None = None):
        """x (B, T, d) through every block. Returns (B, T, d)."""
        for i, block in enumerate(self.blocks):
            x = block(x, mask, memory=memory, cache=cache.layer(i) if cache is not None else None)
        return self.hook_normalized(self.norm(x))


@dataclasses.dataclass(frozen=True)
class Logits:
    """The head scores the vocabulary at every position (B, T, vocab), or only where `at` (B, T) bool is
    True: (N, vocab), N = at.sum()."""

    at: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Loss:
    """The head computes the cross-entropy summed over `targets` (B, T) long, the token each position should
    predict (IGNORE_INDEX: none; divide by their count for the mean), without keeping the logits."""

    targets: torch.Tensor
    label_smoothing: float = 0.0


@dataclasses.dataclass(frozen=True)
class Hidden:
    """No vocabulary head: the last stack's output (and a classifier's scores) only."""


Head = Logits | Loss | Hidden
LOGITS, HIDDEN = Logits(), Hidden()


@dataclasses.dataclass(frozen=True)
class DecoderInput:
    """An encoder-decoder's target side: ids (B, T) the target so far, padding (B, T) True = real token, and
    `memory`, the encoded source (B, S, d), to skip the encoder (as decoding does)."""

    ids: torch.Tensor
    padding: torch.Tensor | None = None
    memory: torch.Tensor | None = None


@dataclasses.dataclass
class ModelOutput:
    logits: torch.Tensor | None = None  # (B, T, vocab): next-token (decoder) or masked-token (encoder) scores
    class_logits: torch.Tensor | None = None  # (B, n_classes)
    loss: torch.Tensor | None = None  # with a Loss head: the cross-entropy summed over the scored targets
    hidden: torch.Tensor | None = None  # (B, T, d): the last stack's output


class Transformer(nn.Module):
    """Hook points: hook_embed (B, T, d) the token embeddings, hook_pos_embed (B, T, d) the learned or
    sinusoidal positions added to them (each once per stack that embeds ids: an encoder-decoder's source, then
    its target), every block's and attention's (see `Block`, `Attention`, `MLP`), each stack's
    hook_normalized, hook_head_input (..., d) what the vocabulary head reads and hook_logits (..., vocab),
    soft-capped where the config caps them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.tok_emb = nn.Embedding(config.vocab_size, d)
        self.rotary = self.local_rotary = None
        if config.positions == "learned":
            self.pos_emb = nn.Embedding(config.block_size, d)
        elif config.positions == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(config.block_size, d), persistent=False)
        else:
            self.rotary = RotaryEmbedding(config.rotary_dim, config.block_size, config.rope_base, config.rope_scaling)
            if config.rope_local_base is not None:  # Gemma 3: the local layers' tables, of another base and unscaled
                self.local_rotary = RotaryEmbedding(config.rotary_dim, config.block_size, config.rope_local_base)
        if config.type_vocab_size:
            self.type_emb = nn.Embedding(config.type_vocab_size, d)  # BERT's segments: tfcli reads one, type 0
        if config.embedding_norm:
            self.emb_norm = make_norm(config)  # BERT: a LayerNorm over token + position + type embeddings
        self.drop = nn.Dropout(config.dropout)
        if config.has_encoder:
            self.encoder = Stack(config, config.n_layers, causal=False, cross=False, rotary=self.rotary)
        if config.has_decoder:
            self.decoder = Stack(
                config, config.decoder_layers, causal=True, cross=config.arch == "encoder-decoder", rotary=self.rotary, local_rotary=self.local_rotary
            )
        if config.arch == "encoder":
            # BERT's masked-LM head: a transform, then scores over the vocabulary.
            self.mlm_transform = nn.Linear(d, d, bias=config.bias)
            self.mlm_norm = make_norm(config)
            self.lm_head = nn.Linear(d, config.vocab_size, bias=True)
        else:
            self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        if config.pooler:
            self.pooler = nn.Linear(d, d)  # BERT: the classifier reads tanh(pooler(state of [CLS]))
        if config.n_classes:
            self.classifier = nn.Linear(d, config.n_classes)
        add_hook_points(self, "hook_embed", "hook_pos_embed", "hook_head_input", "hook_logits")
        self.apply(self.init_weights)
        residual_std = config.init_std / math.sqrt(2 * (config.n_layers * config.has_encoder + config.decoder_layers * config.has_decoder))
        for name, parameter in self.named_parameters():
            if not name.endswith(("attn.out.weight", "mlp.proj.weight")):
                continue
            if config.zero_init_proj:
                nn.init.zeros_(parameter)  # the speedrun: each sublayer starts adding nothing to the residual stream
            else:
                nn.init.normal_(parameter, mean=0.0, std=residual_std)  # GPT-2: scaled residual projections
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        # The loss over the vocabulary, (hidden, weight, bias, targets, label_smoothing, softcap) -> summed loss.
        # The plain one holds every logit; tfcli.accel may put a fused one here that never does.
        self.vocabulary_loss = vocabulary_cross_entropy
        # A faster one-row decoding step, (model, cache) -> step or None: the plain model has none, decoding
        # takes it where tfcli.accel put one here (the C step, the compiled one) and falls back to `decode` where it binds none.
        self.fast_decode_step = None

    def init_weights(self, module: nn.Module) -> None:
        """A module's initial weights as the model gives them: normal(0, init_std), biases zero."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def parameter_count(self) -> int:
        """Parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters())

    def _check_length(self, offset: int, T: int, positions: torch.Tensor | None) -> None:
        """Positions offset..offset+T-1, or each row's own `positions` (B, T), must be inside the context."""
        if positions is None and offset + T > self.config.block_size:
            raise TfcliError(f"a sequence of {offset + T} tokens is longer than the model's block size ({self.config.block_size})")
        if positions is not None and positions.numel() and int(positions.max()) >= self.config.block_size:
            raise TfcliError(f"position {int(positions.max())} is past the model's block size ({self.config.block_size})")

    def _embed(self, ids: torch.Tensor, offset: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings plus positions offset..offset+T-1, or each row's own `positions` (B, T or 1, T)."""
        T = ids.shape[1]
        if positions is None:
            self._check_length(offset, T, None)
        x = self.tok_emb(ids)  # (B, T, d)
        if self.config.scale_embeddings:  # Gemma: times sqrt(d), a scalar in the embeddings' dtype as transformers rounds it
            x = x * torch.tensor(math.sqrt(self.config.d_model), dtype=x.dtype, device=x.device)
        x = self.hook_embed(x)
        if self.config.positions == "learned":
            pos = self.pos_emb(positions) if positions is not None else self.pos_emb.weight[offset : offset + T]  # (B, T, d) or (T, d)
            x = x + self.hook_pos_embed(pos.expand_as(x))  # (B, T, d)
        elif self.config.positions == "sinusoidal":
            pos = (self.sinusoid[positions] if positions is not None else self.sinusoid[offset : offset + T]).to(x.dtype)  # (B, T, d) or (T, d)
            x = x + self.hook_pos_embed(pos.expand_as(x))  # (B, T, d)
        if self.config.type_vocab_size:
            x = x + self.type_emb.weight[0]  # every token is in segment 0
        if self.config.embedding_norm:
            x = self.emb_norm(x)
        return self.drop(x) if self.drop.p and self.training else x

    def encode(self, ids: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder stack over ids (B, S); padding (B, S) True = real token. Returns (B, S, d)."""
        mask = AttentionMask.build(ids.shape[1], ids.shape[1], causal=False, key_padding=padding)
        return self.encoder(self._embed(ids, 0), mask)

    def decode(self, ids, padding=None, *, memory=None, memory_padding=None, cache: KVCache | None = None, positions=None) -> torch.Tensor:
        """The decoder stack over ids (B, T), after the cached positions. Returns (B, T, d).
        positions (B, T), optional: each token's position when rows do not start together (left padding;
        default: cached length + 0..T-1 for every row). With a cache, padding (B, cached + T) covers the
        cached positions and the new ones, and the new keys and values are written into it."""
        offset = cache.length if cache is not None else 0
        T = ids.shape[1]
        if cache is not None and padding is not None and padding.shape[1] != offset + T:
            raise ValueError("with a cache, padding covers the cached positions and the new ones")
        self._check_length(offset, T, positions)
        if cache is None:
            mask = AttentionMask.build(T, T, causal=True, key_padding=padding, positions=positions)
        else:
            mask = cache.mask(T, padding, positions)  # (B or 1, 1, T, width): the cache's columns read through it
        cross = None
        if memory is not None:
            cross = Memory(memory, AttentionMask.build(T, memory.shape[1], causal=False, key_padding=memory_padding))
        x = self.decode_masked(ids, mask, memory=cross, cache=cache)
        if cache is not None:
            cache.advance(T)
        return x

    def decode_masked(self, ids: torch.Tensor, mask: AttentionMask, *, memory: Memory | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """`decode`'s tensors only: the decoder stack over ids (B, T) with its mask already made (over a static
        cache, `KVCache.mask`: positions and columns as tensors). Nothing here reads a number from the cache,
        so a step has one graph per shape (what tfcli.accel compiles). Returns (B, T, d)."""
        return self.decoder(self._embed(ids, 0, mask.positions), mask, memory=memory, cache=cache)

    def forward(
        self, ids: torch.Tensor, padding: torch.Tensor | None = None, *, head: Head = LOGITS, cache: KVCache | None = None, decoder: DecoderInput | None = None
    ) -> ModelOutput:
        """decoder: ids are the text, logits predict each next token. encoder: logits score the vocabulary at
        each position (masked LM). encoder-decoder: ids are the source, `decoder` the target side.
        `head` picks what the vocabulary head computes: Logits (everywhere, or at some positions), Loss (the
        summed cross-entropy, computed here so that sharded weights are gathered for it), or Hidden (nothing)."""
        arch = self.config.arch
        if arch == "decoder":
            hidden = self.decode(ids, padding, cache=cache)
        elif arch == "encoder":
            hidden = self.encode(ids, padding)
        else:
            if decoder is None:
                raise ValueError("an encoder-decoder needs its decoder's input")
            memory = decoder.memory if decoder.memory is not None else self.encode(ids, padding)
            hidden = self.decode(decoder.ids, decoder.padding, memory=memory, memory_padding=padding, cache=cache)
        out = ModelOutput(hidden=hidden)
        if isinstance(head, Loss):
            out.loss = self._vocabulary_loss(hidden, head.targets, head.label_smoothing)
        elif isinstance(head, Logits):
            out.logits = self.unembed(hidden if head.at is None else hidden[head.at])  # (B, T, vocab) or (N, vocab)
        if self.config.n_classes:
            out.class_logits = self.classifier(self._pooled(hidden, padding))
        return out

    def _vocabulary_loss(self, hidden: torch.Tensor, targets: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        rows, targets = hidden.flatten(0, -2), targets.flatten()  # (B*T, d), (B*T,)
        scored = targets != IGNORE_INDEX
        if not bool(scored.all()):
            rows, targets = rows[scored], targets[scored]
        # A head that holds no float matrix (QLoRA's frozen quantized one) goes to the loss itself, bias included:
        # the loss reads its rows a slab at a time, never the whole matrix.
        weight, bias = (self.lm_head.weight, self.lm_head.bias) if isinstance(self.lm_head, nn.Linear) else (self.lm_head, None)
        if targets.numel() == 0:
            return (rows.sum() + (weight.sum() if isinstance(weight, torch.Tensor) else 0.0)) * 0.0  # nothing scored: zero, still in the graph
        return self.vocabulary_loss(self.head_input(rows), weight, bias, targets, label_smoothing, self.config.logit_softcap)

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the vocabulary head reads from the last stack's output `hidden` (..., d): the same, or an
        encoder's masked-LM transform of it."""
        if self.config.arch == "encoder":
            hidden = self.mlm_norm(F.gelu(self.mlm_transform(hidden)))
        return self.hook_head_input(hidden)

    def unembed(self, hidden: torch.Tensor) -> torch.Tensor:
        """The vocabulary's scores from the last stack's output `hidden` (..., d) (`ModelOutput.hidden`,
        already normed), soft-capped where the config caps them. Returns (..., vocab). Every path from hidden
        states to logits (forward, decoding, serving) goes through here, so they all score alike."""
        return self.hook_logits(self.soft_cap(self.lm_head(self.head_input(hidden))))

    def soft_cap(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma 2's and the speedrun's soft cap, cap * tanh(logits / cap): about the logits themselves while
        they are small, never past +-cap. The logits unchanged where `logit_softcap` is None."""
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def _pooled(self, hidden: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
        """The state a classifier reads: the first (classification) token for an encoder (through BERT's
        pooler when it has one), the last real token for a decoder (the only one that has seen the whole text)."""
        if self.config.arch == "encoder":
            return torch.tanh(self.pooler(hidden[:, 0])) if self.config.pooler else hidden[:, 0]
        if padding is None:
            return hidden[:, -1]
        last = padding.long().sum(dim=1).clamp(min=1) - 1  # (B,) right padding
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
