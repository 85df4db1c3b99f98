"""Reading a Hugging Face model folder: its config.json, its weights (model.safetensors, or shards named by
model.safetensors.index.json) one tensor at a time, and the values config.json holds. Never pickle.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError, safe_open

from tfcli.errors import TfcliError
from tfcli.fsutil import refuse_git_lfs_pointer
from tfcli.jsontext import loads_json
from tfcli.limits import read_text_capped
from tfcli.rundir import PICKLE_SUFFIXES, WEIGHTS_FILE, read_run_config
from tfcli.tensorfile import safetensors_path

if TYPE_CHECKING:
    import torch

INDEX_FILE = "model.safetensors.index.json"
_MISSING = object()


def read_hf_config(src: Path) -> dict[str, Any]:
    """config.json of a Hugging Face folder, as a dictionary."""
    path = src / "config.json"
    if not path.is_file() and (src / "adapter_config.json").is_file():
        raise TfcliError(
            f"{src} is a PEFT adapter, not a model: tfcli imports whole models",
            hint="import its base model, or merge the adapter into it with PEFT's merge_and_unload() and import the merged folder",
        )
    if not path.is_file() and (src / "base" / "config.json").is_file() and (src / "adapter" / "adapter_config.json").is_file():
        raise TfcliError(
            f"{src} holds a base model and a PEFT adapter (as `tfcli export` writes a LoRA run); tfcli imports whole models",
            hint=f"import {src / 'base'}, or merge the adapter with PEFT's merge_and_unload() and import the merged folder",
        )
    if not path.is_file():
        _refuse_other_layouts(src)
        raise TfcliError(f"{src} has no config.json", hint="pass a Hugging Face model folder (config.json + model.safetensors + tokenizer)")
    return read_json_object(path)


def _refuse_other_layouts(src: Path) -> None:
    """A folder without config.json that holds a model another way, as a download leaves it: GGUF files (a
    -GGUF repository), the Hugging Face cache's models--ORG--NAME (the folder is snapshots/REVISION), Mistral's
    own files (params.json, consolidated.safetensors). One line naming what to pass; nothing otherwise."""
    try:
        ggufs = sorted(p.name for p in src.glob("*.gguf"))
        snapshots = sorted(p.parent for p in src.glob("snapshots/*/config.json"))
        nested = sorted(p.parent for p in src.glob("*/config.json") if not is_tfcli_run(p.parent))
    except OSError:
        return
    if ggufs:
        shown = ", ".join(ggufs[:3]) + (", ..." if len(ggufs) > 3 else "")
        raise TfcliError(f"{src} holds GGUF files ({shown}), not a Hugging Face model folder", hint=f"import one file: tfcli import {src / ggufs[0]} -o RUN")
    if snapshots:  # refs/main names the revision the cache holds as current
        current = src / "snapshots" / _small_text(src / "refs" / "main")
        folder = current if current in snapshots else snapshots[-1]
        raise TfcliError(f"{src} is the Hugging Face cache's folder of a model; its files are in {folder}", hint=f"tfcli import {folder} -o RUN")
    if nested:
        names = ", ".join(p.name for p in nested[:3]) + (", ..." if len(nested) > 3 else "")
        raise TfcliError(
            f"{src} holds {'a model' if len(nested) == 1 else 'models'} in {names}, not one of its own", hint=f"pass one: tfcli import {nested[0]} -o RUN"
        )
    if (src / "params.json").is_file() and any(src.glob("consolidated*")):
        raise TfcliError(
            f"{src} holds Mistral's own format (params.json, consolidated weights), not a Hugging Face model folder",
            hint="download the repository's Hugging Face files (config.json, model*.safetensors, tokenizer.json) and import those",
        )


def is_tfcli_run(folder: Path) -> bool:
    """Whether the folder holds a tfcli run (its config.json reads as one)."""
    try:
        read_run_config(folder)
    except TfcliError:
        return False
    return True


def _small_text(path: Path) -> str:
    """A file of a few bytes, stripped (a name or a revision), or "" when it cannot be read."""
    try:
        return path.read_bytes()[:256].decode("utf-8", "replace").strip()
    except OSError:
        return ""


class HfConfig:
    """config.json's values, each checked for its type as it is read; a problem names the file and the key."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data, self.path = data, path

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise TfcliError(f"{self.path} lacks the key {key!r}", hint="use the config.json that came with the weights")
            return default
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise TfcliError(f"{self.path} has {key} {json.dumps(value)}, which is not a whole number")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TfcliError(f"{self.path} has {key} {json.dumps(value)}, which is not a number")
        if kind is bool and not isinstance(value, bool):
            raise TfcliError(f"{self.path} has {key} {json.dumps(value)}, which is not true or false")
        if kind in (str, dict) and not isinstance(value, kind):
            raise TfcliError(f"{self.path} has {key} {json.dumps(value)}, which is not {'a string' if kind is str else 'an object'}")
        return float(value) if kind is float else value


