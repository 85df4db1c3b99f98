"""Matrix multiplies through oneDNN on the CPU, where PyTorch's default BLAS is slower.

PyTorch multiplies fp32 matrices on the CPU with MKL, and MKL runs its AVX2 code on AMD processors. On
an AMD EPYC with AVX-512 (2 cores) we measured about 205 GFLOP/s through MKL and about 450 through
oneDNN, the library PyTorch also ships (its compiled CPU graphs use it); at batch 1, when decoding, a
matrix-vector product through oneDNN streams the weights two to three times as fast as through MKL.
So the linear layers and the fused loss multiply through the functions here. They take oneDNN for fp32
CPU tensors whose product is large enough to repay its fixed cost of about 15 us a call, and PyTorch's
own kernels everywhere else: other dtypes, autocast, GPUs, and while torch.compile or torch.jit traces.
One input row times a large weight (a decoding step at batch 1) goes to tfcli's own C loop
(`native.py`), which streams the weight from memory faster than either library.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model import native

# From these sizes on, oneDNN was about as fast or faster on every shape we timed (on the EPYC above):
# multiply-adds a call, or the weight's elements (at batch 1 reading the weight is the whole cost).
ONEDNN_MIN_MACS = 1 << 22
ONEDNN_MIN_WEIGHT = 1 << 19
# The C kernel is for weights streamed from memory; one that fits in the L2 caches (2 MB on the EPYC
# above) is multiplied as fast or faster by PyTorch's own kernels.
NATIVE_MIN_WEIGHT = 1 << 19

_op = None
_looked_up = False


def _onednn_linear():
    """PyTorch's oneDNN linear (`Y = X @ W.T + B`, any strides), or None where this build has none."""
    global _op, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            if torch.backends.mkldnn.is_available():
                _op = torch.ops.mkldnn._linear_pointwise.default
        except (AttributeError, RuntimeError):
            _op = None
    return _op


def use_onednn(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether `a @ w.T + bias` (a (..., k), w (n, k), bias (n,)) goes through oneDNN."""
    if a.device.type != "cpu" or a.dtype != torch.float32 or w.dtype != torch.float32:
        return False
    if w.device != a.device or (bias is not None and (bias.shape != (w.shape[0],) or bias.device != a.device)):
        return False  # a broadcast bias, or mixed devices: PyTorch's own product (and its errors)
    if a.numel() * w.shape[0] < ONEDNN_MIN_MACS and w.numel() < ONEDNN_MIN_WEIGHT:
        return False
    if torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    return bool(torch.backends.mkldnn.enabled) and _onednn_linear() is not None


def _onednn(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _onednn_linear()(a, w, bias, "none", [], "")


def matmul_nt(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ w.T + bias for a (..., k), w (n, k), bias (n,); oneDNN's result has no gradient, so autograd
    Functions call this and `linear` is what modules call."""
    return _onednn(a, w, bias) if use_onednn(a, w, bias) else F.linear(a, w, bias)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for matrices a (m, k), b (k, n)."""
    return matmul_nt(a, b.t())


def matmul_tn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a.T @ b for a (k, m), b (k, n): a weight gradient. oneDNN is fastest when the wider side of the
    result is its rows' length, so the narrow-wide product is formed as the transpose of its mirror."""
    if a.shape[1] > b.shape[1]:
        return matmul_nt(b.t(), a.t()).t()
    return matmul_nt(a.t(), b.t())


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)  # `linear` applies this only where use_onednn holds

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad
        rows = grad.reshape(-1, grad.shape[-1])  # (N, n)
        grad_x = matmul(rows, weight).view(x.shape) if need_x else None
        grad_weight = matmul_tn(rows, x.reshape(-1, x.shape[-1])) if need_weight else None
        grad_bias = rows.sum(dim=0) if need_bias and ctx.has_bias else None
        return grad_x, grad_weight, grad_bias


def use_native(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `x @ w.T + bias` goes through the C matrix-vector kernel: one fp32 row on the CPU, every
    shape as F.linear needs it, no gradient, not while tracing. Anything else keeps PyTorch's checks."""
    if x.numel() != x.shape[-1] or w.dim() != 2 or w.numel() < NATIVE_MIN_WEIGHT or x.shape[-1] != w.shape[1]:
        return False
    if x.device.type != "cpu" or w.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != torch.float32:
        return False
    if not w.is_contiguous():
        return False
    if bias is not None and (bias.shape != (w.shape[0],) or bias.device.type != "cpu" or bias.dtype != torch.float32
                             or not bias.is_contiguous()):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)):
        return False
    if torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    return native.vector_linear() is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the C kernel or oneDNN where `use_native` or `use_onednn` says so; differentiable
    wherever a gradient is asked for."""
    if use_native(x, weight, bias):
        return native.vector_linear()(x, weight, bias)
    if not use_onednn(x, weight, bias):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return _Linear.apply(x, weight, bias)
    return _onednn(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state dict) that multiplies through `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
