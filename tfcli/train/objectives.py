"""The loss of each task on one micro-batch (summed, so the loop can divide by the global target count),
and evaluation metrics on the validation batches."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.loss import IGNORE_INDEX
from tfcli.model.transformer import HIDDEN, DecoderInput, Logits, Loss
from tfcli.train.data import Batch


def loss_sum(model: nn.Module, batch: Batch, task: str, label_smoothing: float = 0.0) -> torch.Tensor:
    """Summed cross-entropy over the batch's targets (fp32). Vocabulary tasks use the model's fused
    projection + loss, which never holds the logits."""
    t = batch.tensors
    labels = t["labels"]
    if task == "classify":
        class_logits = model(t["ids"], t["padding"], head=HIDDEN).class_logits  # (B, n_classes)
        return F.cross_entropy(class_logits.float(), labels, reduction="sum", label_smoothing=label_smoothing)
    if task in ("lm", "mlm", "chat", "instruct"):
        return model(t["ids"], head=Loss(labels, label_smoothing)).loss
    decoder = DecoderInput(t["decoder_ids"], t["decoder_padding"])  # seq2seq, denoise
    return model(t["ids"], t["padding"], head=Loss(labels, label_smoothing), decoder=decoder).loss


def macro_f1(predictions: list[int], labels: list[int]) -> float:
    """F1 averaged over the classes that occur in the labels or the predictions.
    Example: predictions [0, 0, 1], labels [0, 1, 1] -> (2/3 + 2/3) / 2 = 0.667."""
    classes = sorted(set(predictions) | set(labels))
    scores = []
    for c in classes:
        tp = sum(p == c and y == c for p, y in zip(predictions, labels))
        fp = sum(p == c and y != c for p, y in zip(predictions, labels))
        fn = sum(p != c and y == c for p, y in zip(predictions, labels))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return sum(scores) / len(scores) if scores else 0.0


def _chat_scores(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> tuple[float, list[bool]]:
    """The summed loss over the assistant's tokens, and for each conversation whether every one of them is the
    model's most likely next token (then greedy decoding writes each reply exactly, given the turns before it)."""
    scored = labels != IGNORE_INDEX  # (B, T)
    logits = model(ids, head=Logits(at=scored)).logits.float()  # (N, vocab), the scored positions only
    targets = labels[scored]
    loss = F.cross_entropy(logits, targets, reduction="sum").item()
    wrong = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
    wrong.index_add_(0, scored.nonzero()[:, 0], (logits.argmax(-1) != targets).long())
    return loss, (wrong == 0).tolist()


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[Batch], task: str, device: torch.device, autocast, token_bytes: torch.Tensor | None = None
) -> dict[str, float]:
    """val_loss (mean per target) and, by task: val_ppl, val_bpb (lm, given each token's byte length),
    val_accuracy and val_macro_f1 (classify), val_accuracy (chat, instruct: the share of conversations whose
    every assistant token is the most likely one)."""
    was_training = model.training
    model.eval()
    total, count, target_bytes = 0.0, 0, 0
    predictions: list[int] = []
    truth: list[int] = []
    try:
        for batch in batches:
            batch = batch.to(device)
            with autocast():
                if task == "classify":
                    t = batch.tensors
                    class_logits = model(t["ids"], t["padding"], head=HIDDEN).class_logits.float()
                    total += F.cross_entropy(class_logits, t["labels"], reduction="sum").item()
                    predictions += class_logits.argmax(-1).tolist()
                    truth += t["labels"].tolist()
                elif task in ("chat", "instruct"):
                    loss, replies_right = _chat_scores(model, batch.tensors["ids"], batch.tensors["labels"])
                    total += loss
                    predictions += replies_right
                else:
                    total += loss_sum(model, batch, task).item()
            count += batch.count
            if token_bytes is not None and task == "lm":
                target_bytes += int(token_bytes[batch.tensors["labels"].flatten().cpu()].sum())
    finally:
        model.train(was_training)
    if count == 0:
        return {}
    metrics = {"val_loss": total / count}
    if task in ("chat", "instruct"):
        metrics["val_accuracy"] = sum(predictions) / len(predictions)
    if task == "classify":
        metrics["val_accuracy"] = sum(p == y for p, y in zip(predictions, truth)) / len(truth)
        metrics["val_macro_f1"] = macro_f1(predictions, truth)
    else:
        metrics["val_ppl"] = math.exp(min(metrics["val_loss"], 700.0))
        if target_bytes:
            metrics["val_bpb"] = total / math.log(2) / target_bytes
    return metrics
