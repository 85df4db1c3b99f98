"""Cross-entropy over the vocabulary fused with the output projection that produces the logits.

The plain way (`tfcli.model.loss`), `F.cross_entropy(hidden @ W.T, targets)`, holds the whole (tokens,
vocab) logits, their log-softmax and then their gradient in memory, and walks them several times. Here the
logits are made a block of rows at a time, the softmax is taken in place and turned straight into its
gradient (softmax - target distribution), and the gradients of the hidden states, the weight and the bias
are computed from it on the spot. Backward then only scales them. The same function, mathematically; less
memory traffic, and a fraction of the memory. `VocabularyLoss` times both on this machine for each class
of shapes and keeps the fused one unless the plain one is clearly faster. A frozen quantized head (QLoRA) has a
loss of its own (`quantized_head`), which never makes the head's float matrix whole.
"""

from __future__ import annotations

import math

import torch

from tfcli.accel import choices
from tfcli.accel.products import close, forward_product, input_gradient, rows_class, weight_gradient
from tfcli.accel.quantized_head import quantized_head_cross_entropy
from tfcli.model.loss import IGNORE_INDEX, vocabulary_cross_entropy
from tfcli.quant.linear import QuantLinear

BLOCK_LOGITS = 1 << 26  # logits per block where the weight trains: 256 MB in fp32
FROZEN_BLOCK_LOGITS = 1 << 24  # where it does not: 64 MB


def _block_rows(n_rows: int, vocab: int, weight_grad: bool = True) -> int:
    """Rows of logits per block: as many as the budget holds, in blocks of equal size. The block is live at
    the step's peak (every activation is held for backward). Where the weight trains, large blocks keep its
    gradient's product efficient and add into it only a few times (64 MB blocks made gpt2-small's loss
    about 15% slower). Where it is frozen (LoRA, --freeze embeddings, evaluation), 64 MB blocks took the
    same time and lowered a LoRA fine-tune's peak RSS at gpt2-small x 1,024 tokens by about 250 MB;
    16 MB blocks were 10% slower."""
    rows = max(64, (BLOCK_LOGITS if weight_grad else FROZEN_BLOCK_LOGITS) // vocab)
    blocks = math.ceil(n_rows / rows)
    return math.ceil(n_rows / max(blocks, 1))


def _block_loss(z: torch.Tensor, targets: torch.Tensor, label_smoothing: float, softcap: float | None) -> torch.Tensor:
    """Summed loss of a block of fp32 logits z (n, vocab), soft-capped first where `softcap` is given."""
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    lse = torch.logsumexp(z, dim=-1)  # (n,)
    picked = z.gather(1, targets[:, None]).squeeze(1)
    if not label_smoothing:
        return (lse - picked).sum()
    return (lse - (1 - label_smoothing) * picked - label_smoothing * z.mean(dim=-1)).sum()


def _block_loss_and_grad(z: torch.Tensor, targets: torch.Tensor, label_smoothing: float, softcap: float | None) -> torch.Tensor:
    """Summed loss of a block of fp32 logits z (n, vocab); z becomes d(loss)/dz in place:
    softmax(z) - ((1 - e) one_hot(target) + e / vocab). Soft-capped, c = cap * tanh(z / cap) is scored and
    d(loss)/dz = d(loss)/dc * (1 - tanh(z / cap)^2)."""
    slope = None
    if softcap is not None:
        z.div_(softcap).tanh_()  # (n, vocab)
        slope = 1 - z.square()  # dc/dz
        z.mul_(softcap)
    row_max = z.amax(dim=-1)  # (n,)
    picked = z.gather(1, targets[:, None]).squeeze(1)
    mean = z.mean(dim=-1) if label_smoothing else None
    torch.softmax(z, dim=-1, out=z)
    # The largest probability is exp(max - max) / sum = 1 / sum and never underflows, so
    # logsumexp = max + log(sum) = max - log(largest probability).
    lse = row_max - z.amax(dim=-1).log()
    z.scatter_add_(1, targets[:, None], torch.full((len(targets), 1), label_smoothing - 1.0, device=z.device))
    if label_smoothing:
        z.sub_(label_smoothing / z.shape[1])
    if slope is not None:
        z.mul_(slope)
    if not label_smoothing:
        return (lse - picked).sum()
    return (lse - (1 - label_smoothing) * picked - label_smoothing * mean).sum()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, label_smoothing, softcap):
        device_type = hidden.device.type
        autocast = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        with torch.autocast(device_type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            n = h.shape[0]
            grad_hidden = torch.empty_like(h) if need_hidden else None
            grad_weight = grad_bias = None
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            rows = _block_rows(n, w.shape[0], need_weight)
            for start in range(0, n, rows):
                h_block, t_block = h[start : start + rows], targets[start : start + rows]
                z = forward_product(h_block, w, b).float()  # (rows, vocab)
                total += _block_loss_and_grad(z, t_block, label_smoothing, softcap)
                g = z.to(dtype)
                if need_hidden:
                    grad_hidden[start : start + rows] = input_gradient(g, w)
                if need_weight:
                    part = weight_gradient(g, h_block)  # (vocab, d)
                    # summed in fp32: a bf16 sum over hundreds of blocks (a GPU's large batch) would lose the small ones
                    grad_weight = part.float() if grad_weight is None else grad_weight.add_(part)
                if need_bias:
                    part = z.sum(dim=0)
                    grad_bias = part if grad_bias is None else grad_bias.add_(part)
                del z, g  # freed before the next block is made, which then takes the same memory
        ctx.grads = (grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grads = []
        for grad, dtype in zip(ctx.grads, ctx.dtypes):
            grads.append(None if grad is None else grad.mul_(grad_total).to(dtype))
        ctx.grads = None
        return (*grads, None, None, None)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor | QuantLinear,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
) -> torch.Tensor:
    """sum_i cross_entropy(hidden[i] @ weight.T + bias, targets[i]) over the rows whose target is not
    IGNORE_INDEX, without holding all the logits; the same value and gradients as
    `F.cross_entropy(F.linear(hidden, weight, bias), targets, reduction="sum", label_smoothing=...)`
    (of the soft-capped logits where `softcap` is given: tfcli.model.loss.vocabulary_cross_entropy).
    hidden (N, d), weight (vocab, d), bias (vocab,) or None, targets (N,) long. `weight` may be a frozen quantized
    head (QLoRA), which adds its own bias (`bias` None): its rows are read a slab at a time, never whole."""
    scored = targets != IGNORE_INDEX
    if not bool(scored.all()):
        hidden, targets = hidden[scored], targets[scored]
    if isinstance(weight, QuantLinear):
        return quantized_head_cross_entropy(hidden, weight, targets, label_smoothing, softcap) if targets.numel() else hidden.sum() * 0.0
    if targets.numel() == 0:
        return (hidden.sum() + weight.sum()) * 0.0  # no targets: zero, still connected to the graph
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets, label_smoothing, softcap)
    return _loss_only(hidden, weight, bias, targets, label_smoothing, softcap)