def _name_variants(name: str) -> list[str]:
    """Names one tensor goes by in published files: with or without the base model's prefix (the hub's
    GPT-2 and BertModel files have none), and BERT's LayerNorm gamma/beta from its TensorFlow days."""
    names = [name]
    for prefix in ("transformer.", "model.", "bert."):
        if name.startswith(prefix):
            names.append(name[len(prefix) :])
    for variant in list(names):
        if variant.endswith("LayerNorm.weight"):
            names.append(variant[: -len("weight")] + "gamma")
        elif variant.endswith("LayerNorm.bias"):
            names.append(variant[: -len("bias")] + "beta")
    return names


class WeightFiles:
    """A folder's safetensors files, opened together and read one tensor at a time (so a large model is
    never held twice); pickle files are refused by name, never opened."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.files = self._find_files()
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, Any] = {}  # tensor name -> the open file that holds it

    def _find_files(self) -> list[Path]:
        src = self.src
        if (src / WEIGHTS_FILE).is_file():
            return [src / WEIGHTS_FILE]
        if (src / INDEX_FILE).is_file():
            index = read_json_object(src / INDEX_FILE)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
                raise TfcliError(f"{src / INDEX_FILE} has no weight_map of tensor names to files")
            files = []
            for name in dict.fromkeys(weight_map.values()):
                path = src / name
                if Path(name).name != name or not name.endswith(".safetensors"):
                    raise TfcliError(f"{src / INDEX_FILE} names {name!r}, which is not a safetensors file in the folder")
                if not path.is_file():
                    raise TfcliError(f"{src} lacks {name}, a shard named in {INDEX_FILE}", hint="download every shard of the model")
                files.append(path)
            return files
        pickles = sorted(p.name for p in src.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise TfcliError(
                f"{src} has no {WEIGHTS_FILE}, only {pickles[0]}, a pickle file; tfcli never opens pickle (it can run code)",
                hint="convert it to safetensors with a tool you trust (transformers: save_pretrained(DIR, safe_serialization=True))",
            )
        raise TfcliError(f"{src} has no {WEIGHTS_FILE} (nor {INDEX_FILE} with its shards)", hint="download the model's safetensors weights")

    def __enter__(self) -> WeightFiles:
        for path in self.files:
            try:
                handle = self._stack.enter_context(safe_open(safetensors_path(path), framework="pt"))
                names = list(handle.keys())
            except (SafetensorError, OSError) as exc:
                self._stack.close()
                refuse_git_lfs_pointer(path)
                raise TfcliError(f"{path} is not a valid safetensors file ({exc})", hint="the download is truncated or corrupted") from exc
            for name in names:
                self._handles.setdefault(name, handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def names(self) -> set[str]:
        return set(self._handles)

    def find(self, name: str) -> str | None:
        """The stored name of tensor `name` (as transformers names it for the class), or None."""
        return next((n for n in _name_variants(name) if n in self._handles), None)

    def shape(self, stored: str) -> tuple[int, ...]:
        return tuple(self._handles[stored].get_slice(stored).get_shape())

    def read(self, stored: str) -> torch.Tensor:
        try:
            return self._handles[stored].get_tensor(stored)
        except SafetensorError as exc:
            raise TfcliError(f"tensor {stored} cannot be read ({exc})", hint="the download is truncated or corrupted") from exc


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object; anything else is one clear line."""
    try:
        data = loads_json(read_text_capped(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TfcliError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise TfcliError(f"{path} must hold a JSON object")
    return data
