"""From a command line to a training job: the resolved model and training configs, the tokenizer, the data,
and the checks that must pass before anything is written (the output folder and --resume's: run_checks.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from tfcli.adapters.lora import check_rank
from tfcli.data.labeled import FIELD_OPTIONS, LabeledSet, field_names, load_labeled, split_validation
from tfcli.data.shards import load_shard_meta
from tfcli.errors import TfcliError, a_or_an
from tfcli.model.config import ModelConfig
from tfcli.rundir import read_run_config
from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer
from tfcli.train.chat import ChatFiles, chat_sets, chat_tokenizer, grown_vocabulary_note, install_chat_tokenizer
from tfcli.train.command_line import check_settings_apply, resolve_configs
from tfcli.train.fingerprint import digest, file_fingerprint, shard_fingerprint
from tfcli.train.optim import lr_factor
from tfcli.train.recipes import recipe_settings
from tfcli.train.run_checks import check_output, check_resumed, check_resumed_finetune
from tfcli.train.state import find_trainer_state
from tfcli.training_config import PRETRAIN_TASK, TrainConfig

DEFAULT_PRESET = {"decoder": "tiny", "encoder": "tiny", "encoder-decoder": "seq2seq-tiny"}
LABELED_TASKS = ("classify", "seq2seq")
CHAT_TASKS = ("chat", "instruct")
MUON_WITHOUT_MATRICES = "--optimizer muon trains the weight matrices inside the blocks, which --freeze body freezes: AdamW trains the classification head alone"


@dataclasses.dataclass(frozen=True)
class TrainingJob:
    """What every run is made of, resolved and checked before anything is written. A job is one of the variants
    below (the data differs per task); this base alone is the draft a fine-tune's variant is built from."""

    run_dir: Path
    model_config: ModelConfig
    config: TrainConfig
    tokenizer: TextTokenizer
    data: Path
    val_data: Path | None = None
    init_from: Path | None = None
    resume: bool = False
    data_fingerprint: str = ""
    notes: tuple[str, ...] = ()  # said when training starts
    log_to: tuple[str, ...] = ()  # experiment trackers beside metrics.jsonl (tracking.py)
    recipe: str | None = None  # train pretrain: the --recipe laid under the settings (recorded: --resume takes the run's own)

    @property
    def title(self) -> str:
        """What the loss curve's title says the run is."""
        return f"{self.config.task}, {self.model_config.arch}"

    @property
    def block_size(self) -> int:
        return self.config.block_size or self.model_config.block_size

    def training_record(self, step: int) -> dict[str, Any]:
        """What config.json keeps under "training"."""
        return {
            "config": self.config.to_json(),
            "task": self.config.task,
            "labels": self.config.labels,
            "data": str(self.data),
            "val_data": str(self.val_data) if self.val_data else None,
            "init_from": str(self.init_from) if self.init_from else None,
            "step": step,
            **({"recipe": self.recipe} if self.recipe else {}),
        }

    def variant(self, kind: type[Job], **changes: Any) -> Job:
        """This job's common fields, with `changes`, as `kind` (which adds its own)."""
        common = {field.name: getattr(self, field.name) for field in dataclasses.fields(TrainingJob)}
        return kind(**(common | changes))


@dataclasses.dataclass(frozen=True)
class ShardJob(TrainingJob):
    """lm / mlm / denoise: windows of the token shards in `data`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabeledJob(TrainingJob):
    """classify / seq2seq: examples read from a labeled set (JSON lines, CSV, Parquet ...)."""

    train_set: LabeledSet
    val_set: LabeledSet
    fields: dict[str, str] | None = None  # fields of the data renamed (--text-field ...)

    def training_record(self, step: int) -> dict[str, Any]:
        return {**super().training_record(step), **({"fields": self.fields} if self.fields else {})}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatJob(TrainingJob):
    """chat / instruct: conversations rendered with a chat template, which the run's tokenizer keeps."""

    train_set: LabeledSet
    val_set: LabeledSet
    tokenizer_files: ChatFiles  # the run's tokenizer.json and tokenizer_config.json


