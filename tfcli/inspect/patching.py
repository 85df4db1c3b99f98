"""Activation patching (`tfcli inspect-patch`): run the corrupted text, put the clean run's residual stream
back at one (layer, position) at a time (or, per head, one head's output at every position), and measure how
much of the logit difference answer - wrong at the last position comes back:

    restored = (patched - corrupted) / (clean - corrupted)

1 where the patch brings the clean answer back entirely, 0 where it changes nothing. Patches run as rows of
one batch fanned out at their layer (`Hooks.fan_out`); a position whose clean and corrupted residuals are
equal needs no run (it restores exactly 0). Edits are scoped hooks on the one model.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from tfcli.errors import TfcliError

if TYPE_CHECKING:
    import torch

    from tfcli.checkpoint import Checkpoint

PATCH_FORMAT = "tfcli-patching"
PATCH_VERSION = 1
ROWS_PER_BATCH = 16  # patches run together; a batch runs from its first patched position on


def _last_logits(model, stack, hidden: torch.Tensor) -> torch.Tensor:
    """The logits at the last position from the last stack's output (B, T, d): (B, vocab)."""
    from tfcli.inspect.hooks import vocabulary

    return vocabulary(model, hidden[:, -1]).float()


def _record(model, stack, ids: list[int], cache=None) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """One plain run: the residual stream (L + 1 of (T, d)), head outputs (L of (T, nh, hs)), last logits;
    with `cache` (a KVCache), every layer's keys and values too."""
    import torch

    from tfcli.inspect.hooks import Hooks

    with Hooks() as hooks:
        stream = hooks.residual_stream(stack)
        heads = hooks.head_outputs(stack)
        hidden = model(torch.tensor([ids], device=model.lm_head.weight.device), logits=False, cache=cache).hidden
    return [x[0] for x in stream], [z[0] for z in heads], _last_logits(model, stack, hidden)[0]


def _resume_cache(model, keys: torch.Tensor, values: torch.Tensor, rows: int, start: int, first_layer: int):
    """A KV cache that lets the model run only positions start.. of the corrupted text: the blocks from
    `first_layer` on read the corrupted run's keys and values before `start` (one copy per row); the blocks
    before it, whose output the fan-out replaces, get a scratch cache of one row."""
    import torch

    from tfcli.model.attention import KVCache, LayerKVCache

    class Resume(KVCache):
        def __init__(self) -> None:  # the parent's fields; only what the rows read is copied from the corrupted run
            shape = (keys.shape[0], rows, *keys.shape[2:])  # (L, rows, nkv, T, hs)
            self.keys = torch.empty(shape, dtype=keys.dtype, device=keys.device)
            self.values = torch.empty(shape, dtype=values.dtype, device=values.device)
            self.keys[first_layer:, :, :, :start] = keys[first_layer:, :, :, :start]  # each row: positions before `start`
            self.values[first_layer:, :, :, :start] = values[first_layer:, :, :, :start]
            self.cross = [None] * keys.shape[0]
            self.capacity, self.length = keys.shape[3], start
            self.scratch = KVCache(model.config, 1, keys.shape[3], keys.dtype, keys.device)
            self.scratch.length = start

        def layer(self, index: int) -> LayerKVCache:
            return LayerKVCache(self.scratch if index < first_layer else self, index)

    return Resume()


