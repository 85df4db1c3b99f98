"""The optimizers (AdamW with decoupled weight decay on matrices only; or Muon on the blocks' weight matrices
beside AdamW on the rest), the learning-rate schedule, and the optimizer state as named tensors (for
safetensors; no pickle)."""

from __future__ import annotations

import math

import torch
from torch import nn

from tfcli.errors import TfcliError
from tfcli.training_config import TrainConfig

EMBEDDING_SUFFIXES = ("tok_emb.weight", "pos_emb.weight")
MUON_PREFIX = "muon/"  # Muon's state in the trainer state: `muon/NAME/KEY` beside AdamW's `NAME/KEY`


def parameter_groups(model: nn.Module, weight_decay: float, skip: frozenset[int] = frozenset()) -> list[dict]:
    """Decay weight matrices; leave norms, biases and embeddings undecayed (as GPT-2 and BERT recipes do).
    Parameters whose id is in `skip` (Muon's) are left out."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad or id(parameter) in skip:
            continue
        if parameter.dim() >= 2 and not name.endswith(EMBEDDING_SUFFIXES):
            decay.append(parameter)
        else:
            no_decay.append(parameter)
    if not decay and not no_decay and not skip:
        raise TfcliError("every parameter is frozen; nothing would train", hint="use a lighter --freeze")
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The trainable weight matrices inside the transformer blocks (attention's and the MLP's projections):
    what Muon trains. Not the embeddings, the output layer, the heads (MLM transform, pooler, classifier),
    norms or biases. Example: decoder.blocks.0.attn.qkv.weight is one; tok_emb.weight and decoder.norm.weight are not."""
    return [p for name, p in model.named_parameters() if p.requires_grad and p.dim() == 2 and ".blocks." in f".{name}"]


class MuonWithAdamW:
    """`--optimizer muon`: torch.optim.Muon on the hidden matrices, AdamW on every other parameter, stepped
    together; to the trainer one optimizer (`param_groups`, `step`, `zero_grad`). Each group keeps its peak
    learning rate (`peak_lr`) for `set_lr_factor`."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return [*self.adamw.param_groups, *self.muon.param_groups]

    def step(self) -> None:
        self.adamw.step()
        self.muon.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)


Optimizer = torch.optim.Optimizer | MuonWithAdamW


def make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> Optimizer:
    """AdamW over the trainable parameters; with optimizer "muon", Muon (lr muon_lr; Keller Jordan's shape
    scaling of the rate, Nesterov momentum, five Newton-Schulz steps: torch's defaults) over
    `hidden_matrices` and AdamW over the rest. A model with no trainable hidden matrix (--freeze body) gets
    AdamW alone."""
    matrices = hidden_matrices(model) if config.optimizer == "muon" else []
    adamw = torch.optim.AdamW(
        parameter_groups(model, config.weight_decay, frozenset(map(id, matrices))),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        fused=device.type == "cuda" or None,
    )
    for group in adamw.param_groups:
        group["peak_lr"] = config.lr
    if not matrices:
        return adamw
    if not hasattr(torch.optim, "Muon"):
        raise TfcliError(f"--optimizer muon needs torch.optim.Muon, which torch has from 2.9 on; this is torch {torch.__version__}", hint="upgrade torch")
    muon = torch.optim.Muon(matrices, lr=config.muon_lr, weight_decay=config.muon_weight_decay, momentum=config.muon_momentum, nesterov=True)
    for group in muon.param_groups:
        group["peak_lr"] = config.muon_lr
    return MuonWithAdamW(muon, adamw)


def set_lr_factor(optimizer: Optimizer, factor: float) -> None:
    """Every group's learning rate: its peak (`lr`, or `muon_lr` for Muon's) times the schedule's factor."""
    for group in optimizer.param_groups:
        group["lr"] = group["peak_lr"] * factor


