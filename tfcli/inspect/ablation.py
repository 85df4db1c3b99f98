"""Head ablation (`tfcli inspect-ablate`): knock out attention heads (their output before the output
projection, zeroed or replaced by its mean) and measure the change in the loss on a text and in the
next-token distribution at one position. Many ablations run as rows of one batch, fanned out at the first
layer they touch (`Hooks.fan_out`), so the layers before it run once. Edits are scoped hooks on the one model.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tfcli.errors import TfcliError
from tfcli.inspect.hooks import Hooks, lens_stack
from tfcli.inspect.lens import decoder_views, token_text
from tfcli.model.transformer import HIDDEN
from tfcli.tokenizer.show import token_label

if TYPE_CHECKING:
    from tfcli.checkpoint import Checkpoint

MODES: tuple[str, ...] = ("zero", "mean")
ABLATE_FORMAT = "tfcli-ablation"
ABLATE_VERSION = 1
ROWS_PER_BATCH = 16  # ablations run together (each a row of the batch)


def parse_heads(spec: str, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """ "1.0,2.3" -> [(1, 0), (2, 3)]; "1.*" -> every head of layer 1. Negative numbers count from the end.

    Example: parse_heads("0.1, -1.*", 2, 2) -> [(0, 1), (1, 0), (1, 1)]
    """
    heads: list[tuple[int, int]] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        layer_text, dot, head_text = item.partition(".")
        try:
            layer = int(layer_text)
            head_list = list(range(n_heads)) if head_text in ("*", "all") else [int(head_text)]
        except ValueError:
            raise TfcliError(f"--heads {item!r} is not LAYER.HEAD", hint="write heads as 1.0,2.3 (layer.head), or 1.* for a whole layer") from None
        if not dot:
            raise TfcliError(f"--heads {item!r} is not LAYER.HEAD", hint="write heads as 1.0,2.3 (layer.head), or 1.* for a whole layer")
        if not -n_layers <= layer < n_layers:
            raise TfcliError(f"--heads {item}: layer {layer} is out of range (0 to {n_layers - 1})")
        for head in head_list:
            if not -n_heads <= head < n_heads:
                raise TfcliError(f"--heads {item}: head {head} is out of range (0 to {n_heads - 1})")
            pair = (layer % n_layers, head % n_heads)
            if pair not in heads:
                heads.append(pair)
    if not heads:
        raise TfcliError("--heads is empty", hint="name heads as 1.0,2.3 (layer.head)")
    return heads


def head_means(model, ids: list[int]) -> torch.Tensor:
    """Each head's mean output over the positions of one text: (L, nh, hs)."""
    stack = lens_stack(model, "inspect-ablate", ("decoder",))
    with torch.inference_mode(), Hooks() as hooks:
        outputs = hooks.head_outputs(stack)
        model(torch.tensor([ids], device=model.lm_head.weight.device), head=HIDDEN)
        return torch.stack([z[0].mean(dim=0) for z in outputs])  # (L, nh, hs)


