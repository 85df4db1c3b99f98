"""The logit lens (`tfcli inspect-logits`): what each layer already predicts. The residual stream after the
embeddings and after each block is read with scoped hooks and put through the model's own final norm and
vocabulary head; nothing here runs a layer."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tfcli.errors import TfcliError, a_or_an
from tfcli.inspect.hooks import Hooks, lens_stack, unembed
from tfcli.limits import within_context
from tfcli.model.transformer import HIDDEN, DecoderInput
from tfcli.tokenizer.show import TokenView, token_label, token_text, token_views, visible

if TYPE_CHECKING:
    from tfcli.checkpoint import Checkpoint
    from tfcli.tokenizer.core import TextTokenizer

MASK_PLACEHOLDER = "[MASK]"
LENS_FORMAT = "tfcli-logit-lens"
LENS_VERSION = 1
SUPPORTED = ("decoder", "encoder", "encoder-decoder")


def _special_view(tokenizer: TextTokenizer, token_id: int) -> TokenView:
    token = tokenizer.hf.id_to_token(token_id) or ""
    return TokenView(id=token_id, token=token, text=visible(token))


def decoder_views(checkpoint: Checkpoint, text: str, what: str = "text") -> list[TokenView]:
    """The tokens of a decoder's text, refused when empty or longer than the block size."""
    limit = checkpoint.config.model.block_size
    views = token_views(checkpoint.tokenizer, within_context(text, limit, what))
    if not views:
        raise TfcliError(f"the {what} is empty (no tokens)", hint="pass some text")
    if len(views) > limit:
        raise TfcliError(f"the {what} is {len(views):,} tokens, longer than the model's block size ({limit:,})", hint="shorten it")
    return views


def encoder_views(checkpoint: Checkpoint, text: str) -> tuple[list[TokenView], list[int]]:
    """An encoder's input as masked-LM training reads it: [cls], then the text with each `[MASK]` (or the
    tokenizer's own mask token) as the mask id; returns the views and the mask positions."""
    tokenizer = checkpoint.tokenizer
    text = within_context(text, checkpoint.config.model.block_size, "text")
    mask_id, cls_id = tokenizer.require("mask"), tokenizer.require("cls")
    mask_text = tokenizer.hf.id_to_token(mask_id) or MASK_PLACEHOLDER
    pieces = re.split("|".join(re.escape(m) for m in dict.fromkeys([MASK_PLACEHOLDER, mask_text])), text)
    if len(pieces) < 2:
        raise TfcliError(
            f"an encoder predicts masked tokens: the text has no {MASK_PLACEHOLDER}",
            hint=f'write one where a word is missing: "The {MASK_PLACEHOLDER} sat on the mat"',
        )
    if tokenizer.words_carry_their_space:  # the filler brings its own space, as in `generate --fill-mask`
        pieces = [p[:-1] if p.endswith(" ") and i < len(pieces) - 1 else p for i, p in enumerate(pieces)]
    views, masks = [_special_view(tokenizer, cls_id)], []
    for i, piece in enumerate(pieces):
        views += token_views(tokenizer, piece) if piece else []
        if i < len(pieces) - 1:
            masks.append(len(views))
            views.append(_special_view(tokenizer, mask_id))
    limit = checkpoint.config.model.block_size
    if len(views) > limit:
        raise TfcliError(f"the text is {len(views):,} tokens, longer than the model's block size ({limit:,})", hint="shorten it")
    return views, masks


def lens_logits(model, ids: list[int], decoder_ids: list[int] | None = None) -> torch.Tensor:
    """The logit lens of one text: float32 (L + 1, T, vocab), [0] from the embeddings, [l + 1] after block l.
    The last entry is the model's own logits. An encoder-decoder reads `ids` as the source and is looked at
    on its decoder's side, over `decoder_ids` (T of them)."""
    stack = lens_stack(model, "inspect-logits", SUPPORTED)
    device = model.lm_head.weight.device
    with torch.inference_mode(), Hooks() as hooks:
        stream = hooks.residual_stream(stack)
        decoder = None if decoder_ids is None else DecoderInput(torch.tensor([decoder_ids], device=device))  # (1, T)
        model(torch.tensor([ids], device=device), head=HIDDEN, decoder=decoder)
        return torch.stack([unembed(model, stack, x[0]).float() for x in stream])  # (L + 1, T, vocab)


@dataclasses.dataclass
class LensCell:
    """One layer's prediction at one position."""

    top: list[tuple[int, str, float]]  # (id, text, probability), the most likely first
    target_rank: int | None = None  # of the token it should predict: 1 = the most likely
    target_probability: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"top": [{"id": i, "text": t, "probability": round(p, 6)} for i, t, p in self.top]}
        if self.target_rank is not None:
            out["target"] = {"rank": self.target_rank, "probability": round(self.target_probability, 6)}
        return out


