"""The loss over the vocabulary where the output head is frozen in its block bytes (QLoRA's `QuantLinear`).

The vocabulary is walked a slab of the head's rows at a time with an online log-sum-exp, as flash attention walks
its keys: each slab is dequantized once per block of hidden rows, its logits scored and dropped, and the hidden
rows' gradient gathered in the same pass, rescaled as the running maximum moves. The head's float matrix is never
made whole, nor the block's logits over the whole vocabulary. The same value and gradient as the fused loss over
the dequantized matrix (`fused_loss`), within float rounding; the head takes no gradient.

With p = softmax(c) over the capped logits c = cap tanh(z / cap) (c = z without a cap), slope = dc/dz and the
smoothed target q = (1 - e) one_hot(target) + e / vocab, a row's loss is logsumexp(c) - sum q c and its gradient
sum_v slope_v (p_v - q_v) W_v: the p part gathered at the running maximum's scale, the q part as it comes.
"""

from __future__ import annotations

import math

import torch

from tfcli.accel.products import forward_product, input_gradient
from tfcli.quant.linear import QuantLinear

# A slab of the head, and a block's logits over it: 4 MB and 16 MB of fp32. Small pieces, as the head is walked
# once per block of rows: d=512, vocab 32k, 2,048 rows took the same time as 16 MB and 64 MB, and the step's
# peak RSS fell by ~80 MB (fewer freed pieces held by malloc).
SLAB_VALUES = 1 << 20
SLAB_LOGITS = 1 << 22


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    kind = hidden.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype


def _block(
    h: torch.Tensor, head: QuantLinear, targets: torch.Tensor, label_smoothing: float, softcap: float | None, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed loss of hidden rows h (n, d) against targets (n,), and d(loss)/dh (n, d) in fp32 where asked."""
    n, vocab, dtype = h.shape[0], head.out_features, h.dtype
    running_max = torch.full((n,), -math.inf, device=h.device)
    running_sum = torch.zeros(n, device=h.device)
    picked = torch.zeros(n, device=h.device)  # each row's capped logit at its target
    logit_sum = torch.zeros(n, device=h.device)  # over the vocabulary: label smoothing's part of the loss
    scaled = torch.zeros(n, h.shape[1], device=h.device) if want_grad else None  # sum slope exp(c - running max) W
    fixed = torch.zeros(n, h.shape[1], device=h.device) if want_grad else None  # sum slope q W
    for start, w in head.slabs(dtype, _slab_rows(head)):  # w (S, d)
        stop = start + w.shape[0]
        bias = head.bias[start:stop].to(dtype) if head.bias is not None else None
        c = forward_product(h, w, bias).float()  # (n, S)
        slope = None
        if softcap is not None:
            c.div_(softcap).tanh_()
            slope = 1 - c.square() if want_grad else None  # dc/dz
            c.mul_(softcap)
        rows = ((targets >= start) & (targets < stop)).nonzero().squeeze(1)  # the rows whose target is in this slab
        columns = targets[rows] - start
        picked[rows] = c[rows, columns]
        if label_smoothing:
            logit_sum += c.sum(dim=1)
        if want_grad:
            at_target = w[columns].float()  # (k, d): the target's row of the head, for each row whose target is here
            if slope is not None:
                at_target *= slope[rows, columns, None]
            fixed[rows] += (1 - label_smoothing) * at_target
            if label_smoothing:
                spread = input_gradient(slope.to(dtype), w).float() if slope is not None else w.float().sum(dim=0)  # (n, d) or (d,)
                fixed += label_smoothing / vocab * spread
        new_max = torch.maximum(running_max, c.amax(dim=1))
        rescale = torch.exp(running_max - new_max)  # 0 on the first slab
        c.sub_(new_max[:, None]).exp_()  # (n, S): exp(c - running max)
        running_sum.mul_(rescale).add_(c.sum(dim=1))
        if want_grad:
            if slope is not None:
                c.mul_(slope)
            scaled.mul_(rescale[:, None]).add_(input_gradient(c.to(dtype), w).float())
        running_max = new_max
        del c, slope  # freed before the next slab's logits take the same memory
    losses = running_max + running_sum.log() - (1 - label_smoothing) * picked
    if label_smoothing:
        losses -= label_smoothing / vocab * logit_sum
    grad = scaled.div_(running_sum[:, None]).sub_(fixed) if want_grad else None
    return losses.sum(), grad


def _slab_rows(head: QuantLinear) -> int:
    return min(head.out_features, max(1, SLAB_VALUES // head.in_features))


def _rows_per_block(n: int, head: QuantLinear) -> int:
    """As many rows as keep a block's logits over one slab within SLAB_LOGITS, in blocks of equal size."""
    rows = max(64, SLAB_LOGITS // _slab_rows(head))
    return math.ceil(n / math.ceil(n / rows))


def _loss(hidden, head, targets, label_smoothing, softcap, want_grad) -> tuple[torch.Tensor, torch.Tensor | None]:
    dtype = _compute_dtype(hidden)
    with torch.autocast(hidden.device.type, enabled=False):
        h = hidden.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad = torch.empty(h.shape, dtype=hidden.dtype, device=h.device) if want_grad else None
        rows = _rows_per_block(h.shape[0], head)
        for start in range(0, h.shape[0], rows):
            part, part_grad = _block(h[start : start + rows], head, targets[start : start + rows], label_smoothing, softcap, want_grad)
            total += part
            if want_grad:
                grad[start : start + rows] = part_grad
    return total, grad


class _QuantizedHeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, targets, label_smoothing, softcap):
        total, ctx.grad = _loss(hidden, head, targets, label_smoothing, softcap, want_grad=True)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad, ctx.grad = ctx.grad.mul_(grad_total), None
        return grad, None, None, None, None


def quantized_head_cross_entropy(
    hidden: torch.Tensor, head: QuantLinear, targets: torch.Tensor, label_smoothing: float = 0.0, softcap: float | None = None
) -> torch.Tensor:
    """sum_i cross_entropy(head(hidden[i]), targets[i]) (of the soft-capped logits where `softcap` is given) for a
    frozen quantized head, its bias included. hidden (N, d), targets (N,) long, every one scored."""
    if torch.is_grad_enabled() and hidden.requires_grad:
        return _QuantizedHeadCrossEntropy.apply(hidden, head, targets, label_smoothing, softcap)
    return _loss(hidden, head, targets, label_smoothing, softcap, want_grad=False)[0]