def ablated_runs(
    model, ids: list[int], rows: list[list[tuple[int, int]]], replacement: torch.Tensor, position: int, batch: int = ROWS_PER_BATCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one text with each row's heads knocked out (head (l, h) -> replacement[l, h], zeros for zero
    ablation); an empty row is the plain model. Returns each row's mean cross-entropy on the text's next
    tokens (rows,) and its log-probabilities at `position` (rows, vocab).

    Rows are grouped by the first layer they touch (the plain run with layer 0's); each group is one batch
    (of at most `batch` rows) fanned out there, so the layers before it run once, at batch size one.
    """
    stack = lens_stack(model, "inspect-ablate", ("decoder",))
    device = model.lm_head.weight.device
    src = torch.tensor([ids], device=device)  # (1, T)
    targets = src[0, 1:]
    losses = torch.zeros(len(rows))
    log_probs = torch.zeros(len(rows), model.config.vocab_size)

    def first_layer(r: int) -> int:  # the plain run (no heads) goes with the rows fanned out at layer 0
        return min((l for l, _ in rows[r]), default=0)

    groups: list[list[int]] = []
    for r in sorted(range(len(rows)), key=first_layer):
        if groups and len(groups[-1]) < batch and first_layer(groups[-1][0]) == first_layer(r):
            groups[-1].append(r)
        else:
            groups.append([r])
    with torch.inference_mode():
        for group in groups:
            with Hooks() as hooks:
                hooks.fan_out(stack, first_layer(group[0]), len(group))
                by_layer: dict[int, list[tuple[int, int]]] = {}
                for i, r in enumerate(group):
                    for layer, head in rows[r]:
                        by_layer.setdefault(layer, []).append((i, head))
                for layer, pairs in by_layer.items():
                    hooks.edit_heads(stack, layer, _replace(pairs, replacement[layer]))
                hidden = model(src, head=HIDDEN).hidden  # (rows, T, d)
            for i, r in enumerate(group):
                logits = model.unembed(hidden[i]).float()  # (T, vocab)
                log_norm = torch.logsumexp(logits, dim=-1)  # (T,): log-softmax without a second (T, vocab) tensor
                if len(ids) > 1:
                    losses[r] = (log_norm[:-1] - logits[:-1].gather(1, targets[:, None])[:, 0]).mean()
                log_probs[r] = (logits[position] - log_norm[position]).cpu()
    return losses, log_probs


def _replace(pairs: list[tuple[int, int]], values: torch.Tensor):
    rows = [i for i, _ in pairs]
    heads = [h for _, h in pairs]

    def edit(z):  # z (rows, T, nh, hs); values (nh, hs)
        z[rows, :, heads] = values[heads].to(z.dtype)[:, None, :]

    return edit


@dataclasses.dataclass
class Ablation:
    run: str
    text: str
    tokens: list[Any]  # TokenView
    mode: str
    reference: str | None  # the text the means came from (mean mode, --reference-text)
    position: int
    base_loss: float
    base_top: list[tuple[int, str, float]]  # at `position`, before
    heads: list[tuple[int, int]] | None  # the heads knocked out together; None: every head, one at a time
    n_layers: int
    n_heads: int
    loss: np.ndarray  # heads: shape (1,); sweep: (L, nh)
    kl: np.ndarray  # KL(before || after) at `position`, in nats; same shape
    top: list[tuple[int, str, float]] | None = None  # at `position`, after (heads given)
    seconds: float = 0.0
    labels: dict[int, str] = dataclasses.field(default_factory=dict)  # the predictions as tables show them (`token_label`)

    def label(self, token_id: int, text: str) -> str:
        """A predicted token as tables name it ("␣the"); its `text` (JSON's, " the") where unknown."""
        return self.labels.get(token_id, text)

    @property
    def delta(self) -> np.ndarray:
        return self.loss - self.base_loss

    def to_json(self) -> dict[str, Any]:
        def tops(entries):
            return [{"id": i, "text": t, "probability": round(p, 6)} for i, t, p in entries]

        doc: dict[str, Any] = {
            "format": ABLATE_FORMAT,
            "version": ABLATE_VERSION,
            "run": self.run,
            "text": self.text,
            "tokens": [v.to_json() for v in self.tokens],
            "mode": self.mode,
            "reference_text": self.reference,
            "position": self.position,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "loss": round(self.base_loss, 6),
            "top": tops(self.base_top),
        }
        if self.heads is not None:
            doc["ablated"] = {
                "heads": [f"{l}.{h}" for l, h in self.heads],
                "loss": round(float(self.loss[0]), 6),
                "loss_change": round(float(self.delta[0]), 6),
                "kl": round(float(self.kl[0]), 6),
                "top": tops(self.top or []),
            }
        else:
            doc["loss_change"] = np.round(self.delta.astype(np.float64), 6).tolist()  # [layer][head]
            doc["kl"] = np.round(self.kl.astype(np.float64), 6).tolist()
        return doc


def ablate(
    checkpoint: Checkpoint,
    text: str,
    *,
    heads: str | None = None,
    mode: str = "zero",
    reference_text: str | None = None,
    position: int | None = None,
    top_k: int = 5,
) -> Ablation:
    """Knock out `heads` together ("1.0,2.3"), or without them every head one at a time."""
    began = time.perf_counter()
    if mode not in MODES:
        raise TfcliError(f"unknown --mode {mode!r}", hint=f"use {' or '.join(MODES)}")
    if reference_text is not None and mode != "mean":
        raise TfcliError("--reference-text is for --mode mean", hint="add --mode mean, or drop --reference-text")
    if top_k < 1:
        raise TfcliError(f"--top-k must be at least 1, not {top_k}")
    if not text.strip():
        raise TfcliError("the text is empty", hint="pass --text TEXT")
    model, config = checkpoint.model, checkpoint.config.model
    lens_stack(model, "inspect-ablate", ("decoder",))
    views = decoder_views(checkpoint, text)
    if len(views) < 2:
        raise TfcliError("the text is one token: there is no next token to score", hint="pass a longer text")
    T = len(views)
    if position is None:
        position = T - 1
    if not -T <= position < T:
        raise TfcliError(f"--position {position} is out of range: the text is {T} tokens (0 to {T - 1})")
    position %= T
    L, nh = config.decoder_layers, config.n_heads
    chosen = parse_heads(heads, L, nh) if heads is not None else None
    ids = [v.id for v in views]
    if mode == "zero":
        replacement = torch.zeros(L, nh, config.head_dim, device=model.lm_head.weight.device)
    else:
        reference = ids if reference_text is None else [v.id for v in decoder_views(checkpoint, reference_text, "reference text")]
        replacement = head_means(model, reference)
    rows = [[]] + ([chosen] if chosen is not None else [[(l, h)] for l in range(L) for h in range(nh)])
    losses, log_probs = ablated_runs(model, ids, rows, replacement, position)
    base = log_probs[0]
    kl = (base.exp() * (base - log_probs[1:])).sum(-1).clamp(min=0.0)  # (rows - 1,)
    tokenizer = checkpoint.tokenizer

    def top(lp: torch.Tensor) -> list[tuple[int, str, float]]:
        values, indices = lp.exp().topk(min(top_k, lp.shape[-1]))
        return [(int(i), token_text(tokenizer, int(i)), float(v)) for i, v in zip(indices, values)]

    shape = (1,) if chosen is not None else (L, nh)
    base_top, after_top = top(base), (top(log_probs[1]) if chosen is not None else None)
    return Ablation(
        run=str(checkpoint.path),
        text=text,
        tokens=views,
        mode=mode,
        reference=reference_text,
        position=position,
        base_loss=float(losses[0]),
        base_top=base_top,
        heads=chosen,
        n_layers=L,
        n_heads=nh,
        loss=losses[1:].numpy().reshape(shape),
        kl=kl.numpy().reshape(shape),
        top=after_top,
        seconds=time.perf_counter() - began,
        labels={i: token_label(tokenizer, i) for i, _, _ in base_top + (after_top or [])},
    )
