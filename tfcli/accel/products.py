"""Matrix products for the linear layers and the fused loss, each through the library this machine runs
fastest for its shape.

On the CPU PyTorch multiplies fp32 matrices with its default BLAS (MKL on x86). It also ships oneDNN, which
was about twice as fast on an AMD EPYC with AVX-512 (where MKL runs its AVX2 code) and 5-40% slower on an
AVX2-only EPYC; and one row times a large weight (a decoding step at batch 1) is bound by streaming the
weight from memory, where tfcli's C loop (`native.py`) can beat both. Nothing here is chosen by a table of
one machine's numbers: for each class of shapes (rows rounded up to a power of two, the weight's exact
shape) and each direction (forward, input gradient, weight gradient) `choices.py` times the candidates on
this machine and keeps the fastest. oneDNN and the C loop are also checked against PyTorch once a process
before their first use. Other dtypes, autocast, GPUs, torch.compile and torch.jit keep PyTorch's product.
"""

from __future__ import annotations

import dataclasses
import threading

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.accel import choices, native

TORCH, ONEDNN, ONEDNN_TRANSPOSED, NATIVE = "torch", "onednn", "onednn-transposed", "native"
DIRECTIONS = ("forward", "grad_input", "grad_weight")
MIN_TIMED_MACS = 1 << 18  # smaller products keep PyTorch's: timing them costs more than a choice could save


def _onednn_op():
    """PyTorch's oneDNN linear (`Y = X @ W.T + B`, any strides), or None where this build has none."""
    try:
        if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
            return torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        pass
    return None


