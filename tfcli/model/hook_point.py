"""A named place in the forward pass where a hook may read or replace an activation (TransformerLens's
`HookPoint`): an identity module without parameters, so the model's state_dict keys never change."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks  # filled in place by torch

_lock = threading.Lock()
_registered = [0]  # hooks on any hook point of any model in this process, now


class HookPoint(nn.Module):
    """Returns its input, or what a forward hook registered on it returns instead. With no hook on it (and
    no global module hook) it is an attribute check, not a module call: free when unused. Hooks are also
    counted, process-wide, as they are registered and removed through the handles returned here.

    Example: model.decoder.blocks[0].hook_resid_post.register_forward_hook(lambda m, args, x: x * 0)
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._forward_hooks or self._forward_pre_hooks or _global_forward_hooks or _global_forward_pre_hooks:
            return super().__call__(x)
        return x

    @property
    def hooked(self) -> bool:
        """Whether anything would see or change the activation here (a hook on this point, or on every module)."""
        return bool(self._forward_hooks or self._forward_pre_hooks or _global_forward_hooks or _global_forward_pre_hooks)

    def register_forward_hook(self, *args: Any, **kwargs: Any) -> _CountedHandle:
        return _CountedHandle(super().register_forward_hook(*args, **kwargs))

    def register_forward_pre_hook(self, *args: Any, **kwargs: Any) -> _CountedHandle:
        return _CountedHandle(super().register_forward_pre_hook(*args, **kwargs))


class _CountedHandle:
    """A hook's removable handle that keeps `_registered` up to date (also as a context manager)."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.removed = handle, False
        with _lock:
            _registered[0] += 1

    def remove(self) -> None:
        self.handle.remove()
        with _lock:
            if not self.removed:
                self.removed = True
                _registered[0] -= 1

    def __enter__(self) -> _CountedHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def any_hooked() -> bool:
    """Whether any hook point of any model may have a hook now (one check, for a path that would skip them
    all, such as a C decoding step)."""
    return bool(_registered[0] or _global_forward_hooks or _global_forward_pre_hooks)


def add_hook_points(owner: nn.Module, *names: str) -> None:
    """A HookPoint on `owner` under each name, registered as a submodule and also kept in its instance dict,
    so the forward pass reads it without nn.Module.__getattr__ (which costs more than the point itself).
    Assigning another module to the name later replaces both (nn.Module.__setattr__ drops the dict entry)."""
    for name in names:
        point = HookPoint()
        owner.add_module(name, point)
        owner.__dict__[name] = point


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of `model` by its name. Example: "decoder.blocks.0.attn.hook_pattern" -> HookPoint"""
    return {name: module for name, module in model.named_modules() if isinstance(module, HookPoint)}
