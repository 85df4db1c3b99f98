"""Scoped hooks on the model's hook points (`tfcli.model.hook_point.HookPoint`): read any activation by its
name, the residual stream, each head's output `(B, T, n_heads, head_dim)` and the attention patterns; fan
one text out into a batch of edited copies at a block, edit heads, and run the last block at the last
position only. Every hook lives inside a `with Hooks()` block and is removed when it ends, also on an error.
Nothing here computes a layer: the model's own forward pass does, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tfcli.errors import TfcliError, a_or_an
from tfcli.model.hook_point import HookPoint, hook_points


class Hooks:
    """Hooks registered through it are removed when the `with` block ends.

    Example: with Hooks() as hooks: resid = hooks.residual_stream(stack); model(ids)  # resid: L+1 tensors
    """

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in reversed(self.handles):
            handle.remove()
        self.handles.clear()

    def read(self, point: HookPoint, into: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """A list (`into`, or a new one) that each pass through `point` appends its activation to."""
        seen: list[torch.Tensor] = [] if into is None else into
        self.handles.append(point.register_forward_hook(lambda module, args, output: seen.append(output)))
        return seen

    def edit(self, point: HookPoint, fn: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        """fn(activation) -> its replacement, or None to keep it (changed in place or only read). Edits on one
        point run in the order they were added, each seeing the one before's result."""
        self.handles.append(point.register_forward_hook(lambda module, args, output: fn(output)))

    # ---- reading ------------------------------------------------------------------------------------

    def residual_stream(self, stack: nn.Module) -> list[torch.Tensor]:
        """A list the next forward pass fills with the residual stream of `stack`: [0] the input of the first
        block (the embeddings), [l + 1] the output of block l; each (B, T, d). The stack's final norm is
        not applied (`stack.norm` does that)."""
        stream: list[torch.Tensor] = []
        self.read(stack.blocks[0].hook_resid_pre, stream)
        for block in stack.blocks:
            self.read(block.hook_resid_post, stream)
        return stream

    def head_outputs(self, stack: nn.Module) -> list[torch.Tensor]:
        """A list the next forward pass fills with each layer's head outputs, (B, T, nh, hs) per layer:
        what each head adds to its attention's output projection's input."""
        outputs: list[torch.Tensor] = []
        for block in stack.blocks:
            self.read(block.attn.hook_z, outputs)
        return outputs

    def attention_patterns(self, model: nn.Module) -> dict[str, list[torch.Tensor]]:
        """A dict the next forward pass fills with every attention's weights, (B, nh, T, S) per layer, under
        "encoder", "decoder" and "cross" (an encoder-decoder's decoder reading the source). Hooking the
        patterns puts every attention on its explicit path, as reading any one of them would."""
        patterns: dict[str, list[torch.Tensor]] = {}
        for kind in ("encoder", "decoder"):
            stack = getattr(model, kind, None)
            for block in stack.blocks if stack is not None else ():
                self.read(block.attn.hook_pattern, patterns.setdefault(kind, []))
                if hasattr(block, "cross_attn"):
                    self.read(block.cross_attn.hook_pattern, patterns.setdefault("cross", []))
        return patterns

    # ---- editing ------------------------------------------------------------------------------------

    def fan_out(self, stack: nn.Module, layer: int, rows: int, edit: Callable[[torch.Tensor], None] | None = None) -> None:
        """Run the blocks before `layer` once, then copy the residual stream into `rows` rows at the input of
        block `layer` and let `edit(x)` change x (rows, T, d) in place: many edits of one text as rows of one
        batch, without redoing the layers they share. The input ids must be one row."""

        def expand(x):
            assert x.shape[0] == 1, "fan_out needs a batch of one text"
            x = x.expand(rows, *x.shape[1:]).clone()  # (rows, T, d)
            if edit is not None:
                edit(x)
            return x

        self.edit(stack.blocks[layer].hook_resid_pre, expand)

    def edit_heads(self, stack: nn.Module, layer: int, edit: Callable[[torch.Tensor], None]) -> None:
        """Let `edit(z)` change layer `layer`'s head outputs z (B, T, nh, hs) in place before its output
        projection: zero a head, put in its mean, or patch in another run's."""

        def change(z):
            z = z.clone()  # (B, T, nh, hs)
            edit(z)
            return z

        self.edit(stack.blocks[layer].attn.hook_z, change)

    def last_position_only(self, stack: nn.Module) -> None:
        """Run the last block's output projection and MLP at the last position only, for a caller that reads
        nothing else: its attention still reads every position's keys and values, but every other position
        of its output is then wrong (it gets the last position's updates) and must not be read. Register it
        after any edit of that block's heads (edits run in the order they were added)."""
        block = stack.blocks[-1]

        def last(x):
            return x[:, -1:]  # (B, 1, ...): broadcast back over the positions by the residual add

        self.edit(block.attn.hook_z, last)
        self.edit(block.hook_mlp_in, last)


def hook_point(model: nn.Module, name: str) -> HookPoint:
    """The hook point called `name` (as `hook_points` names them). Example: "decoder.blocks.0.hook_resid_post" """
    points = hook_points(model)
    if name not in points:
        raise KeyError(f"{name!r} is not a hook point of this model; some are {', '.join(list(points)[:4])}, ...")
    return points[name]


def run_with_cache(model: nn.Module, *args: Any, names: Callable[[str], bool] = lambda name: True, **kwargs: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """One forward pass `model(*args, **kwargs)` that keeps the activation at every hook point whose name
    `names` accepts (the last one, where a point runs twice). Returns (the model's output, name -> tensor).
    Reading an attention's `hook_pattern` puts it on its explicit path."""
    cache: dict[str, torch.Tensor] = {}
    with Hooks() as hooks:
        for name, point in hook_points(model).items():
            if names(name):
                hooks.edit(point, lambda x, name=name: cache.__setitem__(name, x))
        output = model(*args, **kwargs)
    return output, cache


def lens_stack(model: nn.Module, command: str, supported: tuple[str, ...] = ("decoder", "encoder")) -> nn.Module:
    """The stack whose residual stream a command reads: the decoder's, or an encoder's. An architecture the
    command does not support is one line."""
    arch = model.config.arch
    if arch not in supported:
        raise TfcliError(
            f"{command} works on {' and '.join(s + ' runs' for s in supported)}; this run is {a_or_an(arch)}", hint=f"see `tfcli {command} --help`"
        )
    return model.encoder if arch == "encoder" else model.decoder  # an encoder-decoder: its decoder's stream


def unembed(model: nn.Module, stack: nn.Module, residual: torch.Tensor) -> torch.Tensor:
    """The logits the model would give if `residual` (..., d) were its last block's output: the stack's
    final norm, (an encoder's masked-LM transform,) then the vocabulary head. Returns (..., vocab)."""
    return model.unembed(stack.norm(residual))
