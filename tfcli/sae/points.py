"""The hook points an SAE reads and edits, by TransformerLens's names (`blocks.0.hook_resid_post` for tfcli's
`decoder.blocks.0.hook_resid_post`): which exist and how wide a vector each gives, a name checked with a
"did you mean", and scoped hooks that read a point's activations or replace them (splice, steer). Hooks are
registered on the model's own HookPoints and always removed when their `with` block ends; while one is on,
the C decoding step stands aside (it runs only while no hook point has a hook)."""

from __future__ import annotations

import contextlib
import difflib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from tfcli.errors import TfcliError
from tfcli.model.hook_point import HookPoint, hook_points

# (B, nh, T, S): one number per pair of positions, not a vector per position, so no SAE reads them
NOT_PER_POSITION = ("hook_attn_scores", "hook_pattern")


def lens_name(name: str) -> str:
    """tfcli's name as TransformerLens writes it. Example: "decoder.blocks.0.hook_z" -> "blocks.0.hook_z" """
    return name.removeprefix("decoder.")


def hook_widths(model: nn.Module) -> dict[str, int]:
    """Every hook point an SAE can read, by TransformerLens's name, and the width of its vector per position
    (heads flattened: (B, T, nh, hs) gives nh * hs). Found by running the model on one token."""
    points = {name: point for name, point in hook_points(model).items() if not name.endswith(NOT_PER_POSITION) and "cross_attn" not in name}
    widths: dict[str, int] = {}
    handles = [
        point.register_forward_hook(lambda module, args, output, name=name: widths.__setitem__(lens_name(name), math.prod(output.shape[2:])))
        for name, point in points.items()
    ]
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            model(torch.zeros(1, 1, dtype=torch.long, device=device))
    finally:
        for handle in handles:
            handle.remove()
    return widths


def resolve_hook(model: nn.Module, hook: str, widths: dict[str, int] | None = None) -> str:
    """The hook point `hook` names (TransformerLens's name, or tfcli's with `decoder.`), as TransformerLens
    names it; an unknown name is one line with the closest names and the valid ones."""
    widths = hook_widths(model) if widths is None else widths
    name = lens_name(hook)
    if name in widths:
        return name
    close = difflib.get_close_matches(name, list(widths), n=1)
    shown = sorted(widths, key=_order)
    listed = ", ".join(shown[:40]) + (f" (and {len(shown) - 40} more)" if len(shown) > 40 else "")
    hint = (f"did you mean {close[0]}? " if close else "") + f"the hook points are {listed}"
    raise TfcliError(f"{hook!r} is not a hook point an SAE can read in this run", hint=hint)


def _order(name: str) -> tuple:
    parts = name.split(".")
    return (int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else -1, name)


def point_of(model: nn.Module, name: str) -> HookPoint:
    """The HookPoint called `name` (TransformerLens's name)."""
    points = hook_points(model)
    return points[name] if name in points else points["decoder." + name]


def flat(x: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) -> (B, T, width): a head-shaped activation (B, T, nh, hs) with its heads side by side."""
    return x.reshape(*x.shape[:2], -1)


@contextlib.contextmanager
def editing(model: nn.Module, name: str, edit: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Inside the block, every pass through hook point `name` gives `edit(x)` instead of x, x flattened to
    (B, T, width) and the result put back in the point's shape. Example: with editing(model, hook, sae.forward): ..."""

    def hook(module, args, output):
        return edit(flat(output)).reshape(output.shape).to(output.dtype)

    handle = point_of(model, name).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class StopForward(Exception):
    """Raised by a reading hook once it has what it needs, so the layers after it do not run."""


def activations(model: nn.Module, name: str, ids: torch.Tensor) -> torch.Tensor:
    """The activations at hook point `name` for ids (B, T), as (B, T, width), running the model only as far as
    that point."""
    seen: list[torch.Tensor] = []

    def hook(module, args, output):
        seen.append(flat(output))
        raise StopForward

    handle = point_of(model, name).register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(ids)
    except StopForward:
        pass
    finally:
        handle.remove()
    return seen[0]
