"""How a command line becomes the training settings (`TrainConfig`, in `tfcli/training_config.py`): a
preset, a TOML file, `--set key=value` overrides, then the everyday options."""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import typing
from pathlib import Path
from typing import Any

from tfcli.errors import TfcliError
from tfcli.limits import JSON_FILE, TOML_DEPTH, nesting_depth, read_text_capped
from tfcli.model.config import ModelConfig, preset
from tfcli.schema import expect
from tfcli.training_config import TrainConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

# Settings that only one objective (or data layout) reads; anything else given a non-default value is an error.
TASK_SETTINGS = {"mask_prob": ("mlm",), "noise_density": ("denoise",), "mean_span": ("denoise",), "val_fraction": ("classify", "seq2seq", "chat", "instruct")}


def check_settings_apply(config: TrainConfig, *, finetune: bool, val_data: bool = False) -> None:
    """A setting the run would never read (another objective's, val_fraction beside --val-data, freeze when
    pretraining) is an error rather than silently ignored."""
    default = TrainConfig()
    for name, tasks in TASK_SETTINGS.items():
        if getattr(config, name) == getattr(default, name):
            continue
        if config.task not in tasks:
            raise TfcliError(
                f"training setting {name} is for the {' and '.join(tasks)} task{'s' if len(tasks) > 1 else ''}; this run trains {config.task}",
                hint=f"drop {name}",
            )
        if name == "val_fraction" and val_data:
            raise TfcliError(
                "training setting val_fraction does nothing with --val-data (that file is the validation set)", hint="drop val_fraction, or --val-data"
            )
    if not finetune and config.freeze != default.freeze:
        raise TfcliError("training setting freeze is for fine-tuning; pretraining trains every weight", hint="drop freeze")
    check_lora_settings(config, finetune=finetune)


def check_lora_settings(config: TrainConfig, *, finetune: bool) -> None:
    """LoRA's settings go with a rank, with fine-tuning, and without --freeze or --fsdp."""
    default = TrainConfig()
    if config.lora_rank is None:
        given = [name for name in ("lora_alpha", "lora_dropout", "lora_targets") if getattr(config, name) != getattr(default, name)]
        if given:
            raise TfcliError(f"training setting {given[0]} is for LoRA, which a rank turns on", hint="add --lora-rank R, or drop it")
        return
    if not finetune:
        raise TfcliError(
            "LoRA (lora_rank) is for fine-tuning a run; pretraining trains every weight", hint="pretrain first, then: tfcli train finetune --lora-rank R"
        )
    if config.freeze != default.freeze:
        raise TfcliError(f"--freeze {config.freeze} does not go with LoRA, which freezes the whole base already", hint="drop --freeze")
    if config.fsdp:
        raise TfcliError(
            "--fsdp does not go with LoRA", hint="drop --fsdp: under torchrun each process holds the frozen base and only the adapters' gradients are synced"
        )
    if config.optimizer == "muon":
        raise TfcliError(
            "--optimizer muon does not go with LoRA: Muon is for the blocks' full weight matrices, not low-rank adapters", hint="drop --optimizer muon"
        )


def parse_duration(text: str) -> float:
    """Seconds in a duration. Example: "90s" -> 90.0, "3m" -> 180.0, "1h30m" -> 5400.0, "45" -> 45.0."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", text)
    if not parts or re.sub(r"\s*\d+(?:\.\d+)?\s*[hms]\s*", "", text):
        raise TfcliError(f"cannot read the duration {text!r}", hint="write it like 90s, 3m or 1h30m")
    seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[unit] for n, unit in parts)
    if seconds <= 0:
        raise TfcliError(f"the duration {text!r} is not positive")
    return seconds


def parse_value(text: str) -> Any:
    """A --set value as TOML reads it, else the plain string. Example: "3" -> 3, "true" -> True, "rotary" -> "rotary"."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _split_settings(settings: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Sort flat or dotted keys (`d_model`, `model.d_model`, `train.lr`) into model and training settings."""
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)} - {"labels"}
    model_types, train_types = typing.get_type_hints(ModelConfig), typing.get_type_hints(TrainConfig)
    model, train = {}, {}
    for key, value in settings.items():
        section, _, name = key.rpartition(".")
        what = f"{where} {key}" if where.startswith("--") else f"{where}: {key}"  # "--set d_model", "run.toml: d_model"
        if section in ("model", "") and name in model_keys and not (section == "" and name in train_keys):
            model[name] = expect(value, model_types[name], what)
        elif section in ("train", "") and name in train_keys:
            value = parse_duration(value) if name == "time_budget" and isinstance(value, str) else value  # "90s", as the option takes
            train[name] = expect(value, train_types[name], what)
        elif section == "" and name in model_keys:
            model[name] = expect(value, model_types[name], what)
        else:
            known = sorted(model_keys | train_keys)
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the settings are {', '.join(known)}"
            raise TfcliError(f"{where}: unknown setting {key!r}", hint=hint)
    return model, train