def patch_differences(
    model, clean_ids: list[int], corrupt_ids: list[int], answer: int, wrong: int, *, per_head: bool = False, batch: int = ROWS_PER_BATCH
) -> dict[str, Any]:
    """The logit differences answer - wrong at the last position: `clean`, `corrupted`, and `patched`
    [layer][position] with the clean residual stream put in at the input of block `layer` (its layers'
    residual stream before each block); with per_head, `heads` [layer][head] with the clean output of that
    head put in at every position."""
    import torch

    from tfcli.inspect.hooks import Hooks, lens_stack

    stack = lens_stack(model, "inspect-patch", ("decoder",))
    device = model.lm_head.weight.device
    corrupt = torch.tensor([corrupt_ids], device=device)
    with torch.inference_mode():
        from tfcli.model.attention import KVCache

        clean_stream, clean_heads, clean_logits = _record(model, stack, clean_ids)
        recorded = KVCache(model.config, 1, len(corrupt_ids), model.lm_head.weight.dtype, device)
        corrupt_stream, corrupt_heads, corrupt_logits = _record(model, stack, corrupt_ids, recorded)
        clean_diff = float(clean_logits[answer] - clean_logits[wrong])
        corrupt_diff = float(corrupt_logits[answer] - corrupt_logits[wrong])
        L, T = len(stack.blocks), len(corrupt_ids)
        patched = np.full((L, T), corrupt_diff, dtype=np.float64)
        for layer in range(L):
            differ = [p for p in range(T) if not torch.equal(clean_stream[layer][p], corrupt_stream[layer][p])]
            for first in range(0, len(differ), batch):
                chunk = differ[first : first + batch]
                start = chunk[0]  # positions before it are the corrupted run's in every row: only start.. run

                def put_clean(x, chunk=chunk, layer=layer, start=start):  # x (rows, T - start, d)
                    x[:] = corrupt_stream[layer][start:].to(x.dtype)  # the corrupted residual stream ...
                    x[list(range(len(chunk))), [p - start for p in chunk]] = clean_stream[layer][chunk].to(x.dtype)  # ... row i clean at chunk[i]

                cache = _resume_cache(model, recorded.keys, recorded.values, len(chunk), start, layer)
                with Hooks() as hooks:
                    hooks.fan_out(stack, layer, len(chunk), put_clean)
                    logits = _last_logits(model, stack, model(corrupt[:, start:], logits=False, cache=cache).hidden)  # (rows, vocab)
                patched[layer, chunk] = (logits[:, answer] - logits[:, wrong]).double().cpu().numpy()
        heads = None
        if per_head:
            nh = stack.blocks[0].attn.n_heads
            heads = np.full((L, nh), corrupt_diff, dtype=np.float64)
            for layer in range(L):
                differ = [h for h in range(nh) if not torch.equal(clean_heads[layer][:, h], corrupt_heads[layer][:, h])]
                if not differ:
                    continue

                def put_heads(z, differ=differ, layer=layer):  # z (rows, T, nh, hs): row i gets head differ[i]'s clean output
                    z[list(range(len(differ))), :, differ] = clean_heads[layer][:, differ].transpose(0, 1).to(z.dtype)

                with Hooks() as hooks:
                    hooks.fan_out(stack, layer, len(differ))
                    hooks.edit_heads(stack, layer, put_heads)
                    logits = _last_logits(model, stack, model(corrupt, logits=False).hidden)
                heads[layer, differ] = (logits[:, answer] - logits[:, wrong]).double().cpu().numpy()
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
        }


def single_token(checkpoint: Checkpoint, word: str, flag: str) -> int:
    """The id of a one-token word; a word of several tokens (or none) is an error that shows them."""
    from tfcli.inspect.lens import token_text

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


def patch(checkpoint: Checkpoint, clean: str, corrupt: str, answer: str, wrong: str | None = None, *, per_head: bool = False) -> Patching:
    import time

    from tfcli.inspect.hooks import lens_stack
    from tfcli.inspect.lens import decoder_views, token_text

    began = time.perf_counter()
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
    result = patch_differences(model, clean_ids, corrupt_ids, answer_id, wrong_id, per_head=per_head)
    clean_diff, corrupt_diff = result["clean"], result["corrupted"]
    if abs(clean_diff - corrupt_diff) < 1e-6:
        raise TfcliError(
            f"the clean and corrupted texts give the same logit difference ({clean_diff:.4f}): there is nothing to restore",
            hint="pick texts that the model answers differently, or another --answer / --wrong",
        )
    span = clean_diff - corrupt_diff
    restored = (result["patched"] - corrupt_diff) / span
    head_restored = None if result["heads"] is None else (result["heads"] - corrupt_diff) / span
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
        seconds=time.perf_counter() - began,
    )


def _corrupted_favourite(model, ids: list[int], answer: int) -> int:
    """The token the corrupted text's last position likes best, other than the answer."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.lm_head.weight.device)).logits[0, -1].float()
        logits[answer] = float("-inf")
        return int(logits.argmax())
