"""The neuron view: how one head turns one query token's vector and every key's vector into its attention
weights, q·k/√d_k then the softmax, with the actual numbers. q and k are read off the model's own modules
(its q/k projection and rotary embedding) by scoped hooks during an ordinary forward pass; nothing here
computes a layer."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from tfcli.errors import TfcliError
from tfcli.inspect.capture import AttentionCapture
from tfcli.inspect.hooks import Hooks

JSON_FORMAT = "tfcli-neuron-view"
JSON_VERSION = 1


@dataclasses.dataclass
class QueryKeys:
    """Every layer's queries and keys for one text and one attention kind, after any rotary embedding:
    q [layer, head, query_pos, head_dim], k [layer, kv_head, key_pos, head_dim] (float32)."""

    q: np.ndarray
    k: np.ndarray

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    def key_head(self, head: int) -> int:
        """The key head a query head reads (grouped-query attention shares one among several)."""
        return head // (self.q.shape[1] // self.k.shape[1])


def capture_query_keys(model, capture: AttentionCapture) -> QueryKeys:
    """One forward pass over `capture`'s tokens, reading each layer's q and k of `capture.kind`."""
    stack = model.encoder if capture.kind == "encoder" else model.decoder
    records: list[dict[str, list[torch.Tensor]]] = [{"q": [], "k": []} for _ in stack.blocks]
    current: list[int | None] = [None]
    with Hooks() as hooks:
        for index, block in enumerate(stack.blocks):
            attn = block.cross_attn if capture.kind == "cross" else block.attn
            hooks.before(attn, lambda module, args, index=index: current.__setitem__(0, index))
            hooks.after(attn, lambda module, args, output: current.__setitem__(0, None))
            if capture.kind == "cross":
                hooks.after(attn.q, lambda module, args, out, index=index: records[index]["q"].append(out))
                hooks.after(attn.kv, lambda module, args, out, index=index, attn=attn: records[index]["k"].append(out[..., : attn.n_kv_heads * attn.head_dim]))
            else:
                hooks.after(attn.qkv, lambda module, args, out, index=index, attn=attn: _split_qkv(records[index], out, attn))
        if getattr(model, "rotary", None) is not None and capture.kind != "cross":
            # the one rotary module turns q then k of whichever attention runs; keep those of the chosen stack's
            def rotated(module, args, out):
                if current[0] is not None:
                    record = records[current[0]]
                    record["q" if len(record["q"]) < 2 else "k"].append(out)

            hooks.after(model.rotary, rotated)
        _forward(model, capture)
    q_layers, k_layers = [], []
    for record, block in zip(records, stack.blocks):
        attn = block.cross_attn if capture.kind == "cross" else block.attn
        q, k = record["q"][-1], record["k"][-1]  # the rotated ones when there are two
        if q.dim() == 3:  # a projection's output (1, T, width): split into heads
            q = q.view(q.shape[1], attn.n_heads, attn.head_dim).transpose(0, 1)  # (nh, T, hs)
            k = k.view(k.shape[1], attn.n_kv_heads, attn.head_dim).transpose(0, 1)  # (nkv, S, hs)
        else:
            q, k = q[0], k[0]  # (nh, T, hs), (nkv, S, hs)
        q_layers.append(q.float().cpu().numpy())
        k_layers.append(k.float().cpu().numpy())
    return QueryKeys(np.stack(q_layers), np.stack(k_layers))


def _split_qkv(record: dict[str, list[torch.Tensor]], out: torch.Tensor, attn) -> None:
    d, kv = attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim
    q, k, _ = out.split([d, kv, kv], dim=-1)  # (1, T, d), (1, T, kv)
    record["q"].append(q)
    record["k"].append(k)


def _forward(model, capture: AttentionCapture) -> None:
    device = next(model.parameters()).device
    with torch.inference_mode():
        src = torch.tensor([capture.source_ids], dtype=torch.long, device=device)  # (1, S)
        if capture.decoder_ids is None and model.config.arch == "encoder-decoder":
            model.encode(src)
        elif capture.decoder_ids is not None:
            model(src, decoder_ids=torch.tensor([capture.decoder_ids], dtype=torch.long, device=device), logits=False)
        else:
            model(src, logits=False)


@dataclasses.dataclass
class NeuronView:
    """One head, one query: q (head_dim,), each key's k (S, head_dim), their elementwise products (S,
    head_dim), the scaled dot products q·k/√d_k (S,; -inf where the key is masked) and the softmax (S,)."""

    layer: int
    head: int
    query: int
    query_label: str
    key_labels: list[str]
    q: np.ndarray
    k: np.ndarray
    products: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    masked: np.ndarray  # (S,) bool

    def to_json(self) -> dict[str, Any]:
        def numbers(a: np.ndarray) -> list:
            return [float(x) for x in a.astype(np.float64)] if a.ndim == 1 else [numbers(row) for row in a]

        return {
            "format": JSON_FORMAT,
            "version": JSON_VERSION,
            "layer": self.layer,
            "head": self.head,
            "head_dim": int(self.q.shape[0]),
            "scale": 1.0 / math.sqrt(self.q.shape[0]),
            "query": {"position": self.query, "text": self.query_label, "q": numbers(self.q)},
            "keys": [
                {
                    "position": i,
                    "text": label,
                    "k": numbers(self.k[i]),
                    "q_times_k": numbers(self.products[i]),
                    "score": None if self.masked[i] else float(self.scores[i]),
                    "weight": float(self.weights[i]),
                    "masked": bool(self.masked[i]),
                }
                for i, label in enumerate(self.key_labels)
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
    scores = products.sum(axis=1) / math.sqrt(qk.head_dim)  # (S,)
    masked = np.zeros(len(k), dtype=bool)
    if capture.causal:
        masked[query + 1 :] = True
    shown = np.where(masked, -np.inf, scores)
    weights = np.exp(shown - shown.max())
    weights /= weights.sum()
    return NeuronView(
        layer=layer,
        head=head,
        query=query,
        query_label=capture.queries[query].text,
        key_labels=[v.text for v in capture.keys],
        q=q,
        k=k,
        products=products,
        scores=np.where(masked, -np.inf, scores),
        weights=weights,
        masked=masked,
    )