Job = TypeVar("Job", bound=TrainingJob)


def find_tokenizer(shard_dir: Path, explicit: Path | None) -> TextTokenizer:
    """--tokenizer if given, else the tokenizer.json whose checksum the shards name: inside or beside the
    shards' folder, or where it was when they were encoded."""
    meta = load_shard_meta(shard_dir)
    if explicit is not None:
        tokenizer = TextTokenizer.load(explicit)
        if tokenizer.sha256 != meta.tokenizer_sha256:
            raise TfcliError(
                f"the shards in {shard_dir} were encoded with another tokenizer than {explicit}",
                hint="pass the tokenizer the shards were made with, or re-encode them",
            )
        return tokenizer
    recorded = [Path(meta.tokenizer_path)] if meta.tokenizer_path else []
    for candidate in (shard_dir / TOKENIZER_FILE, shard_dir.parent / "tokenizer" / TOKENIZER_FILE, shard_dir.parent / TOKENIZER_FILE, *recorded):
        if candidate.is_file():
            tokenizer = TextTokenizer.load(candidate)
            if tokenizer.sha256 == meta.tokenizer_sha256:
                return tokenizer
    raise TfcliError(f"cannot find the tokenizer the shards in {shard_dir} were encoded with", hint="pass it with --tokenizer PATH")


def pretrain_job(
    *,
    data: Path,
    output: Path,
    arch: str | None,
    preset_name: str | None,
    config_file: Path | None,
    sets: list[str],
    options: dict[str, Any],
    tokenizer_path: Path | None,
    resume: bool,
    log_to: tuple[str, ...] = (),
    recipe: str | None = None,
) -> ShardJob:
    """`recipe` (classic, modern: train/recipes.py) lays its settings under the config file's; None is classic."""
    meta = load_shard_meta(data)
    recipe = recipe or "classic"
    recipe_layer = recipe_settings(recipe)
    tokenizer = find_tokenizer(data, tokenizer_path)
    if arch is None:  # no --arch: the architecture the settings describe (--set, the file, the preset), else a decoder
        arch = resolve_configs(
            preset_name=DEFAULT_PRESET["decoder"],
            preset_option=preset_name,
            config_file=config_file,
            sets=sets,
            options={},
            recipe=recipe_layer,
            model_fixed={"vocab_size": tokenizer.vocab_size},
            fixed_by={"vocab_size": "the tokenizer"},
        )[0].arch
    if arch not in PRETRAIN_TASK:
        raise TfcliError(f"unknown architecture {arch!r}", hint=f"use one of {', '.join(PRETRAIN_TASK)}")
    task = PRETRAIN_TASK[arch]
    if options.get("task") not in (None, task):
        raise TfcliError(f"{a_or_an(arch)} pretrains with the {task} objective, not {options['task']}")
    model_config, config = resolve_configs(
        preset_name=DEFAULT_PRESET[arch],
        preset_option=preset_name,
        config_file=config_file,
        sets=sets,
        options=options,
        recipe=recipe_layer,
        model_fixed={"vocab_size": tokenizer.vocab_size, "arch": arch},
        train_fixed={"task": task},
        fixed_by={"vocab_size": "the tokenizer", "arch": "--arch", "task": f"{a_or_an(arch)}'s pretraining objective"},
    )
    check_settings_apply(config, finetune=False)
    if model_config.n_classes:
        raise TfcliError(
            "pretraining does not train a classification head (n_classes)",
            hint="pretrain without n_classes, then `tfcli train finetune --task classify` adds and trains the head",
        )
    if meta.vocab_size != tokenizer.vocab_size:
        raise TfcliError(f"the shards hold ids for {meta.vocab_size:,} tokens but the tokenizer has {tokenizer.vocab_size:,}")
    _check_block(config, model_config, finetune=False)
    _require_roles(tokenizer, task)
    job = ShardJob(output, model_config, config, tokenizer, data, resume=resume, data_fingerprint=shard_fingerprint(data), log_to=tuple(log_to), recipe=recipe)
    check_output(output, resume)
    if resume:
        check_resumed(job)
        job = continued_schedule(job)
    return job