def _loss_only(hidden, weight, bias, targets, label_smoothing, softcap) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    rows = _block_rows(hidden.shape[0], weight.shape[0], weight_grad=False)
    for start in range(0, hidden.shape[0], rows):
        z = forward_product(hidden[start : start + rows], weight, bias).float()
        total += _block_loss(z, targets[start : start + rows], label_smoothing, softcap)
    return total


FUSED, PLAIN = "fused", "plain"


class VocabularyLoss:
    """The model's loss over the vocabulary (`Transformer.vocabulary_loss`), fused or plain: for each class
    of shapes, both are timed on this machine (value and gradients, or the value alone where no gradient is
    asked for), and the fused one, which holds a fraction of the memory, is kept unless the plain one takes
    at most choices.MARGIN of its time. A frozen quantized head (QLoRA) takes the fused one: the plain one would hold
    every logit at once."""

    def __call__(self, hidden, weight, bias, targets, label_smoothing: float = 0.0, softcap: float | None = None) -> torch.Tensor:
        if torch.compiler.is_compiling() or self.choice(hidden, weight, bias, label_smoothing, softcap) == PLAIN:  # compiled: fused by inductor
            return vocabulary_cross_entropy(hidden, weight, bias, targets, label_smoothing, softcap)
        return linear_cross_entropy(hidden, weight, bias, targets, label_smoothing, softcap)

    def choice(self, hidden, weight, bias, label_smoothing: float, softcap: float | None = None) -> str:
        if isinstance(weight, QuantLinear):
            return FUSED
        device = hidden.device
        autocast = torch.is_autocast_enabled(device.type)
        dtype = torch.get_autocast_dtype(device.type) if autocast else hidden.dtype
        grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        weight_trains = grad and weight.requires_grad  # a frozen output layer (LoRA, --freeze): no weight gradient, smaller blocks
        rows, (vocab, width) = rows_class(hidden.shape[0]), weight.shape
        wanted = ("gradients" if weight_trains else "gradients, frozen weight") if grad else "value"
        key = (
            f"loss t{torch.get_num_threads()} {device.type} {str(dtype).removeprefix('torch.')} {rows}x{vocab}x{width}"
            f"{' bias' if bias is not None else ''}{' smoothing' if label_smoothing else ''}{' softcap' if softcap is not None else ''} {wanted}"
        )
        known = choices.choices().get(key, (FUSED, PLAIN))
        if known is not None:
            return known.choice
        generator = torch.Generator(device=device).manual_seed(0)
        h = torch.randn(rows, width, device=device, dtype=hidden.dtype, generator=generator).requires_grad_(grad)
        w = torch.randn(vocab, width, device=device, dtype=weight.dtype, generator=generator).mul_(0.05).requires_grad_(weight_trains)
        b = torch.zeros(vocab, device=device, dtype=weight.dtype).requires_grad_(weight_trains) if bias is not None else None
        t = torch.randint(0, vocab, (rows,), device=device, generator=generator)

        def run(loss_function):
            def once():
                for tensor in (h, w, b):
                    if tensor is not None:
                        tensor.grad = None
                with torch.autocast(device.type, dtype=dtype, enabled=autocast):
                    loss = loss_function(h, w, b, t, label_smoothing, softcap)
                if grad:
                    loss.backward()
                    return (loss.detach(), h.grad, w.grad) if weight_trains else (loss.detach(), h.grad)
                return loss.detach(), h, w  # no gradients: the value is what is compared

            return once

        def same(expected, got) -> bool:
            return all(close(a.float(), b.float()) for a, b in zip(expected, got))

        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        with torch.set_grad_enabled(grad):
            return choices.choices().decide(key, {FUSED: run(linear_cross_entropy), PLAIN: run(vocabulary_cross_entropy)}, same, sync=sync)
