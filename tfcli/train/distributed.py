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


class PeerLost(TfcliError):
    """A collective failed because another process of the job is gone (it crashed, was killed, or its machine
    left). Each rank that meets it says so, since the ranks' views differ."""

    rank_specific = True


# how gloo and NCCL word a collective that lost its peer, where torch raises a plain RuntimeError
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted", "Timed out")


def lost_a_peer(world: World, exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed because another rank is gone."""
    if not world.enabled:
        return False
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and any(words in str(exc) for words in _PEER_GONE))


def peer_lost(world: World, exc: BaseException, saved: str) -> PeerLost:
    """The one line a rank ends with when a peer is gone: which rank, what the backend said, and what is on disk
    (`saved`). Example: "rank 0 of 2: another process of the torchrun job stopped (Connection closed by peer
    [127.0.0.1]:9137); the checkpoint of step 40 in runs/x is intact; ..." """
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    said = said.split("] ", 1)[-1].split(". ", 1)[0][:200]  # gloo starts with its C++ source line: "[.../pair.cc:553] ..."
    return PeerLost(
        f"rank {world.rank} of {world.size}: another process of the torchrun job stopped ({said}); {saved}",
        hint="its own error is above (torchrun's summary names its exit code); fix that, then run the same torchrun command with --resume",
    )


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
