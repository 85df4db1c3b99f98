"""AdamW with decoupled weight decay on matrices only, the learning-rate schedule, and the optimizer state
as named tensors (for safetensors; no pickle)."""

from __future__ import annotations

import math

import torch
from torch import nn

from tfcli.errors import TfcliError
from tfcli.training_config import TrainConfig

EMBEDDING_SUFFIXES = ("tok_emb.weight", "pos_emb.weight")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay weight matrices; leave norms, biases and embeddings undecayed (as GPT-2 and BERT recipes do)."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if parameter.dim() >= 2 and not name.endswith(EMBEDDING_SUFFIXES):
            decay.append(parameter)
        else:
            no_decay.append(parameter)
    if not decay and not no_decay:
        raise TfcliError("every parameter is frozen; nothing would train", hint="use a lighter --freeze")
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        fused=device.type == "cuda" or None,
    )


def lr_factor(config: TrainConfig, step: int, fraction: float | None = None) -> float:
    """The multiplier on the peak lr for the update at `step` (0-based): linear warm-up, then cosine, linear or
    constant decay to min_lr_ratio. With a time budget, `fraction` (elapsed / budget) drives the decay and,
    unless warmup_steps is set, the warm-up (the first 5% of the budget).

    Example (max_steps 100, warmup 10, cosine, min 0.1): step 0 -> 0.0909, step 9 -> 0.909, step 10 -> 1.0, step 99 -> ~0.1.
    After `decay_restart` [step s, factor f] (a run resumed with another max_steps) the decay goes from f at s
    down to min_lr_ratio at the new last step.
    """
    top = 1.0
    restart = config.decay_restart
    if fraction is None and restart is not None and step >= restart[0]:
        start, top = int(restart[0]), float(restart[1])
        progress = (step - start) / max(1, config.max_steps - start - 1)
    elif fraction is None:
        total = config.max_steps
        warmup = config.warmup_steps if config.warmup_steps is not None else total // 20
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup - 1)
    else:
        fraction = min(max(fraction, 0.0), 1.0)
        if config.warmup_steps is not None:
            if step < config.warmup_steps:
                return (step + 1) / (config.warmup_steps + 1)
            progress = fraction
        else:
            if fraction < 0.05:
                return max(fraction / 0.05, 1e-3)
            progress = (fraction - 0.05) / 0.95
    progress = min(max(progress, 0.0), 1.0)
    low = min(config.min_lr_ratio, top)
    if config.schedule == "cosine":
        return low + (top - low) * 0.5 * (1 + math.cos(math.pi * progress))
    if config.schedule == "linear":
        return low + (top - low) * (1 - progress)
    return top


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state keyed `NAME/KEY` (`tok_emb.weight/exp_avg`); `names` maps id(param) to its name."""
    tensors = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            for key, value in optimizer.state.get(parameter, {}).items():
                value = value if torch.is_tensor(value) else torch.tensor(value)
                tensors[f"{names[id(parameter)]}/{key}"] = value.detach().to("cpu").contiguous()
    return tensors


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], names: dict[int, str]) -> None:
    """Put state saved by `optimizer_tensors` back; the parameters must be the same, by name and shape."""
    state_dict = optimizer.state_dict()
    state: dict[int, dict[str, torch.Tensor]] = {}
    index = 0
    expected = set()
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            name = names[id(parameter)]
            entry = {key.split("/", 1)[1]: t for key, t in tensors.items() if key.split("/", 1)[0] == name}
            for key, t in entry.items():
                expected.add(f"{name}/{key}")
                if key != "step" and tuple(t.shape) != tuple(parameter.shape):
                    raise TfcliError(f"the optimizer state for {name} has shape {list(t.shape)}, the parameter {list(parameter.shape)}")
            if entry:
                state[index] = entry
            index += 1
    unknown = sorted(set(tensors) - expected)
    if unknown:
        raise TfcliError(
            f"the optimizer state holds {unknown[0]}, which is not a trainable parameter of this model",
            hint="resume with the same model and --freeze as the run was started with",
        )
    optimizer.load_state_dict({"state": state, "param_groups": state_dict["param_groups"]})