def lr_factor(config: TrainConfig, step: int, fraction: float | None = None) -> float:
    """The multiplier on the peak lr for the update at `step` (0-based): linear warm-up, then cosine, linear or
    constant decay to min_lr_ratio, or wsd: constant at the peak, then a linear decay over the last
    `decay_fraction` of the run. With a time budget, `fraction` (elapsed / budget) drives the decay (which
    then ends at the budget) and, unless warmup_steps is set, the warm-up (the first 5% of the budget).

    Example (max_steps 100, warmup 10, cosine, min 0.1): step 0 -> 0.0909, step 9 -> 0.909, step 10 -> 1.0, step 99 -> ~0.1.
    Example (max_steps 100, warmup 10, wsd, decay_fraction 0.2, min 0.1): step 50 -> 1.0, step 79 -> 1.0, step 80 -> 0.964, step 99 -> 0.1.
    After `decay_restart` [step s, factor f] (a run resumed with another max_steps) the decay goes from f at s
    down to min_lr_ratio at the new last step; wsd stays at f until the new run's decay window (or s, if s
    is inside it) and decays linearly from there.
    """
    top = 1.0
    restart = config.decay_restart
    if fraction is None and restart is not None and step >= restart[0]:
        start, top = int(restart[0]), float(restart[1])
        if config.schedule == "wsd":
            last = max(1, config.max_steps - 1)
            return _wsd(config, step / last, top, start / last)
        progress = (step - start) / max(1, config.max_steps - start - 1)
    elif fraction is None:
        total = config.max_steps
        warmup = config.warmup_steps if config.warmup_steps is not None else total // 20
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if config.schedule == "wsd":
            return _wsd(config, step / max(1, total - 1))
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
        if config.schedule == "wsd":
            return _wsd(config, fraction)
    progress = min(max(progress, 0.0), 1.0)
    low = min(config.min_lr_ratio, top)
    if config.schedule == "cosine":
        return low + (top - low) * 0.5 * (1 + math.cos(math.pi * progress))
    if config.schedule == "linear":
        return low + (top - low) * (1 - progress)
    return top


def _wsd(config: TrainConfig, position: float, top: float = 1.0, not_before: float = 0.0) -> float:
    """The stable and decay phases of wsd at `position` (0 at the first step, 1 at the last, or the budget's
    fraction): `top` until the decay begins (at 1 - decay_fraction, or `not_before` if later), then linearly
    down to min_lr_ratio at 1. Example (decay_fraction 0.2, min 0.1): 0.5 -> 1.0, 0.9 -> 0.55, 1.0 -> 0.1."""
    position = min(max(position, 0.0), 1.0)
    begin = max(1.0 - config.decay_fraction, not_before)
    if position <= begin or begin >= 1.0:
        return top
    low = min(config.min_lr_ratio, top)
    return top - (top - low) * (position - begin) / (1.0 - begin)


def optimizer_tensors(optimizer: Optimizer, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state keyed `NAME/KEY` (`tok_emb.weight/exp_avg`), Muon's `muon/NAME/KEY`
    (`muon/decoder.blocks.0.attn.qkv.weight/momentum_buffer`); `names` maps id(param) to its name."""
    if isinstance(optimizer, MuonWithAdamW):
        muon = {MUON_PREFIX + key: value for key, value in optimizer_tensors(optimizer.muon, names).items()}
        return {**optimizer_tensors(optimizer.adamw, names), **muon}
    tensors = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            for key, value in optimizer.state.get(parameter, {}).items():
                value = value if torch.is_tensor(value) else torch.tensor(value)
                tensors[f"{names[id(parameter)]}/{key}"] = value.detach().to("cpu").contiguous()
    return tensors


def load_optimizer_tensors(optimizer: Optimizer, tensors: dict[str, torch.Tensor], names: dict[int, str]) -> None:
    """Put state saved by `optimizer_tensors` back; the parameters must be the same, by name and shape."""
    if isinstance(optimizer, MuonWithAdamW):
        load_optimizer_tensors(optimizer.muon, {k.removeprefix(MUON_PREFIX): t for k, t in tensors.items() if k.startswith(MUON_PREFIX)}, names)
        load_optimizer_tensors(optimizer.adamw, {k: t for k, t in tensors.items() if not k.startswith(MUON_PREFIX)}, names)
        return
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
            f"the optimizer state holds {unknown[0]}, which is not a trainable parameter of this model (or of this optimizer)",
            hint="resume with the same model, --freeze and --optimizer as the run was started with",
        )
    optimizer.load_state_dict({"state": state, "param_groups": state_dict["param_groups"]})
