"""What `tfcli` does when torchrun starts it: only the training commands run on many processes, the others
are refused in one line, and rank 0 alone prints an error line (every rank meets the same mistake).
Torch-free: it reads the environment torchrun sets."""

from __future__ import annotations

import os

from tfcli.errors import TfcliError

# the commands that join torchrun's process group; every other command would run once per process
MANY_PROCESS_COMMANDS = (("train", "pretrain"), ("train", "finetune"))


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default  # the training command itself says what is wrong with it


def under_torchrun() -> bool:
    """One of several processes torchrun (or a launcher that sets what it sets) started: not a WORLD_SIZE alone,
    which a shell or a notebook may have kept from a job."""
    return _env_int("WORLD_SIZE", 1) > 1 and "LOCAL_RANK" in os.environ and "MASTER_ADDR" in os.environ


def this_rank_speaks() -> bool:
    """False on the ranks other than 0 of a torchrun job, which stay silent on an error rank 0 reports too."""
    return not under_torchrun() or _env_int("RANK", 0) == 0


def refuse_what_torchrun_cannot_run(args: list[str]) -> None:
    """A command other than `train pretrain` or `train finetune`, started by torchrun, would run once per process
    (each generating, or each writing the same -o): refuse it. Help and the version are always shown.
    Example: ["generate", "runs/x"] under torchrun -> TfcliError("`tfcli generate` runs in one process ...")"""
    if not under_torchrun() or any(a in ("-h", "--help", "--version") for a in args):
        return
    words = tuple(a for a in args if not a.startswith("-"))[:2]
    if not words or words in MANY_PROCESS_COMMANDS:
        return
    command = " ".join(words if words[:1] in (("tokenize",), ("train",), ("bench",)) else words[:1])  # a group names its command
    raise TfcliError(
        f"`tfcli {command}` runs in one process; under torchrun only `tfcli train pretrain` and `tfcli train finetune` run on many",
        hint=f"run `tfcli {command}` without torchrun",
    )