def product(backend: str, a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ w.T + bias for a (..., k) and w (n, k), any strides, through `backend`."""
    if backend == ONEDNN:
        return _onednn_op()(a, w, bias, "none", [], "")
    if backend == ONEDNN_TRANSPOSED:  # (w @ a.T).T: oneDNN is faster for some shapes with the wide side as rows
        assert bias is None and a.dim() == 2
        return _onednn_op()(w, a, None, "none", [], "").t()
    if backend == NATIVE:
        return native.vector_linear()(a, w, bias)
    return F.linear(a, w, bias)


_checked: dict[str, bool] = {}
_check_lock = threading.Lock()


def available(backend: str) -> bool:
    """Present in this process and, once a process, checked against PyTorch on a few odd shapes."""
    if backend == TORCH:
        return True
    family = ONEDNN if backend == ONEDNN_TRANSPOSED else backend
    with _check_lock:
        if family not in _checked:
            _checked[family] = _agrees_with_torch(family)
        return _checked[family]


def _agrees_with_torch(backend: str) -> bool:
    if backend == ONEDNN and _onednn_op() is None:
        return False
    if backend == NATIVE and native.vector_linear() is None:
        return False  # native.py checks its own product when it builds it
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        for m, n, k, with_bias in [(1, 203, 77, True), (5, 64, 130, False), (33, 17, 9, True)]:
            if backend == NATIVE and m != 1:
                continue
            a = torch.randn(m, k, generator=generator)
            w = torch.randn(n, k, generator=generator)
            bias = torch.randn(n, generator=generator) if with_bias else None
            try:
                got = product(backend, a, w, bias)
            except RuntimeError:
                return False
            if not close(F.linear(a, w, bias), got):
                return False
    return True


def close(expected: torch.Tensor, got: torch.Tensor) -> bool:
    """The same product up to fp32 rounding in another order of summation."""
    if expected.shape != got.shape or not torch.isfinite(got).all():
        return False
    return bool((expected - got).abs().max() <= 1e-4 * expected.abs().max() + 1e-5)


def plain_cpu_fp32(*tensors: torch.Tensor | None) -> bool:
    """fp32 CPU tensors, no autocast, not compiling or tracing: where a library other than PyTorch's may run."""
    for tensor in tensors:
        if tensor is not None and (tensor.device.type != "cpu" or tensor.dtype != torch.float32):
            return False
    return not (torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling() or torch.jit.is_tracing())


def rows_class(m: int) -> int:
    """Rows rounded up to a power of two: one decision serves every batch of about that size."""
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


def _inputs(direction: str, m: int, n: int, k: int, with_bias: bool):
    """Random operands laid out as `direction` gets them: forward x (m, k) and W (n, k); grad_input the
    output gradient (m, n) and W.T; grad_weight the output gradient's transpose and x's."""
    generator = torch.Generator().manual_seed(0)
    if direction == "forward":
        a, w = torch.randn(m, k, generator=generator), torch.randn(n, k, generator=generator)
    elif direction == "grad_input":  # (m, n) @ W (n, k), written a @ (W.T).T
        a, w = torch.randn(m, n, generator=generator), torch.randn(n, k, generator=generator).t()
    else:  # (n, m) @ x (m, k): the output gradient transposed times the input
        a, w = torch.randn(m, n, generator=generator).t(), torch.randn(m, k, generator=generator).t()
    bias = torch.randn(w.shape[0], generator=generator) if with_bias else None
    return a, w, bias


_decided: dict[tuple, str] = {}  # this process's answers of `choose`, so that a call costs one look-up


def choose(direction: str, m: int, n: int, k: int, with_bias: bool = False) -> str:
    """The backend for a product of this direction and shape class: m rows of output, n columns, k inner
    (in the forward direction's terms: x (m, k), W (n, k))."""
    memo = (direction, rows_class(m), n, k, with_bias, torch.get_num_threads())
    backend = _decided.get(memo)
    if backend is None:
        backend = _decided[memo] = _choose(direction, m, n, k, with_bias)
    return backend


def _choose(direction: str, m: int, n: int, k: int, with_bias: bool) -> str:
    rows = rows_class(m)
    if rows * n * k < MIN_TIMED_MACS:
        return TORCH
    names = [TORCH, ONEDNN] + ([ONEDNN_TRANSPOSED] if direction == "grad_weight" else [])
    names += [NATIVE] if direction == "forward" and rows == 1 else []
    names = [name for name in names if available(name)]
    if len(names) == 1:
        return TORCH
    key = f"linear {direction} t{torch.get_num_threads()} {rows}x{n}x{k}" + (" bias" if with_bias else "")
    known = choices.choices().get(key, tuple(names))
    if known is not None:
        return known.choice
    a, w, bias = _inputs(direction, rows, n, k, with_bias)

    def run(name: str):
        return lambda: product(name, a, w, bias)

    with torch.no_grad():
        return choices.choices().decide(key, {name: run(name) for name in names}, close)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The backend of each direction of one linear layer's products."""

    forward: str
    grad_input: str
    grad_weight: str


def _linear_shape_ok(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Shapes as F.linear accepts them (anything else goes to F.linear, for its own error message)."""
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1] or x.numel() == 0:
        return False
    return bias is None or tuple(bias.shape) == (weight.shape[0],)


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, each direction through the backend `choose` measured fastest for its shape."""
    if not (plain_cpu_fp32(x, weight, bias) and _linear_shape_ok(x, weight, bias)):
        return F.linear(x, weight, bias)
    n, k = weight.shape
    m = x.numel() // k
    with_bias = bias is not None
    if not _needs_grad(x, weight, bias):
        backend = choose("forward", m, n, k, with_bias)
        if backend == NATIVE and not (m == 1 and weight.is_contiguous() and (bias is None or bias.is_contiguous())):
            backend = TORCH
        return product(backend, x, weight, bias)
    plan = Plan(*(choose(direction, m, n, k, with_bias and direction == "forward") for direction in DIRECTIONS))
    if plan == Plan(TORCH, TORCH, TORCH):
        return F.linear(x, weight, bias)
    return _ChosenLinear.apply(x, weight, bias, plan)


class _ChosenLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, plan: Plan):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.plan = bias is not None, plan
        return product(plan.forward if plan.forward != NATIVE else TORCH, x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        rows = grad.reshape(-1, grad.shape[-1])  # (m, n)
        grad_x = product(ctx.plan.grad_input, rows, weight.t()).view(x.shape) if need_x else None
        grad_weight = product(ctx.plan.grad_weight, rows.t(), x.reshape(-1, x.shape[-1]).t()) if need_weight else None
        grad_bias = rows.sum(dim=0) if need_bias and ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None


def forward_product(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """h @ w.T + bias for h (m, k), w (n, k): logits from hidden states (no gradient is taken through it)."""
    if not (plain_cpu_fp32(h, w, bias) and _linear_shape_ok(h, w, bias)):
        return F.linear(h, w, bias)
    backend = choose("forward", h.shape[0], w.shape[0], w.shape[1], bias is not None)
    return product(TORCH if backend == NATIVE else backend, h, w, bias)


def input_gradient(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """g @ w for the output gradient g (m, n) and the weight w (n, k)."""
    if not plain_cpu_fp32(g, w):
        return g @ w
    return product(choose("grad_input", g.shape[0], w.shape[0], w.shape[1]), g, w.t())


def weight_gradient(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """g.T @ h for the output gradient g (m, n) and the input h (m, k): the weight's gradient (n, k)."""
    if not plain_cpu_fp32(g, h):
        return g.t() @ h
    return product(choose("grad_weight", g.shape[0], g.shape[1], h.shape[1]), g.t(), h.t())


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state dict) whose products go through `linear`. `accelerate`
    turns a model's nn.Linear modules into these in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