def finetune_job(
    *,
    init_from: Path,
    task: str,
    data: Path,
    val_data: Path | None,
    output: Path,
    config_file: Path | None,
    sets: list[str],
    options: dict[str, Any],
    resume: bool,
    fields: dict[str, str] | None = None,
    chat_template: Path | None = None,
    log_to: tuple[str, ...] = (),
) -> TrainingJob:
    """`fields` renames the fields of a labeled set (role -> name in the data, e.g. {"label": "stars"})."""
    fields = _check_fields(task, fields)
    parent, tokenizer = _read_parent(init_from, output, task)
    model_config, config = _finetune_configs(parent.model, task, config_file=config_file, sets=sets, options=options, val_data=val_data)
    _check_block(config, model_config, finetune=True)
    _require_roles(tokenizer, task)
    if chat_template is not None and task not in CHAT_TASKS:
        raise TfcliError(f"--chat-template applies to --task chat and instruct, not {task}")
    notes = (MUON_WITHOUT_MATRICES,) if config.optimizer == "muon" and config.freeze == "body" else ()
    draft = TrainingJob(
        output, model_config, config, tokenizer, data, val_data=val_data, init_from=Path(init_from), resume=resume, notes=notes, log_to=tuple(log_to)
    )
    if task in CHAT_TASKS:
        job: TrainingJob = _chat_job(draft, chat_template)
    elif task in LABELED_TASKS:
        job = _labeled_job(draft, fields)
    else:
        job = _shard_job(draft)
    if config.lora_rank is not None:
        check_rank(job.model_config, config.lora_rank, config.lora_groups)
    check_output(output, resume)
    if isinstance(job, ChatJob):  # the run's own tokenizer from now on
        job = dataclasses.replace(job, tokenizer=install_chat_tokenizer(job.run_dir, job.tokenizer_files, resume))
    if resume:
        check_resumed_finetune(job, Path(init_from), data)
        job = continued_schedule(job)
    return job


def continued_schedule(job: TrainingJob) -> TrainingJob:
    """A resumed run keeps its learning-rate schedule. With another --max-steps the decay goes on from the step
    the run stopped at, at the rate it had there, to the new last step (`decay_restart`), instead of being laid
    out again over the new length (which would send the rate back up); `resume_schedule` "stretch" lays it out
    again. Either way a note says what the rate does and how to choose the other. With the same length a
    restart an earlier resume set is kept. A time budget lays the schedule over the budget, as it always does."""
    before = TrainConfig.from_json((read_run_config(job.run_dir).training or {}).get("config") or {})
    now = job.config
    if now.time_budget is not None or before.time_budget is not None:
        return job
    if now.max_steps == before.max_steps:
        return dataclasses.replace(job, config=dataclasses.replace(now, decay_restart=before.decay_restart))
    _, state = find_trainer_state(job.run_dir)
    step, was = state.step, lr_factor(before, state.step)
    restart = None if now.resume_schedule == "stretch" else [step, was]
    config = dataclasses.replace(now, decay_restart=restart)
    if step >= config.max_steps or 0 < config.patience <= state.evals_since_best:  # no step to train: nothing to say
        return dataclasses.replace(job, config=config)
    return dataclasses.replace(job, config=config, notes=(*job.notes, _schedule_note(before, config, step, was)))


def _schedule_note(before: TrainConfig, now: TrainConfig, step: int, was: float) -> str:
    """What the learning rate does over the steps a resume with another --max-steps adds, and the other choice.
    Example: "the run finished its learning-rate schedule at step 40, so its 40 more steps train at the floor rate,
    1.00e-04; --set resume_schedule=stretch lays the schedule over all 80 steps instead (5.68e-04 at step 40)" """
    new, rate = now.max_steps, f"{now.lr * was:.2e}"
    if now.decay_restart is None:
        return (
            f"resume_schedule stretch: the schedule is laid over all {new} steps, so the rate goes from {rate} at step {step} to "
            f"{now.lr * lr_factor(now, step):.2e}; without it the rate would go on from {rate}"
        )
    stretched = dataclasses.replace(now, decay_restart=None)
    other = f"--set resume_schedule=stretch lays the schedule over all {new} steps instead ({now.lr * lr_factor(stretched, step):.2e} at step {step})"
    if was <= now.min_lr_ratio + 1e-9:
        return f"the run finished its learning-rate schedule at step {step}, so its {new - step} more steps train at the floor rate, {rate}; {other}"
    floor = now.lr * min(now.min_lr_ratio, was)
    return f"--max-steps {new} (was {before.max_steps}): the learning rate goes on from {rate} at step {step} down to {floor:.2e} at step {new}; {other}"