def read_toml(path: Path) -> dict[str, Any]:
    """A config file: [model] and [train] tables, or flat keys; returned flat with dotted section names."""
    try:
        text = read_text_capped(Path(path), JSON_FILE)
        if nesting_depth(text, TOML_DEPTH.value + 1) > TOML_DEPTH.value:  # tomllib recurses per level: 3,000 are a RecursionError
            raise TOML_DEPTH.exceeded(f"{path}'s nesting")
        data = tomllib.loads(text)
    except FileNotFoundError as exc:
        raise TfcliError(f"config file {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise TfcliError(f"config file {path} is a folder", hint="pass a TOML file, as those in examples/") from exc
    except UnicodeDecodeError as exc:
        raise TfcliError(f"config file {path} is not UTF-8 text (byte {exc.start})", hint="pass a TOML file, as those in examples/") from exc
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise TfcliError(f"{path} is not valid TOML ({exc})") from exc
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("model", "train") and isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        elif key == "preset":
            flat["preset"] = value
        else:
            flat[key] = value
    return flat


def parse_sets(items: list[str]) -> dict[str, Any]:
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TfcliError(f"--set {item!r} is not key=value", hint="for example --set d_model=128")
        settings[key.strip()] = parse_value(value.strip())
    return settings


def resolve_configs(
    *,
    preset_name: str,
    config_file: Path | None,
    sets: list[str],
    options: dict[str, Any],
    base_model: ModelConfig | None = None,
    model_fixed: dict[str, Any] | None = None,
    train_fixed: dict[str, Any] | None = None,
    fixed_by: dict[str, str] | None = None,
    preset_option: str | None = None,
    recipe: dict[str, Any] | None = None,
) -> tuple[ModelConfig, TrainConfig]:
    """preset (or base_model) < recipe (train/recipes.py) < config file < --set < plain options < model_fixed / train_fixed (what the
    command line and the data decide: a config file or --set that says otherwise is an error, never
    silently overridden; `fixed_by` names, per key, what decides it)."""
    file_settings = read_toml(config_file) if config_file is not None else {}
    file_preset = file_settings.pop("preset", None)
    if file_preset is not None and preset_option is not None and file_preset != preset_option:
        raise TfcliError(f"{config_file} asks for preset {file_preset!r} and --preset for {preset_option!r}", hint="keep one of them")
    preset_name = preset_option or file_preset or preset_name
    recipe_model, recipe_train = _split_settings(recipe or {}, "--recipe")
    file_model, file_train = _split_settings(file_settings, str(config_file))
    set_model, set_train = _split_settings(parse_sets(sets), "--set")
    for fixed, layers in (
        (model_fixed or {}, ((str(config_file), file_model), ("--set", set_model))),
        (train_fixed or {}, ((str(config_file), file_train), ("--set", set_train))),
    ):
        for key, value in fixed.items():
            for where, settings in layers:
                if key in settings and settings[key] != value:
                    decider = (fixed_by or {}).get(key, "this command")
                    raise TfcliError(f"{where} sets {key} = {settings[key]!r}, but {decider} decides it here ({value!r})", hint=f"drop {key} from {where}")
    option_model = {k[len("model.") :]: v for k, v in options.items() if k.startswith("model.") and v is not None}
    option_train = {k: v for k, v in options.items() if not k.startswith("model.") and v is not None}
    model_settings = {**recipe_model, **file_model, **set_model, **option_model, **(model_fixed or {})}
    if base_model is not None:
        model = base_model.with_overrides(**model_settings)
    else:
        model = preset(preset_name, **model_settings)
    train = TrainConfig.from_json({**recipe_train, **file_train, **set_train, **option_train, **(train_fixed or {})}, where="training config")
    return model, train


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The everyday options `train pretrain` and `train finetune` share, as the command line gave them (None or
    False: not given); the commands' signatures name them through the same option types (cli/train.py)."""

    max_steps: int | None = None
    time_budget: str | None = None  # 90s, 3m, 1h
    batch_size: int | None = None
    grad_accum: int | None = None
    lr: float | None = None
    optimizer: str | None = None  # adamw, muon
    schedule: str | None = None  # cosine, linear, constant, wsd
    seed: int | None = None
    save_every: int | None = None
    keep_every: int | None = None
    eval_every: int | None = None
    early_stop: int | None = None  # 0: never
    log_every: int | None = None
    device: str | None = None
    precision: str | None = None
    compile: bool = False
    fsdp: bool = False

    def settings(self, more: dict[str, Any] | None = None) -> dict[str, Any]:
        """The settings given, with `more` (a command's own options), the time budget in seconds."""
        given = {key: value for key, value in {**dataclasses.asdict(self), **(more or {})}.items() if value is not None and value is not False}
        if "time_budget" in given and "max_steps" in given:
            raise TfcliError("--max-steps and --time-budget do not go together: a budget sets the run's length", hint="pass one of them")
        if "time_budget" in given:
            given["time_budget"] = parse_duration(given["time_budget"])
        return given
