"""The neuron view: how one head turns one query token's vector and every key's vector into its attention
weights, q·k/√d_k then the softmax, with the actual numbers. q and k are read off the model's own modules
(its attention's hook points hook_rot_q and hook_rot_k on rotary models, else hook_q and hook_k) by scoped
hooks during an ordinary forward pass; nothing here computes a layer."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from tfcli.errors import TfcliError
from tfcli.inspect.capture import AttentionCapture
from tfcli.inspect.hooks import Hooks
from tfcli.model.transformer import HIDDEN, DecoderInput
from tfcli.tokenizer.show import TokenView

JSON_FORMAT = "tfcli-neuron-view"
JSON_VERSION = 1


@dataclasses.dataclass
class QueryKeys:
    """Every layer's queries and keys for one text and one attention kind, after any rotary embedding:
    q [layer, head, query_pos, head_dim], k [layer, kv_head, key_pos, head_dim] (float32)."""

    q: np.ndarray
    k: np.ndarray
    scales: list[float]  # each layer's score scale (1/sqrt(hs), or the model's own: Gemma's query_pre_attn_scalar)
    windows: list[int | None]  # each layer's sliding window (local layers), or None

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    def key_head(self, head: int) -> int:
        """The key head a query head reads (grouped-query attention shares one among several)."""
        return head // (self.q.shape[1] // self.k.shape[1])


def capture_query_keys(model, capture: AttentionCapture) -> QueryKeys:
    """One forward pass over `capture`'s tokens, reading each layer's q and k of `capture.kind` at its
    attention's hook points (after any rotary embedding: the q and k the scores are made of)."""
    stack = model.encoder if capture.kind == "encoder" else model.decoder
    attentions = [block.cross_attn if capture.kind == "cross" else block.attn for block in stack.blocks]
    with Hooks() as hooks:
        queries = [hooks.read(attn.hook_q if attn.rotary is None else attn.hook_rot_q) for attn in attentions]
        keys = [hooks.read(attn.hook_k if attn.rotary is None else attn.hook_rot_k) for attn in attentions]
        _forward(model, capture)
    with torch.inference_mode():  # without rotary, hook_q and hook_k come before QK-norm: normalise them as the scores do
        seen_q = [attn.q_norm(seen[-1]) if attn.qk_norm and attn.rotary is None else seen[-1] for attn, seen in zip(attentions, queries)]
        seen_k = [attn.k_norm(seen[-1]) if attn.qk_norm and attn.rotary is None else seen[-1] for attn, seen in zip(attentions, keys)]
    q = np.stack([seen[0].transpose(0, 1).float().cpu().numpy() for seen in seen_q])  # (T, nh, hs) -> (L, nh, T, hs)
    k = np.stack([seen[0].transpose(0, 1).float().cpu().numpy() for seen in seen_k])  # (S, nkv, hs) -> (L, nkv, S, hs)
    scales = [attn.scale if attn.scale is not None else 1.0 / math.sqrt(attn.head_dim) for attn in attentions]
    return QueryKeys(q, k, scales, [attn.window for attn in attentions])


def _forward(model, capture: AttentionCapture) -> None:
    device = next(model.parameters()).device
    with torch.inference_mode():
        src = torch.tensor([capture.source_ids], dtype=torch.long, device=device)  # (1, S)
        if capture.decoder_ids is None and model.config.arch == "encoder-decoder":
            model.encode(src)
        elif capture.decoder_ids is not None:
            model(src, head=HIDDEN, decoder=DecoderInput(torch.tensor([capture.decoder_ids], dtype=torch.long, device=device)))
        else:
            model(src, head=HIDDEN)


@dataclasses.dataclass
class NeuronView:
    """One head, one query: q (head_dim,), each key's k (S, head_dim), their elementwise products (S,
    head_dim), the scaled dot products q·k/√d_k (S,; -inf where the key is masked) and the softmax (S,)."""

    layer: int
    head: int
    query: int
    query_token: TokenView
    key_tokens: list[TokenView]
    q: np.ndarray
    k: np.ndarray
    products: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    masked: np.ndarray  # (S,) bool
    scale: float  # what q·k is multiplied by: 1/sqrt(d_k), or the model's own

    def to_json(self) -> dict[str, Any]:
        def numbers(a: np.ndarray) -> list:
            return [float(x) for x in a.astype(np.float64)] if a.ndim == 1 else [numbers(row) for row in a]

        return {
            "format": JSON_FORMAT,
            "version": JSON_VERSION,
            "layer": self.layer,
            "head": self.head,
            "head_dim": int(self.q.shape[0]),
            "scale": self.scale,
            "query": {"position": self.query, "text": self.query_token.text, "label": self.query_token.label, "q": numbers(self.q)},
            "keys": [
                {
                    "position": i,
                    "text": token.text,
                    "label": token.label,
                    "k": numbers(self.k[i]),
                    "q_times_k": numbers(self.products[i]),
                    "score": None if self.masked[i] else float(self.scores[i]),
                    "weight": float(self.weights[i]),
                    "masked": bool(self.masked[i]),
                }
                for i, token in enumerate(self.key_tokens)
            ],
        }


def neuron_view(capture: AttentionCapture, qk: QueryKeys, layer: int, head: int, query: int) -> NeuronView:
    """The numbers behind capture.weights[layer, head, query]: softmax(q·k/√d_k) over the keys the query may see."""
    if not 0 <= query < len(capture.queries):
        last = len(capture.queries) - 1
        raise TfcliError(f"--query {query} is out of range: the text has {len(capture.queries)} tokens (0 to {last})", hint=f"pick one from 0 to {last}")
    q = qk.q[layer, head, query].astype(np.float64)  # (hs,)
    k = qk.k[layer, qk.key_head(head)].astype(np.float64)  # (S, hs)
    products = k * q  # (S, hs)
    scores = products.sum(axis=1) * qk.scales[layer]  # (S,)
    masked = np.zeros(len(k), dtype=bool)
    if capture.causal:
        masked[query + 1 :] = True
    if qk.windows[layer] is not None:  # a local layer sees only the last `window` keys
        masked[: max(query - qk.windows[layer] + 1, 0)] = True
    shown = np.where(masked, -np.inf, scores)
    weights = np.exp(shown - shown.max())
    weights /= weights.sum()
    return NeuronView(
        layer=layer,
        head=head,
        query=query,
        query_token=capture.queries[query],
        key_tokens=list(capture.keys),
        q=q,
        k=k,
        products=products,
        scores=np.where(masked, -np.inf, scores),
        weights=weights,
        masked=masked,
        scale=qk.scales[layer],
    )
