"""Adapters: small trained weights on top of a frozen parent run (LoRA, `lora.py`), and what a run
directory records about them. Torch-free; `tfcli.checkpoint` saves and loads them.

An adapter run keeps `adapter_config.json` and `adapter_model.safetensors` in PEFT's layout, with tfcli's
module names (`base_model.model.decoder.blocks.0.attn.qkv.lora_A.weight`), instead of `model.safetensors`;
its config.json's `adapter` record names the parent run (relative to the run, and absolute) and the
parent's weights file (size, modification time, sha256), so an adapter is never applied to other weights.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from tfcli.errors import TfcliError
from tfcli.fsutil import sha256_file
from tfcli.schema import JsonRecord

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # how PEFT names a wrapped model's modules in its files
MAX_CHAIN = 8  # an adapter on an adapter run on ...: deeper than this is a loop in hand-edited configs


@dataclasses.dataclass
class AdapterRecord(JsonRecord):
    """config.json's `adapter` section of an adapter run."""

    rank: int
    alpha: float  # the update B @ A is scaled by alpha / rank, as PEFT does
    targets: list[str]  # the groups asked for (qkv, out, mlp)
    modules: list[str]  # the linear layers wrapped, by tfcli module name
    parent: str  # the parent run directory, relative to this run's folder
    parent_path: str  # the same, absolute (tried when the relative one is gone)
    parent_weights_bytes: int
    parent_weights_sha256: str
    parent_weights_mtime_ns: int = 0  # when equal to the file's, its checksum is not computed again
    dropout: float = 0.0
    modules_to_save: list[str] = dataclasses.field(default_factory=list)  # trained whole (a new classification head)
    kind: str = "lora"

    def __post_init__(self) -> None:
        if self.kind != "lora":
            raise TfcliError(f"adapter kind {self.kind!r} is not one tfcli knows", hint="tfcli reads LoRA adapters")
        if self.rank < 1 or not self.alpha > 0 or not self.modules:
            raise TfcliError("the adapter record needs a rank of at least 1, a positive alpha and the modules it wraps")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def placed_in(self, folder: Path) -> AdapterRecord:
        """This record as a run in `folder` keeps it: the parent's path relative to that folder."""
        return dataclasses.replace(self, parent=os.path.relpath(self.parent_path, Path(folder).resolve()))


def describe_parent(parent_dir: Path, weights: Path) -> dict[str, Any]:
    """The parent fields of an AdapterRecord for the run in `parent_dir` whose weights file is `weights`."""
    stat = weights.stat()
    return {
        "parent": str(Path(parent_dir).resolve()),  # made relative by placed_in when the run is saved
        "parent_path": str(Path(parent_dir).resolve()),
        "parent_weights_bytes": stat.st_size,
        "parent_weights_sha256": sha256_file(weights),
        "parent_weights_mtime_ns": stat.st_mtime_ns,
    }


def find_parent(run_dir: Path, record: AdapterRecord) -> Path:
    """The parent run's folder: where the record says, relative to the run (both moved together), else
    absolute; a clear error when it is at neither."""
    for candidate in (Path(run_dir) / record.parent, Path(record.parent_path)):
        if (candidate / "config.json").is_file():
            return candidate
    raise TfcliError(
        f"{run_dir} is a LoRA adapter on the run {record.parent_path}, which is not there (moved or deleted)",
        hint=f"put the parent run back (or at {record.parent} from the adapter run), or merge the adapter while both are there: tfcli export RUN --merge -o OUT",
    )


def check_parent_weights(parent_dir: Path, weights: Path, record: AdapterRecord) -> None:
    """The parent's weights are the ones the adapter was trained on: same size and, unless the file's
    modification time is the recorded one, the same sha256."""
    hint = "an adapter fits only the weights it was trained on; restore the parent run as it was"
    if not weights.is_file():
        raise TfcliError(f"the parent run {parent_dir} of this adapter has no {weights.name}", hint=hint)
    stat = weights.stat()
    if stat.st_size != record.parent_weights_bytes:
        raise TfcliError(
            f"the parent run {parent_dir} changed since the adapter was trained ({weights.name} holds {stat.st_size:,} bytes, was {record.parent_weights_bytes:,})",
            hint=hint,
        )
    if stat.st_mtime_ns != record.parent_weights_mtime_ns and sha256_file(weights) != record.parent_weights_sha256:
        raise TfcliError(f"the parent run {parent_dir} changed since the adapter was trained (the sha256 of {weights.name} differs)", hint=hint)


def peft_config(
    record: AdapterRecord,
    target_modules: list[str],
    modules_to_save: list[str],
    base_model: str | None,
    fan_in_fan_out: bool = False,
    ensure_weight_tying: bool = False,
) -> dict[str, Any]:
    """adapter_config.json as PEFT writes it for a LoRA adapter (PEFT fills in the keys left out);
    ensure_weight_tying (a newer PEFT key) where a tied embedding trains whole, so that the output layer
    stays that matrix; left out otherwise, for older PEFT."""
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model,
        "r": record.rank,
        "lora_alpha": record.alpha,
        "lora_dropout": record.dropout,
        "target_modules": list(target_modules),
        "modules_to_save": list(modules_to_save) or None,
        "fan_in_fan_out": fan_in_fan_out,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    if ensure_weight_tying:
        config["ensure_weight_tying"] = True
    return config
