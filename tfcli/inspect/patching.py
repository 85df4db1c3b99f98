"""Activation patching (`tfcli inspect-patch`): run the corrupted text, put the clean run's residual stream
back at one (layer, position) at a time (or, per head, one head's output at every position), and measure how
much of the logit difference answer - wrong at the last position comes back:

    restored = (patched - corrupted) / (clean - corrupted)

1 where the patch brings the clean answer back entirely, 0 where it changes nothing. Patches run as rows of
one batch from their block on (the blocks before it are the corrupted run's), from their first position on
(the corrupted run's keys and values before it in the model's KV cache), the last block at the last
position only and the vocabulary head for the two tokens only; a position whose clean and corrupted
residuals are equal needs no run (it restores exactly 0). Edits are scoped hooks on the one model.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tfcli.errors import TfcliError
from tfcli.inspect.attribution import attribution_differences, top_cells
from tfcli.inspect.hooks import Hooks, lens_stack
from tfcli.inspect.lens import decoder_views, token_text
from tfcli.inspect.recording import logit_difference, record
from tfcli.model.attention import AttentionMask, KVCache

if TYPE_CHECKING:
    from tfcli.checkpoint import Checkpoint

PATCH_FORMAT = "tfcli-patching"
PATCH_VERSION = 2  # 2: "method", "verified", "head_verified"
METHODS = ("exact", "attribution")
ROWS_PER_BATCH = 8  # patches run together, each batch from its first patched position on (more rows: more positions run twice)


def run_from(model, stack, layer: int, x: torch.Tensor, cache=None) -> torch.Tensor:
    """Blocks `layer`.. of the stack on x (rows, n, d), the residual stream at block `layer`'s input for the n
    positions after the cache's (all of them without a cache), each block called as `Stack.forward` calls it;
    the blocks before `layer`, whose output x replaces, do not run. Only the last position is read, so the
    last block runs its output projection and MLP there only (`Hooks.last_position_only`). Returns the last
    position's output of the stack, normed (rows, d)."""
    offset, n = (cache.length if cache is not None else 0), x.shape[1]
    mask = AttentionMask.build(n, offset + n, causal=True, offset=offset)
    with Hooks() as hooks:
        hooks.last_position_only(stack)
        for i in range(layer, len(stack.blocks)):
            x = stack.blocks[i](x, mask, cache=cache.layer(i) if cache is not None else None)
    return stack.norm(x[:, -1])


def _rows_of(cache, rows: int, start: int):
    """The first `rows` rows of `cache` (L, B, nkv, T, hs), as a KVCache whose runs start at position `start`:
    they read its keys and values before `start` and write theirs from `start` on."""

    class Rows(KVCache):
        def __init__(self) -> None:  # the parent's fields, as views of `cache`'s
            self.keys, self.values = cache.keys[:, :rows], cache.values[:, :rows]  # (L, rows, nkv, T, hs)
            self.cross, self.capacity, self.length = cache.cross, cache.capacity, start

    return Rows()


def _patch_positions(model, stack, layer: int, positions: list[int], clean, corrupt, rows_cache, recorded, batch: int, answer: int, wrong: int) -> np.ndarray:
    """The logit difference with the clean residual stream put in at the input of block `layer` at each of
    `positions` (ascending), one position per row. A batch of rows runs from its first position on: before
    it every row is the corrupted run, whose keys and values `rows_cache` holds; the batch's own writes
    there are undone after it."""
    out = np.empty(len(positions))
    for first in range(0, len(positions), batch):
        chunk = positions[first : first + batch]
        start, rows = chunk[0], len(chunk)
        x = corrupt[layer][start:].expand(rows, -1, -1).clone()  # (rows, T - start, d): the corrupted residual stream ...
        x[list(range(rows)), [p - start for p in chunk]] = clean[layer][chunk].to(x.dtype)  # ... row i clean at chunk[i]
        hidden = run_from(model, stack, layer, x, _rows_of(rows_cache, rows, start))
        out[first : first + rows] = logit_difference(model, hidden, answer, wrong).double().cpu().numpy()
        rows_cache.keys[layer:, :rows, :, start:] = recorded.keys[layer:, :, :, start:]  # the corrupted run's again
        rows_cache.values[layer:, :rows, :, start:] = recorded.values[layer:, :, :, start:]
    return out


