"""Build a module's structure on PyTorch's meta device: names, shapes and dtypes, no memory, no random fill.

Loading a run builds its model this way, then puts the saved tensors in place. On the meta device PyTorch
runs `nn.init.normal_` through a Python reference whose first use imports torch._dynamo, about 1.5 s of
a command's start; a tensor without data has nothing to fill, so the fills are skipped."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode


@contextlib.contextmanager
def on_meta_device() -> Iterator[None]:
    """Inside the block, modules are built on the meta device and `torch.nn.init`'s fills do nothing."""

    class SkipFills(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__module__", None) == "torch.nn.init":
                return args[0] if args else kwargs["tensor"]
            return func(*args, **(kwargs or {}))

    with torch.device("meta"), SkipFills():
        yield
