"""Fully sharded data parallel (`--fsdp`, torch's FSDP2 `fully_shard`): every block's parameters,
gradients and optimizer state are split across the processes, and a block's full weights are gathered
only while it runs. A model whose weights, gradients and Adam moments do not fit one device can then
train on several. Checkpoints stay the ordinary run directory: the shards are gathered on save, so a
sharded run resumes sharded or not, on any number of processes the data-parallel rules allow."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from tfcli.train.distributed import World

_FULL = dict(full_state_dict=True, cpu_offload=True)


def shard_model(model: nn.Module, device: torch.device, world: World) -> None:
    """Shard each block of each stack, then the rest (embeddings, final norm, heads) as one group."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world.size,))
    for stack_name in ("encoder", "decoder"):
        stack = getattr(model, stack_name, None)
        if stack is not None:
            for block in stack.blocks:
                fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """Off for the micro-batches before the last of an accumulated step (FSDP's no_sync)."""
    model.set_requires_gradient_sync(sync)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight, whole, on the CPU of rank 0 (empty elsewhere). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(**_FULL))


def full_optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer state, whole, keyed `NAME/KEY` as `optim.optimizer_tensors` keys it (rank 0; empty
    elsewhere). A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(**_FULL)).get("state", {})
    return {
        f"{name}/{key}": (value if torch.is_tensor(value) else torch.tensor(value)).detach().contiguous()
        for name, entry in state.items()
        for key, value in entry.items()
    }


def load_full_optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]) -> None:
    """Give each rank its shard of optimizer state saved whole (every rank passes the same tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict

    template = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name, field = key.split("/", 1)
        state.setdefault(name, {})[field] = tensor
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": template["param_groups"]}, options=StateDictOptions(full_state_dict=True))


def local_value(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) result made whole, e.g. the global gradient norm; other tensors as they are."""
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor
