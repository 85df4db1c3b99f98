"""The attention view of a served exchange: the ids of the last few single-completion responses are kept
(a bounded store, oldest out first) under the response's id, and drawn on request as the page
`tfcli inspect-attention --format html` draws (one forward pass whose weights are read at the model's
`hook_pattern` hook points, in the engine's thread)."""

from __future__ import annotations

import collections
import dataclasses
import threading

from tfcli.checkpoint import Checkpoint
from tfcli.inspect.capture import AttentionCapture, forward_weights
from tfcli.inspect.html import render_page
from tfcli.tokenizer.show import views_of_ids

KEPT_EXCHANGES = 64


@dataclasses.dataclass(frozen=True)
class Exchange:
    prompt: list[int]
    reply: list[int]
    title: str


class Exchanges:
    """The last KEPT_EXCHANGES exchanges by response id (thread-safe: handlers add, the engine reads)."""

    def __init__(self, kept: int = KEPT_EXCHANGES) -> None:
        self.kept = kept
        self._items: collections.OrderedDict[str, Exchange] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, key: str, exchange: Exchange) -> None:
        with self._lock:
            self._items[key] = exchange
            while len(self._items) > self.kept:
                self._items.popitem(last=False)

    def get(self, key: str) -> Exchange | None:
        with self._lock:
            return self._items.get(key)


def attention_page(checkpoint: Checkpoint, exchange: Exchange) -> str:
    """The attention page of prompt + reply (the reply's last token is never run through the model when
    decoding, but it is here: every token the reader sees has its row)."""
    ids = (exchange.prompt + exchange.reply)[-checkpoint.model.config.block_size :]
    views = views_of_ids(checkpoint.tokenizer, ids)
    weights = forward_weights(checkpoint.model, "decoder", ids)
    capture = AttentionCapture(
        run=str(checkpoint.path),
        kind="decoder",
        text=exchange.title,
        target=None,
        queries=views,
        keys=views,
        weights=weights,
        causal=True,
        source_ids=ids,
        decoder_ids=None,
        notes=[f"the prompt's {len(exchange.prompt):,} tokens, then the reply's {len(exchange.reply):,}"],
    )
    return render_page([capture], [exchange.title], heading=f"attention of {checkpoint.path.name}: one exchange")
