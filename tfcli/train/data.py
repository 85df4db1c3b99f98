"""Batches for every training objective, drawn as a pure function of (seed, step, micro-step).

The global batch of a step is the same whatever the number of processes: rank r of W takes rows
[r*B, (r+1)*B) of the W*B rows a single process would draw. Because nothing depends on what came before,
resuming needs only the step number, and the data position is exact by construction.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Protocol

import numpy as np
import torch

from tfcli.data.labeled import LabeledSet
from tfcli.errors import TfcliError
from tfcli.model.loss import IGNORE_INDEX

IGNORE = IGNORE_INDEX  # label of a position that carries no loss


def derived_seed(*parts: Any) -> int:
    """A 63-bit seed from any parts. Example: derived_seed(1337, "train", 5, 0) is the same on every machine."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def generator(*parts: Any) -> torch.Generator:
    return torch.Generator().manual_seed(derived_seed(*parts))


@dataclasses.dataclass
class Batch:
    """Model inputs and labels for one micro-batch on one process; `count` is how many targets carry loss."""

    tensors: dict[str, torch.Tensor]
    count: int

    def to(self, device: torch.device) -> Batch:
        return Batch({k: v.to(device, non_blocking=True) for k, v in self.tensors.items()}, self.count)


@dataclasses.dataclass(frozen=True)
class Slot:
    """Which rows of which draw: rank r of world W, B rows each."""

    step: int
    micro: int
    rank: int = 0
    world: int = 1


