"""Many processes: `torchrun` sets RANK / WORLD_SIZE / LOCAL_RANK; we join the process group (NCCL on GPUs,
gloo on CPUs), and only rank 0 logs and writes."""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from tfcli.errors import TfcliError

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # a rank stuck past this fails the run instead of hanging


@dataclasses.dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise TfcliError(f"environment variable {name}={value!r} is not an integer") from exc


def join_world(device_kind: str) -> World:
    """The process group torchrun describes in the environment, joined; a single process otherwise."""
    size = _env_int("WORLD_SIZE", 1)
    if size <= 1:
        return World()
    world = World(_env_int("RANK", 0), size, _env_int("LOCAL_RANK", 0))
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return world


def leave_world(world: World, *, together: bool = False) -> None:
    """Tear the process group down. Ranks that finished together first wait for each other, so no rank
    shuts its connections while a peer still writes a checkpoint; a rank that failed alone leaves at once
    (torchrun stops the others)."""
    if world.enabled and dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()


def all_sum(world: World, value: torch.Tensor) -> torch.Tensor:
    if world.enabled:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def agree(world: World, interrupted: bool, elapsed: float, device: torch.device) -> tuple[bool, float]:
    """Every rank stops on the same step and reads the same clock (the slowest rank's), so a time budget
    gives every rank the same learning rate."""
    if not world.enabled:
        return interrupted, elapsed
    value = torch.tensor([1.0 if interrupted else 0.0, elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value[0].item()), float(value[1].item())
