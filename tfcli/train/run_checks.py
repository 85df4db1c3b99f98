"""The checks on a training run's folder before anything is written: a new run never mixes with other files or
writes over a run, and a resumed run is the run it continues (same model, tokenizer, data, settings and parent)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.adapters import find_parent
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind, prepare_output_dir, refuse_non_utf8_path
from tfcli.rundir import CONFIG_FILE, read_run_config
from tfcli.training_config import RESUMABLE_CHANGES

if TYPE_CHECKING:
    from tfcli.train.job import TrainingJob

# What a run that stopped before its first checkpoint can leave; such a folder may be trained into again.
RUN_LEFTOVERS = {"metrics.jsonl", "loss.png", "trainer", "trainer.next", "best", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
RUN_LEFTOVERS |= {"adapter_model.safetensors", "adapter_config.json"}  # a LoRA run's
RUN_LEFTOVERS |= {"data"}  # `train pretrain --data TEXT`: the tokenizer and shards it made


def refuse_existing_run(run_dir: Path) -> None:
    """A new run never writes over a finished or running one."""
    if (run_dir / CONFIG_FILE).exists():
        raise TfcliError(f"{run_dir} already holds a run", hint="pass --resume to continue it, or choose another -o")


def check_output(run_dir: Path, resume: bool) -> None:
    """A new run's folder is new, empty or what a stopped run left (and is made here); --resume's holds a run."""
    refuse_non_utf8_path(run_dir)
    if resume:
        if not (run_dir / CONFIG_FILE).is_file():
            raise TfcliError(f"{run_dir} holds no run to resume", hint="drop --resume to start a new run there")
        return
    if run_dir.exists() and run_dir.is_dir():
        refuse_existing_run(run_dir)
        kind = artifact_kind(run_dir)
        if kind:
            raise TfcliError(f"{run_dir} is {kind}; a run would write over it", hint="choose a new or empty folder with -o")
        foreign = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith(".") and p.name not in RUN_LEFTOVERS)
        if foreign:
            raise TfcliError(
                f"{run_dir} holds files that are not a run's ({foreign[0]!r}); a run would mix with them", hint="choose a new or empty folder with -o"
            )
    prepare_output_dir(run_dir, "run")


def check_resumed(job: TrainingJob) -> None:
    """A resumed run must be the run it continues: same model, tokenizer, data, and training settings
    (except those in RESUMABLE_CHANGES)."""
    saved = read_run_config(job.run_dir)
    recipe = (saved.training or {}).get("recipe")
    if recipe is not None and job.recipe is not None and recipe != job.recipe:
        raise TfcliError(f"cannot resume: the run was trained with --recipe {recipe}, not {job.recipe}", hint="leave --recipe out to go on with the run's own")
    saved_model, now_model = saved.model.to_json(), job.model_config.to_json()
    for key in saved_model:
        if saved_model[key] != now_model.get(key):
            raise TfcliError(
                f"cannot resume: the model's {key} was {saved_model[key]!r}, now {now_model.get(key)!r}",
                hint=f"pass --arch {saved_model[key]}" if key == "arch" else "resume with the settings the run was started with",
            )
    if saved.tokenizer_sha256 != job.tokenizer.sha256:
        raise TfcliError("cannot resume: the tokenizer differs from the run's", hint="resume with the data and tokenizer the run was started with")
    training = saved.training or {}
    before = training.get("config") or {}
    now = job.config.to_json()
    for key in now:
        if key in RESUMABLE_CHANGES or key not in before:
            continue
        if before[key] != now[key]:
            raise TfcliError(
                f"cannot resume: the training setting {key} was {before[key]!r}, now {now[key]!r}",
                hint=f"pass the run's own value ({_as_option(key, before[key])}); only {', '.join(RESUMABLE_CHANGES)} may change on --resume",
            )


def run_recipe(run_dir: Path) -> str | None:
    """The --recipe a pretraining run recorded (None: no run there, or one made before runs recorded it)."""
    if not (Path(run_dir) / CONFIG_FILE).is_file():
        return None
    recipe = (read_run_config(run_dir).training or {}).get("recipe")
    return recipe if isinstance(recipe, str) else None


def _as_option(key: str, value) -> str:
    """A training setting as the command line gives it. Example: ("batch_size", 32) -> "--set batch_size=32" """
    shown = str(value).lower() if isinstance(value, bool) else value
    return f"--set {key}={shown}"


def check_resumed_finetune(job: TrainingJob, init_from: Path, data: Path) -> None:
    """A resumed fine-tune: on the same parent, with the same labels (classify), and nothing else changed."""
    _check_parent(job.run_dir, init_from)
    saved_labels = _saved_labels(job.run_dir)
    if job.config.task == "classify" and saved_labels != job.config.labels:
        raise TfcliError(f"cannot resume: the labels in {data} differ from the run's ({', '.join(saved_labels or [])})")
    check_resumed(job)


def _check_parent(run_dir: Path, init_from: Path) -> None:
    """A resumed adapter run continues on the parent it was trained on, which --init-from names."""
    record = read_run_config(run_dir).adapter
    if record is not None and find_parent(run_dir, record).resolve() != init_from.resolve():
        raise TfcliError(
            f"cannot resume: the run is an adapter on {record.parent_path}, not on {init_from}", hint="resume with the --init-from it was started with"
        )


def _saved_labels(run_dir: Path) -> list[str] | None:
    training = read_run_config(run_dir).training or {}
    labels = training.get("labels")
    return labels if isinstance(labels, list) else None