@dataclasses.dataclass
class LogitLens:
    run: str
    text: str
    arch: str
    tokens: list[TokenView]
    layers: list[str]  # "embeddings", "block 0", ...
    positions: list[int]  # the positions read: every one (decoder) or the masks (encoder)
    targets: list[int | None]  # per position read: the token it should predict (a decoder's next token), or None
    cells: list[list[LensCell]]  # [layer][position read]
    losses: list[float | None]  # per layer: mean cross-entropy (nats) on the targets; None without targets
    top_k: int
    target: str | None = None  # an encoder-decoder's target (`text` is its source; `tokens` the decoder's)
    labels: dict[int, str] = dataclasses.field(default_factory=dict)  # the cells' tokens as tables show them (`token_label`)

    def label(self, token_id: int, text: str) -> str:
        """A predicted token as tables and pictures name it ("␣the"); its `text` (JSON's, " the") where unknown."""
        return self.labels.get(token_id, text)

    def to_json(self, tokenizer_text) -> dict[str, Any]:
        return {
            "format": LENS_FORMAT,
            "version": LENS_VERSION,
            "run": self.run,
            "text": self.text,
            "target": self.target,
            "arch": self.arch,
            "tokens": [v.to_json() for v in self.tokens],
            "layers": self.layers,
            "positions": self.positions,
            "targets": [None if t is None else {"id": t, "text": tokenizer_text(t)} for t in self.targets],
            "losses": [None if x is None else round(x, 6) for x in self.losses],
            "cells": [[cell.to_json() for cell in row] for row in self.cells],
        }


def _seq2seq_views(checkpoint: Checkpoint, text: str, target: str | None) -> tuple[list[int], list[TokenView]]:
    """An encoder-decoder's source ids and its decoder's tokens: the start token (eos), then the target, as
    training feeds them."""
    if target is None:
        raise TfcliError("an encoder-decoder's logit lens reads its decoder: it needs the target text", hint="pass --target TEXT (--text is the source)")
    if not target.strip():
        raise TfcliError("the target is empty", hint="pass --target TEXT")
    tokenizer = checkpoint.tokenizer
    source = decoder_views(checkpoint, text, "source text")
    start = _special_view(tokenizer, tokenizer.require("eos"))
    views = [start, *decoder_views(checkpoint, target, "target text")]
    if len(views) > checkpoint.config.model.block_size:
        raise TfcliError(f"the target and its start token are {len(views):,} tokens, longer than the model's block size", hint="shorten it")
    return [v.id for v in source], views


def logit_lens(checkpoint: Checkpoint, text: str, *, target: str | None = None, top_k: int = 5) -> LogitLens:
    """What each layer predicts at each position of `text` (an encoder-decoder: of its decoder, reading
    `target` after its start token, with `text` as the source); see `lens_logits`."""
    if top_k < 1:
        raise TfcliError(f"--top-k must be at least 1, not {top_k}")
    if not text.strip():
        raise TfcliError("the text is empty", hint="pass --text TEXT")
    config = checkpoint.config.model

    lens_stack(checkpoint.model, "inspect-logits", SUPPORTED)  # an unsupported architecture fails before any work
    if target is not None and config.arch != "encoder-decoder":
        raise TfcliError(f"--target is for encoder-decoder runs; this one is {a_or_an(config.arch)}", hint="drop --target")
    source_ids = None
    if config.arch == "encoder":
        views, positions = encoder_views(checkpoint, text)
        targets: list[int | None] = [None] * len(positions)
    else:
        if config.arch == "encoder-decoder":
            source_ids, views = _seq2seq_views(checkpoint, text, target)
        else:
            views = decoder_views(checkpoint, text)
        positions = list(range(len(views)))
        targets = [views[p + 1].id if p + 1 < len(views) else None for p in positions]
    ids = [v.id for v in views]
    if source_ids is None:
        logits = lens_logits(checkpoint.model, ids)[:, positions]  # (L + 1, P, vocab)
    else:
        logits = lens_logits(checkpoint.model, source_ids, ids)[:, positions]
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    k = min(top_k, logits.shape[-1])
    top = probs.topk(k, dim=-1)
    tokenizer = checkpoint.tokenizer
    names: dict[int, str] = {}

    def name(token_id: int) -> str:
        if token_id not in names:
            names[token_id] = token_text(tokenizer, token_id)
        return names[token_id]

    scored = [i for i, t in enumerate(targets) if t is not None]
    target_ids = torch.tensor([targets[i] for i in scored], dtype=torch.long, device=logits.device)
    where = {i: j for j, i in enumerate(scored)}  # position read -> its row among the scored
    cells, losses = [], []
    for layer in range(logits.shape[0]):
        row = []
        target_logits = logits[layer, scored, target_ids] if scored else None  # (S,)
        ranks = (logits[layer, scored] > target_logits[:, None]).sum(-1) + 1 if scored else None  # (S,)
        for i in range(len(positions)):
            entries = [(int(t), name(int(t)), float(p)) for t, p in zip(top.indices[layer, i], top.values[layer, i])]
            cell = LensCell(entries)
            if targets[i] is not None:
                j = where[i]
                cell.target_rank = int(ranks[j])
                cell.target_probability = float(probs[layer, i, targets[i]])
            row.append(cell)
        cells.append(row)
        losses.append(float(-log_probs[layer, scored, target_ids].mean()) if scored else None)
    n = logits.shape[0] - 1
    layers = ["embeddings"] + [f"block {i}" for i in range(n)]
    return LogitLens(
        run=str(checkpoint.path),
        text=text,
        target=target,
        arch=config.arch,
        tokens=views,
        layers=layers,
        positions=positions,
        targets=targets,
        cells=cells,
        losses=losses,
        top_k=k,
        labels={token_id: token_label(tokenizer, token_id) for token_id in names},
    )


def probabilities(lens: LogitLens) -> np.ndarray:
    """The top-1 probability of every cell, [layer][position read]."""
    return np.array([[cell.top[0][2] for cell in row] for row in lens.cells], dtype=np.float32)