def _check_fields(task: str, fields: dict[str, str] | None) -> dict[str, str]:
    """Renamed fields (--text-field ...) only for the labeled tasks, and only the fields the task reads."""
    fields = dict(fields or {})
    if fields and task not in LABELED_TASKS:
        raise TfcliError(f"{FIELD_OPTIONS[next(iter(fields))]} applies to --task classify and seq2seq, not {task}", hint=f"--task {task} reads shards")
    if fields:
        field_names(task, fields)  # refuses a field the task does not read
    return fields


def _read_parent(init_from: Path, output: Path, task: str):
    """The run being fine-tuned (its config and tokenizer), once it is known to be another folder, whole, and of an
    architecture the task can train."""
    if Path(output).resolve() == Path(init_from).resolve():
        raise TfcliError("-o is the run being fine-tuned", hint="write the fine-tuned run to a new folder")
    parent = read_run_config(init_from)
    tokenizer = TextTokenizer.load(Path(init_from) / TOKENIZER_FILE)
    if tokenizer.sha256 != parent.tokenizer_sha256:
        raise TfcliError(f"{init_from}/{TOKENIZER_FILE} is not the tokenizer its model was saved with")
    arch = parent.model.arch
    allowed = {"lm": ("decoder",), "mlm": ("encoder",), "classify": ("encoder", "decoder"), "seq2seq": ("encoder-decoder",), "denoise": ("encoder-decoder",)}
    allowed |= {"chat": ("decoder",), "instruct": ("decoder",)}
    if arch not in allowed[task]:
        own = PRETRAIN_TASK[arch]
        raise TfcliError(
            f"--task {task} needs {' or '.join(a_or_an(a) for a in allowed[task])} model; {init_from} is {a_or_an(arch)}",
            hint=f"continue its pretraining with --task {own}" if task in PRETRAIN_TASK.values() else None,
        )
    return parent, tokenizer


def _finetune_configs(
    parent_model: ModelConfig, task: str, *, config_file: Path | None, sets: list[str], options: dict[str, Any], val_data: Path | None
) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configs of a fine-tune: the parent's shape (only dropout may change), the settings given."""
    model_config, config = resolve_configs(
        preset_name="",
        config_file=config_file,
        sets=sets,
        options=options,
        train_fixed={"task": task},
        fixed_by={"task": "--task"},
        base_model=dataclasses.replace(parent_model, n_classes=0 if task == "classify" else parent_model.n_classes),
    )
    if model_config.n_classes != (0 if task == "classify" else parent_model.n_classes):
        raise TfcliError("fine-tuning does not take n_classes as a setting", hint="--task classify sizes the classification head from the labels in --data")
    changed = [
        f.name
        for f in dataclasses.fields(ModelConfig)
        if f.name not in ("dropout", "n_classes") and getattr(model_config, f.name) != getattr(parent_model, f.name)
    ]
    if changed:
        raise TfcliError(f"fine-tuning cannot change the model's {changed[0]}", hint="only dropout may change; the shape comes from --init-from")
    check_settings_apply(config, finetune=True, val_data=val_data is not None)
    return model_config, config