def _patch_heads(model, stack, layer: int, heads: list[int], clean_heads, corrupt, answer: int, wrong: int) -> np.ndarray:
    """The logit difference with head h's clean output put in at every position of layer `layer`, one row
    per head of `heads`."""

    def put_heads(z):  # z (rows, T, nh, hs): row i gets head heads[i]'s clean output
        z[list(range(len(heads))), :, heads] = clean_heads[layer][:, heads].transpose(0, 1).to(z.dtype)

    x = corrupt[layer].expand(len(heads), -1, -1).clone()  # (rows, T, d)
    with Hooks() as hooks:
        hooks.edit_heads(stack, layer, put_heads)
        hidden = run_from(model, stack, layer, x)
    return logit_difference(model, hidden, answer, wrong).double().cpu().numpy()


def patch_differences(
    model,
    clean_ids: list[int],
    corrupt_ids: list[int],
    answer: int,
    wrong: int,
    *,
    per_head: bool = False,
    batch: int = ROWS_PER_BATCH,
    cells: list[tuple[int, int]] | None = None,
    head_cells: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """The logit differences answer - wrong at the last position: `clean`, `corrupted`, and `patched`
    [layer][position] with the clean residual stream put in at the input of block `layer` (its layers'
    residual stream before each block); with per_head, `heads` [layer][head] with the clean output of that
    head put in at every position. `cells` / `head_cells`, (layer, position) / (layer, head) pairs: patch
    only those (default: all). A cell whose clean and corrupted values are equal needs no run: it is the
    corrupted difference, as is every cell not patched."""
    stack = lens_stack(model, "inspect-patch", ("decoder",))
    device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
    L, T, nh = len(stack.blocks), len(corrupt_ids), stack.blocks[0].attn.n_heads
    wanted = set(cells) if cells is not None else {(l, p) for l in range(L) for p in range(T)}
    wanted_heads = set(head_cells) if head_cells is not None else {(l, h) for l in range(L) for h in range(nh)}
    with torch.inference_mode():
        clean_stream, clean_heads, clean_diff = record(model, stack, clean_ids, answer, wrong)
        recorded = KVCache(model.config, 1, T, dtype, device)
        corrupt_stream, corrupt_heads, corrupt_diff = record(model, stack, corrupt_ids, answer, wrong, recorded)
        rows_cache = KVCache(model.config, min(batch, T), T, dtype, device)
        rows_cache.keys[:], rows_cache.values[:] = recorded.keys, recorded.values  # each row: the corrupted run's
        patched = np.full((L, T), corrupt_diff, dtype=np.float64)
        for layer in range(L):
            differ = [p for p in range(T) if (layer, p) in wanted and not torch.equal(clean_stream[layer][p], corrupt_stream[layer][p])]
            if differ:
                args = (clean_stream, corrupt_stream, rows_cache, recorded, batch, answer, wrong)
                patched[layer, differ] = _patch_positions(model, stack, layer, differ, *args)
        heads = np.full((L, nh), corrupt_diff, dtype=np.float64) if per_head else None
        for layer in range(L) if per_head else ():
            differ = [h for h in range(nh) if (layer, h) in wanted_heads and not torch.equal(clean_heads[layer][:, h], corrupt_heads[layer][:, h])]
            if differ:
                heads[layer, differ] = _patch_heads(model, stack, layer, differ, clean_heads, corrupt_stream, answer, wrong)
    return {"clean": clean_diff, "corrupted": corrupt_diff, "patched": patched, "heads": heads}


@dataclasses.dataclass
class Patching:
    run: str
    clean: str
    corrupt: str
    clean_tokens: list[Any]  # TokenView
    corrupt_tokens: list[Any]
    answer: tuple[int, str]
    wrong: tuple[int, str]
    clean_diff: float
    corrupt_diff: float
    restored: np.ndarray  # (L, T): the fraction restored by patching the residual stream at (layer, position)
    head_restored: np.ndarray | None  # (L, nh), --per-head
    method: str = "exact"  # or "attribution": first-order estimates, the verified cells exact
    verified: list[tuple[int, int, float, float]] = dataclasses.field(default_factory=list)  # (layer, position, estimate, exact)
    head_verified: list[tuple[int, int, float, float]] = dataclasses.field(default_factory=list)  # (layer, head, estimate, exact)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        def grid(a: np.ndarray | None):
            return None if a is None else np.round(a.astype(np.float64), 6).tolist()

        return {
            "format": PATCH_FORMAT,
            "version": PATCH_VERSION,
            "run": self.run,
            "clean": self.clean,
            "corrupt": self.corrupt,
            "clean_tokens": [v.to_json() for v in self.clean_tokens],
            "corrupt_tokens": [v.to_json() for v in self.corrupt_tokens],
            "answer": {"id": self.answer[0], "text": self.answer[1]},
            "wrong": {"id": self.wrong[0], "text": self.wrong[1]},
            "logit_difference": {"clean": round(self.clean_diff, 6), "corrupted": round(self.corrupt_diff, 6)},
            "restored": grid(self.restored),
            "head_restored": grid(self.head_restored),
            "method": self.method,
            "verified": [{"layer": l, "position": p, "estimate": round(e, 6), "exact": round(x, 6)} for l, p, e, x in self.verified],
            "head_verified": [{"layer": l, "head": h, "estimate": round(e, 6), "exact": round(x, 6)} for l, h, e, x in self.head_verified],
        }


def single_token(checkpoint: Checkpoint, word: str, flag: str) -> int:
    """The id of a one-token word; a word of several tokens (or none) is an error that shows them."""
    tokenizer = checkpoint.tokenizer
    ids = tokenizer.encode(word)
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise TfcliError(f"{flag} is empty", hint="pass one token, e.g. ' Paris' (with its leading space)")
    shown = " ".join(repr(token_text(tokenizer, i)) for i in ids)
    hint = "pass one token"
    if not word.startswith(" ") and len(tokenizer.encode(" " + word)) == 1:
        hint = f"did you mean {' ' + word!r}? (words in the middle of a text carry their space)"
    raise TfcliError(f"{flag} {word!r} is {len(ids)} tokens ({shown})", hint=hint)


def check_method(method: str, verify: int | None) -> None:
    """--method and --verify, before anything loads."""
    if method not in METHODS:
        raise TfcliError(f"unknown --method {method!r}", hint=f"use {' or '.join(METHODS)}")
    if verify is not None and method != "attribution":
        raise TfcliError("--verify is for --method attribution (exact patching is exact everywhere)", hint="add --method attribution, or drop --verify")
    if verify is not None and verify < 0:
        raise TfcliError(f"--verify {verify} is negative", hint="pass how many of the largest estimates to re-check exactly, e.g. --verify 20")


def patch(
    checkpoint: Checkpoint,
    clean: str,
    corrupt: str,
    answer: str,
    wrong: str | None = None,
    *,
    per_head: bool = False,
    method: str = "exact",
    verify: int | None = None,
) -> Patching:
    """Activation patching (`method` exact) or its first-order estimate (attribution), with the `verify`
    largest estimates of each map re-checked exactly."""
    began = time.perf_counter()
    check_method(method, verify)
    model = checkpoint.model
    lens_stack(model, "inspect-patch", ("decoder",))
    for what, value in (("--clean", clean), ("--corrupt", corrupt)):
        if not value.strip():
            raise TfcliError(f"the {what} text is empty", hint=f"pass {what} TEXT")
    clean_views = decoder_views(checkpoint, clean, "clean text")
    corrupt_views = decoder_views(checkpoint, corrupt, "corrupted text")
    if len(clean_views) != len(corrupt_views):
        raise TfcliError(
            f"the clean text is {len(clean_views)} tokens and the corrupted text {len(corrupt_views)}; patching needs texts of the same token length",
            hint="change the corrupted text so that it tokenizes to as many tokens (e.g. swap one name for another)",
        )
    answer_id = single_token(checkpoint, answer, "--answer")
    clean_ids, corrupt_ids = [v.id for v in clean_views], [v.id for v in corrupt_views]
    wrong_id = single_token(checkpoint, wrong, "--wrong") if wrong is not None else None
    if wrong_id is None:  # the corrupted run's favourite other than the answer
        wrong_id = _corrupted_favourite(model, corrupt_ids, answer_id)
    if wrong_id == answer_id:
        raise TfcliError("--wrong is the same token as --answer", hint="pass another token with --wrong")
    if method == "exact":
        result = patch_differences(model, clean_ids, corrupt_ids, answer_id, wrong_id, per_head=per_head)
    else:
        result = attribution_differences(model, clean_ids, corrupt_ids, answer_id, wrong_id, per_head=per_head)
    clean_diff, corrupt_diff = result["clean"], result["corrupted"]
    if abs(clean_diff - corrupt_diff) < 1e-6:
        raise TfcliError(
            f"the clean and corrupted texts give the same logit difference ({clean_diff:.4f}): there is nothing to restore",
            hint="pick texts that the model answers differently, or another --answer / --wrong",
        )
    span = clean_diff - corrupt_diff
    restored = (result["patched"] - corrupt_diff) / span
    head_restored = None if result["heads"] is None else (result["heads"] - corrupt_diff) / span
    verified, head_verified = _verify(model, clean_ids, corrupt_ids, answer_id, wrong_id, restored, head_restored, verify or 0)
    tokenizer = checkpoint.tokenizer
    return Patching(
        run=str(checkpoint.path),
        clean=clean,
        corrupt=corrupt,
        clean_tokens=clean_views,
        corrupt_tokens=corrupt_views,
        answer=(answer_id, token_text(tokenizer, answer_id)),
        wrong=(wrong_id, token_text(tokenizer, wrong_id)),
        clean_diff=clean_diff,
        corrupt_diff=corrupt_diff,
        restored=restored,
        head_restored=head_restored,
        method=method,
        verified=verified,
        head_verified=head_verified,
        seconds=time.perf_counter() - began,
    )


def _verify(model, clean_ids, corrupt_ids, answer, wrong, restored, head_restored, n: int):
    """Patch exactly the `n` estimates of each map furthest from 0 (changed nothing), put the exact fractions
    in place, and return each map's (row, column, estimate, exact) for them."""
    cells = top_cells(restored, 0.0, n)
    head_cells = top_cells(head_restored, 0.0, n) if head_restored is not None else []
    if not cells and not head_cells:
        return [], []
    exact = patch_differences(model, clean_ids, corrupt_ids, answer, wrong, per_head=bool(head_cells), cells=cells, head_cells=head_cells)
    span = exact["clean"] - exact["corrupted"]
    found = []
    for estimates, pairs, values in ((restored, cells, exact["patched"]), (head_restored, head_cells, exact["heads"])):
        found.append([(r, c, float(estimates[r, c]), float((values[r, c] - exact["corrupted"]) / span)) for r, c in pairs])
        for r, c, _, value in found[-1]:
            estimates[r, c] = value
    return found[0], found[1]


def _corrupted_favourite(model, ids: list[int], answer: int) -> int:
    """The token the corrupted text's last position likes best, other than the answer."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.lm_head.weight.device)).logits[0, -1].float()
        logits[answer] = float("-inf")
        return int(logits.argmax())