class TokenWindows:
    """Random windows of `length` + 1 tokens from memory-mapped shards (inputs and next-token targets)."""

    def __init__(self, tokens: np.ndarray, length: int, what: str) -> None:
        if len(tokens) < length + 1:
            more = "encode more text" if what == "train" else "encode with a larger --val-fraction"
            raise TfcliError(f"the {what} split holds {len(tokens):,} tokens, fewer than one window of {length + 1:,}", hint=f"lower --block-size or {more}")
        self.tokens, self.length = tokens, length

    @classmethod
    def validation(cls, tokens: np.ndarray, length: int) -> TokenWindows | None:
        """The validation windows; None when the split is empty (then nothing is validated). A split too short
        for one window is refused like a short train split, rather than silently never validating."""
        return cls(tokens, length, "validation") if len(tokens) else None

    def random_starts(self, gen: torch.Generator, n: int) -> torch.Tensor:
        return torch.randint(0, len(self.tokens) - self.length, (n,), generator=gen)

    def spread_starts(self, n: int) -> torch.Tensor:
        """Up to n starts spread evenly over the split (no more than fit side by side, so a small split is
        not scored many times over): the same windows at every evaluation."""
        n = min(n, max(1, (len(self.tokens) - 1) // self.length))
        last = len(self.tokens) - self.length - 1
        return torch.linspace(0, last, n).round().long().unique()

    def rows(self, starts: torch.Tensor) -> torch.Tensor:
        rows = np.stack([np.asarray(self.tokens[s : s + self.length + 1]) for s in starts.tolist()])
        return torch.from_numpy(rows.astype(np.int64))  # (n, length + 1)


class Source(Protocol):
    """What the loop asks of any task's data."""

    per_rank: int  # B, rows per micro-batch on one process
    tokens_per_row: int  # for tokens/s

    def batch(self, slot: Slot) -> Batch: ...

    def validation(self, n_batches: int, rows: int) -> list[Batch]: ...


def _rank_rows(rows: torch.Tensor, slot: Slot, per_rank: int) -> torch.Tensor:
    return rows[slot.rank * per_rank : (slot.rank + 1) * per_rank]


class LMSource(Source):
    """Causal LM: predict token t+1 from tokens up to t."""

    def __init__(self, train: np.ndarray, val: np.ndarray, block: int, per_rank: int, seed: int) -> None:
        self.train = TokenWindows(train, block, "train")
        self.val = TokenWindows.validation(val, block)
        self.per_rank, self.seed, self.tokens_per_row = per_rank, seed, block

    def _make(self, rows: torch.Tensor) -> Batch:
        return Batch({"ids": rows[:, :-1], "labels": rows[:, 1:]}, rows[:, 1:].numel())

    def batch(self, slot: Slot) -> Batch:
        gen = generator(self.seed, "train", slot.step, slot.micro)
        starts = self.train.random_starts(gen, self.per_rank * slot.world)
        return self._make(self.train.rows(_rank_rows(starts, slot, self.per_rank)))

    def validation(self, n_batches: int, rows: int) -> list[Batch]:
        if self.val is None:
            return []
        starts = self.val.spread_starts(n_batches * rows)
        return [self._make(self.val.rows(chunk)) for chunk in starts.split(rows)]


def mask_tokens(
    ids: torch.Tensor, gen: torch.Generator, *, prob: float, mask_id: int, vocab: int, protected: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's recipe: pick `prob` of the positions to predict; of those, 80% become [mask], 10% a random
    token, 10% stay. Returns (inputs, labels) with labels IGNORE outside the picked positions."""
    picked = (torch.rand(ids.shape, generator=gen) < prob) & ~protected
    roll = torch.rand(ids.shape, generator=gen)
    random_ids = torch.randint(0, vocab, ids.shape, generator=gen)
    inputs = ids.clone()
    inputs[picked & (roll < 0.8)] = mask_id
    swap = picked & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = random_ids[swap]
    labels = torch.where(picked, ids, torch.full_like(ids, IGNORE))
    return inputs, labels


class NoisedWindows(Source):
    """Windows from shards with random noise on top (masks, spans): the noise is drawn for the global batch
    with the windows' generator, then each rank takes its slice. Subclasses define `_make(rows, gen)`."""

    train: TokenWindows
    val: TokenWindows | None
    seed: int

    def batch(self, slot: Slot) -> Batch:
        gen = generator(self.seed, "train", slot.step, slot.micro)
        starts = self.train.random_starts(gen, self.per_rank * slot.world)
        return _slice_batch(self._make(self.train.rows(starts), gen), slot, self.per_rank)

    def validation(self, n_batches: int, rows: int) -> list[Batch]:
        if self.val is None:
            return []
        gen = generator(self.seed, "validation")
        starts = self.val.spread_starts(n_batches * rows)
        return [self._make(self.val.rows(chunk), gen) for chunk in starts.split(rows)]


class MLMSource(NoisedWindows):
    """Masked LM for an encoder: [cls] + a window of block - 1 tokens, 15% of them to predict."""

    def __init__(self, train, val, block: int, per_rank: int, seed: int, *, cls_id: int, mask_id: int, vocab: int, prob: float) -> None:
        self.train = TokenWindows(train, block - 2, "train")  # block - 1 text tokens (+1 unused target)
        self.val = TokenWindows.validation(val, block - 2)
        self.per_rank, self.seed, self.tokens_per_row = per_rank, seed, block
        self.cls_id, self.mask_id, self.vocab, self.prob = cls_id, mask_id, vocab, prob

    def _make(self, rows: torch.Tensor, gen: torch.Generator) -> Batch:
        ids = torch.cat([torch.full((rows.shape[0], 1), self.cls_id), rows], dim=1)  # (n, block)
        protected = torch.zeros_like(ids, dtype=torch.bool)
        protected[:, 0] = True
        inputs, labels = mask_tokens(ids, gen, prob=self.prob, mask_id=self.mask_id, vocab=self.vocab, protected=protected)
        return Batch({"ids": inputs, "labels": labels}, int((labels != IGNORE).sum()))


def _slice_batch(batch: Batch, slot: Slot, per_rank: int) -> Batch:
    tensors = {k: _rank_rows(v, slot, per_rank) for k, v in batch.tensors.items()}
    labels = tensors["labels"]
    count = labels.shape[0] if labels.dim() == 1 else int((labels != IGNORE).sum())
    return Batch(tensors, count)


def pad_rows(rows: list[list[int]], pad_id: int, fill: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into (n, longest) plus the padding mask (True = real token)."""
    longest = max(len(r) for r in rows)
    out = torch.full((len(rows), longest), pad_id if fill is None else fill, dtype=torch.long)
    real = torch.zeros((len(rows), longest), dtype=torch.bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        real[i, : len(r)] = True
    return out, real


def seq2seq_batch(sources: list[list[int]], targets: list[list[int]], *, pad_id: int, start_id: int) -> Batch:
    """Teacher forcing: the decoder reads [start] + target[:-1] and predicts target."""
    src, src_real = pad_rows(sources, pad_id)
    dec_in, dec_real = pad_rows([[start_id] + t[:-1] for t in targets], pad_id)
    labels, _ = pad_rows(targets, pad_id, fill=IGNORE)
    return Batch({"ids": src, "padding": src_real, "decoder_ids": dec_in, "decoder_padding": dec_real, "labels": labels}, int((labels != IGNORE).sum()))


def span_corrupt(ids: list[int], gen: torch.Generator, *, density: float, mean_span: float, mask_id: int) -> list[int]:
    """BART's text infilling: spans covering about `density` of the tokens each collapse into one [mask]."""
    n = len(ids)
    n_noise = max(1, round(n * density))
    n_spans = max(1, round(n_noise / mean_span))
    starts = torch.randperm(n, generator=gen)[:n_spans].sort().values.tolist()
    lengths = torch.poisson(torch.full((n_spans,), float(mean_span)), generator=gen).clamp(min=1).long().tolist()
    out, i = [], 0
    for start, length in zip(starts, lengths):
        if start < i:
            continue
        out.extend(ids[i:start])
        out.append(mask_id)
        i = min(n, start + length)
    out.extend(ids[i:])
    return out


class DenoiseSource(NoisedWindows):
    """Encoder-decoder pretraining on plain text: the encoder reads a window with masked spans, the decoder
    writes the window back."""

    def __init__(self, train, val, block: int, per_rank: int, seed: int, *, pad_id: int, mask_id: int, eos_id: int, density: float, mean_span: float) -> None:
        # windows of block - 1 tokens; the target is the window + [eos], the block exactly
        self.train = TokenWindows(train, block - 2, "train")
        self.val = TokenWindows.validation(val, block - 2)
        self.per_rank, self.seed, self.tokens_per_row = per_rank, seed, block
        self.pad_id, self.mask_id, self.eos_id = pad_id, mask_id, eos_id
        self.density, self.mean_span = density, mean_span

    def _make(self, rows: torch.Tensor, gen: torch.Generator) -> Batch:
        windows = rows.tolist()
        sources = [span_corrupt(w, gen, density=self.density, mean_span=self.mean_span, mask_id=self.mask_id) for w in windows]
        targets = [w + [self.eos_id] for w in windows]
        return seq2seq_batch(sources, targets, pad_id=self.pad_id, start_id=self.eos_id)


class LabeledSource(Source):
    """classify / seq2seq examples, visited in a fresh seeded order each epoch."""

    def __init__(self, task: str, train: LabeledSet, val: LabeledSet | None, per_rank: int, seed: int, *, pad_id: int, eos_id: int, accum: int) -> None:
        if len(train) == 0:
            raise TfcliError(f"{train.path}: no examples left to train on", hint="add examples or lower --set val_fraction")
        self.task, self.train, self.val = task, train, val
        self.per_rank, self.seed, self.pad_id, self.eos_id, self.accum = per_rank, seed, pad_id, eos_id, accum
        self.tokens_per_row = math.ceil(sum(map(len, train.inputs)) / len(train))
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            self._orders = {epoch: torch.randperm(len(self.train), generator=generator(self.seed, "epoch", epoch)).tolist()}
        return self._orders[epoch]

    def _make(self, data: LabeledSet, idx: list[int]) -> Batch:
        if self.task == "classify":
            ids, real = pad_rows([data.inputs[i] for i in idx], self.pad_id)
            labels = torch.tensor([data.targets[i] for i in idx], dtype=torch.long)
            return Batch({"ids": ids, "padding": real, "labels": labels}, len(idx))
        return seq2seq_batch([data.inputs[i] for i in idx], [data.targets[i] for i in idx], pad_id=self.pad_id, start_id=self.eos_id)

    def batch(self, slot: Slot) -> Batch:
        # The global micro-batches of all steps, laid end to end over an endless sequence of epochs.
        global_rows = self.per_rank * slot.world
        position = (slot.step * self.accum + slot.micro) * global_rows + slot.rank * self.per_rank
        n = len(self.train)
        idx = [self._order(p // n)[p % n] for p in range(position, position + self.per_rank)]
        return self._make(self.train, idx)

    def validation(self, n_batches: int, rows: int) -> list[Batch]:
        if self.val is None or len(self.val) == 0:
            return []
        idx = list(range(len(self.val)))
        return [self._make(self.val, idx[i : i + rows]) for i in range(0, len(idx), rows)]