def _labeled_job(draft: TrainingJob, fields: dict[str, str]) -> LabeledJob:
    """classify / seq2seq: the train and validation sets, a classifier's labels and head, the data's fingerprint."""
    task, data, val_data, config, model_config = draft.config.task, draft.data, draft.val_data, draft.config, draft.model_config
    block = draft.block_size
    train_set, labels = load_labeled(data, task, draft.tokenizer, model_config.arch, block, labels=None, fields=fields)
    if val_data is not None:
        val_set, _ = load_labeled(val_data, task, draft.tokenizer, model_config.arch, block, labels=labels, fields=fields)
    else:
        train_set, val_set = split_validation(train_set, config.val_fraction, config.seed)
    if task == "classify":
        config = dataclasses.replace(config, labels=labels)
        # A BERT classifier reads its pooler; one a masked-LM BERT lacks starts fresh, as transformers does.
        bert = model_config.arch == "encoder" and model_config.embedding_norm and model_config.type_vocab_size > 0
        model_config = dataclasses.replace(model_config, n_classes=len(labels), pooler=model_config.pooler or bert)
    # renamed fields read other examples from the same bytes, so they are part of the data's identity
    fingerprint = file_fingerprint(data, val_data) if not fields else digest([file_fingerprint(data, val_data), fields])
    return draft.variant(
        LabeledJob, config=config, model_config=model_config, data_fingerprint=fingerprint, train_set=train_set, val_set=val_set, fields=fields or None
    )


def _chat_job(draft: TrainingJob, template_file: Path | None) -> ChatJob:
    """chat / instruct: the parent's tokenizer with the template (grown where needed), the model's vocabulary,
    the conversations, the notes. Nothing is written here (`install_chat_tokenizer` does that)."""
    assert draft.init_from is not None
    chat = chat_tokenizer(draft.init_from, draft.tokenizer, template_file)
    model_config, notes = draft.model_config, list(draft.notes)
    if chat.tokenizer.vocab_size > model_config.vocab_size:
        notes.append(grown_vocabulary_note(chat, model_config.vocab_size, model_config.tie_embeddings))
        model_config = dataclasses.replace(model_config, vocab_size=chat.tokenizer.vocab_size)
    config = draft.config
    sets = chat_sets(chat.template, config.task, draft.data, draft.val_data, draft.block_size, val_fraction=config.val_fraction, seed=config.seed)
    return draft.variant(
        ChatJob,
        tokenizer=chat.tokenizer,
        model_config=model_config,
        notes=(*notes, *sets.notes),
        data_fingerprint=digest([file_fingerprint(draft.data, draft.val_data), chat.source]),
        train_set=sets.train_set,
        val_set=sets.val_set,
        tokenizer_files=chat.files,
    )


def _shard_job(draft: TrainingJob) -> ShardJob:
    """lm / mlm / denoise: shards encoded with the parent's tokenizer; their fingerprint."""
    meta = load_shard_meta(draft.data)
    if meta.tokenizer_sha256 != draft.tokenizer.sha256:
        raise TfcliError(
            f"the shards in {draft.data} were encoded with another tokenizer than {draft.init_from}'s",
            hint=f"re-encode them with `tfcli tokenize encode ... --tokenizer {draft.init_from}/{TOKENIZER_FILE}`",
        )
    return draft.variant(ShardJob, data_fingerprint=shard_fingerprint(draft.data))


def _check_block(config: TrainConfig, model_config: ModelConfig, *, finetune: bool) -> None:
    if config.block_size is not None and config.block_size > model_config.block_size:
        if finetune:
            raise TfcliError(
                f"--block-size {config.block_size} is longer than the model's context ({model_config.block_size})",
                hint="a fine-tune keeps its parent's context; use a smaller block size",
            )
        raise TfcliError(
            f"training windows of {config.block_size} tokens (train.block_size) are longer than the model's context ({model_config.block_size})",
            hint="set the context with --block-size, which sizes both",
        )
    if config.task == "classify" and model_config.arch == "encoder-decoder":
        raise TfcliError("classification needs an encoder or a decoder model")


def _require_roles(tokenizer: TextTokenizer, task: str) -> None:
    roles = {
        "lm": ("eos",),
        "mlm": ("mask", "cls"),
        "denoise": ("mask", "pad", "eos"),
        "classify": ("pad",),
        "seq2seq": ("pad", "eos"),
        "chat": (),
        "instruct": (),
    }
    for role in roles[task]:
        tokenizer.require(role)
