"""Scoped hooks on the one model: read the residual stream, fan one text out into a batch of edited copies
at a block, read or edit each head's output (the input of its attention's output projection
`attn.out`, `(B, T, n_heads * head_dim)`), and run the last block at the last position only. Every hook
lives inside a `with Hooks()` block and is removed when it ends, also on an error. Nothing here computes
a layer: the model's own forward pass does, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tfcli.errors import TfcliError, a_or_an


class Hooks:
    """Forward hooks registered through it are removed when the `with` block ends.

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

    def before(self, module: nn.Module, fn: Callable) -> None:
        """fn(module, args) -> None or new args, before module.forward."""
        self.handles.append(module.register_forward_pre_hook(fn))

    def after(self, module: nn.Module, fn: Callable) -> None:
        """fn(module, args, output) -> None or a new output, after module.forward."""
        self.handles.append(module.register_forward_hook(fn))

    # ---- reading ------------------------------------------------------------------------------------

    def residual_stream(self, stack: nn.Module) -> list[torch.Tensor]:
        """A list the next forward pass fills with the residual stream of `stack`: [0] the input of the first
        block (the embeddings), [l + 1] the output of block l; each (B, T, d). The stack's final norm is
        not applied (`stack.norm` does that)."""
        stream: list[torch.Tensor] = []
        blocks = stack.blocks
        self.before(blocks[0], lambda module, args: stream.append(args[0]))
        for block in blocks:
            self.after(block, lambda module, args, output: stream.append(output[0]))
        return stream

    def head_outputs(self, stack: nn.Module) -> list[torch.Tensor]:
        """A list the next forward pass fills with each layer's head outputs, (B, T, nh, hs) per layer:
        what each head adds to its attention's output projection's input."""
        outputs: list[torch.Tensor] = []
        for block in stack.blocks:
            heads = block.attn.n_heads
            self.before(block.attn.out, lambda module, args, heads=heads: outputs.append(_split(args[0], heads)))
        return outputs

    # ---- editing ------------------------------------------------------------------------------------

    def fan_out(self, stack: nn.Module, layer: int, rows: int, edit: Callable[[torch.Tensor], None] | None = None) -> None:
        """Run the blocks before `layer` once, then copy the residual stream into `rows` rows at the input of
        block `layer` and let `edit(x)` change x (rows, T, d) in place: many edits of one text as rows of one
        batch, without redoing the layers they share. The input ids must be one row."""

        def expand(module, args):
            x = args[0]
            assert x.shape[0] == 1, "fan_out needs a batch of one text"
            x = x.expand(rows, *x.shape[1:]).clone()  # (rows, T, d)
            if edit is not None:
                edit(x)
            return (x, *args[1:])

        self.before(stack.blocks[layer], expand)

    def edit_heads(self, stack: nn.Module, layer: int, edit: Callable[[torch.Tensor], None]) -> None:
        """Let `edit(z)` change layer `layer`'s head outputs z (B, T, nh, hs) in place before its output
        projection: zero a head, put in its mean, or patch in another run's."""
        attn = stack.blocks[layer].attn

        def change(module, args):
            z = _split(args[0], attn.n_heads).clone()  # (B, T, nh, hs)
            edit(z)
            return (z.flatten(2), *args[1:])  # (B, T, nh * hs)

        self.before(attn.out, change)

    def last_position_only(self, stack: nn.Module) -> None:
        """Run the last block's output projection and MLP at the last position only, for a caller that reads
        nothing else: its attention still reads every position's keys and values, but every other position
        of its output is then wrong (it gets the last position's updates) and must not be read. Register it
        after any edit of that block's heads (pre-hooks run in the order they were added)."""
        block = stack.blocks[-1]

        def last(module, args):
            return (args[0][:, -1:], *args[1:])  # (B, 1, width): broadcast back over the positions by the residual add

        self.before(block.attn.out, last)
        self.before(block.mlp, last)


def _split(y: torch.Tensor, heads: int) -> torch.Tensor:
    B, T, width = y.shape
    return y.view(B, T, heads, width // heads)  # (B, T, nh, hs)


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
    return vocabulary(model, stack.norm(residual))


def vocabulary(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The model's logits from its last stack's output `hidden` (..., d) (`ModelOutput.hidden`, already
    normed). Returns (..., vocab)."""
    return model.lm_head(model._head_input(hidden))
