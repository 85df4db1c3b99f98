"""A run directory read without torch: config.json validated completely (unknown keys, types, absurd sizes),
the weights file named and its size and header checked, the tokenizer against the config. Loading the weights
is `tfcli.checkpoint`'s."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

from tfcli.adapters import ADAPTER_WEIGHTS_FILE, AdapterRecord, find_parent
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind
from tfcli.jsontext import loads_json
from tfcli.limits import read_text_capped
from tfcli.model.config import ModelConfig
from tfcli.quant.formats import block_format
from tfcli.schema import JsonRecord
from tfcli.tensorfile import weights_header_problem
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer
from tfcli.training_config import TrainConfig

CHECKPOINT_FORMAT = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclasses.dataclass
class RunConfig(JsonRecord):
    """config.json of a run directory."""

    format_version: int
    model: ModelConfig
    tokenizer_sha256: str
    weights_bytes: int
    tfcli_version: str = ""
    training: dict[str, Any] | None = None  # the resolved training config, for runs that were trained
    source: str | None = None  # where the weights came from (e.g. an imported GPT-2 folder)
    source_class: str | None = None  # the Hugging Face class they were imported from (e.g. LlamaForCausalLM)
    adapter: AdapterRecord | None = None  # an adapter run (LoRA): the weights are its parent's plus adapter_model.safetensors
    quantized: dict[str, str] | None = None  # a quantized run (`tfcli quantize`): tensor name -> block format (q8_0, q4_K, ...); others f32


@dataclasses.dataclass
class TrainingRecord(JsonRecord):
    """What config.json keeps under "training" for a trained run (`TrainingJob.training_record`; a section
    written by hand may hold only some of it, such as the labels). Read to check it; RunConfig keeps it as
    the plain dictionary the commands read."""

    config: TrainConfig | None = None
    task: str | None = None
    step: int | None = None
    labels: list[str] | None = None
    data: str | None = None
    val_data: str | None = None
    init_from: str | None = None
    val_loss: float | None = None  # the best checkpoint's validation loss
    fields: dict[str, str] | None = None  # classify / seq2seq: the data's names of text, label, source, target, where renamed
    recipe: str | None = None  # train pretrain: the --recipe its settings were laid over (classic, modern); --resume takes it


def _refuse_pickle(path: Path) -> None:
    if path.suffix in PICKLE_SUFFIXES:
        raise TfcliError(
            f"{path} is a pickle file; tfcli never loads pickle (it can run arbitrary code)",
            hint="convert it to safetensors with a tool you trust, or import a GPT-2 folder with `tfcli import`",
        )


def read_run_config(run_dir: Path) -> RunConfig:
    """Validate and return RUN/config.json without touching the weights."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        _refuse_pickle(run_dir)
        if run_dir.suffix.lower() == ".gguf":
            raise TfcliError(f"{run_dir} is a GGUF file, not a run directory", hint=f"import it first: tfcli import {run_dir} -o RUN")
        raise TfcliError(f"{run_dir} is a file, not a run directory", hint="pass the folder that holds config.json")
    if not run_dir.is_dir():
        raise TfcliError(f"run directory {run_dir} does not exist", hint="train one with `tfcli train pretrain` or import one with `tfcli import`")
    kind = artifact_kind(run_dir)
    if kind and kind != "a run directory":
        raise TfcliError(f"{run_dir} is {kind}, not a run directory", hint="pass a run made by `tfcli train` or `tfcli import`")
    if not (run_dir / WEIGHTS_FILE).is_file():
        pickles = sorted(p.name for p in run_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            _refuse_pickle(run_dir / pickles[0])
    if not (run_dir / CONFIG_FILE).is_file():
        if (run_dir / "cfg.json").is_file() and (run_dir / "sae_weights.safetensors").is_file():
            raise TfcliError(f"{run_dir} is a sparse autoencoder, not a run directory", hint=f"pass its model as the run and the SAE with --sae {run_dir}")
        runs = _runs_inside(run_dir)
        if runs:
            raise TfcliError(f"{run_dir} is not a run directory but holds runs", hint=f"pass one of them: {', '.join(str(run) for run in runs)}")
        raise TfcliError(f"{run_dir} has no {CONFIG_FILE}; it is not a tfcli run directory", hint="for a Hugging Face GPT-2 folder use `tfcli import`")
    _refuse_other_folders(run_dir)
    config = RunConfig.load(run_dir / CONFIG_FILE)
    if config.format_version != CHECKPOINT_FORMAT:
        raise TfcliError(f"{run_dir / CONFIG_FILE} has checkpoint format {config.format_version}; this tfcli reads {CHECKPOINT_FORMAT}")
    labels = (config.training or {}).get("labels")
    n_classes = config.model.n_classes
    if labels is not None and (
        not isinstance(labels, list) or not all(isinstance(name, str) for name in labels) or len(labels) != n_classes or len(set(labels)) != len(labels)
    ):
        raise TfcliError(
            f"{run_dir / CONFIG_FILE} has training.labels {json.dumps(labels)}, which is not a list of the {n_classes} distinct class names"
            if n_classes
            else f"{run_dir / CONFIG_FILE} has training.labels but no classifier",
            hint="fix it, or remove it to call the classes class 0, class 1, ...",
        )
    for name, kind in (config.quantized or {}).items():
        block_format(kind, where=f"{run_dir / CONFIG_FILE}: the type of {name}")
    if config.quantized and config.adapter is not None:
        raise TfcliError(f"{run_dir / CONFIG_FILE} names both quantized tensors and an adapter's parent", hint="restore the run's own config.json")
    if config.training is not None:
        try:
            TrainingRecord.from_json(config.training, where="training")
        except TfcliError as error:
            raise TfcliError(f"{run_dir / CONFIG_FILE}: {error.message}", hint="restore the run's own config.json, or remove the training section") from None
    return config


def refuse_other_artifacts(out_dir: Path, what: str) -> None:
    """A run or an exported model brings its own tokenizer.json and tokenizer_config.json: a folder that holds a
    tokenizer (`tfcli tokenize train`'s) or token shards is never written into, where they would be replaced or mixed."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return
    kind = artifact_kind(out_dir)
    if kind is None and any((out_dir / name).exists() for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE)):
        kind = "a folder with a tokenizer in it"
    if kind is not None:
        raise TfcliError(f"{out_dir} is {kind}; the {what} would write over it", hint="pass a new or empty folder with -o")


def _runs_inside(folder: Path, most: int = 5) -> list[Path]:
    """The run directories among FOLDER's first entries (`tfcli quickstart`'s runs/quickstart holds model/ and
    classifier/), to name when FOLDER itself is given as a run."""
    entries = sorted(itertools.islice(folder.iterdir(), 1000))
    weights = (WEIGHTS_FILE, ADAPTER_WEIGHTS_FILE)
    return [entry for entry in entries if (entry / CONFIG_FILE).is_file() and any((entry / name).is_file() for name in weights)][:most]


def _refuse_other_folders(run_dir: Path) -> None:
    """An exported or downloaded transformers folder has a config.json too, in another format; a word2vec run's
    holds word vectors, not a model (`tfcli.word2vec.run`)."""
    try:
        data = loads_json(read_text_capped(run_dir / CONFIG_FILE))
    except (OSError, ValueError):
        return  # RunConfig.load says what is wrong with it
    if isinstance(data, dict) and "format_version" not in data and ("model_type" in data or "architectures" in data):
        raise TfcliError(f"{run_dir} is a Hugging Face model folder, not a tfcli run directory", hint=f"import it first: tfcli import {run_dir} -o RUN")
    if isinstance(data, dict) and "word2vec" in data and "model" not in data:
        raise TfcliError(
            f"{run_dir} is a word2vec run: it holds word vectors, not a transformer this command can use",
            hint=f"look at the vectors with `tfcli inspect-embeddings {run_dir}`; `tfcli info {run_dir}` describes the run",
        )


def weights_path(run_dir: Path, config: RunConfig | None = None) -> Path:
    """The file that holds a run's own weights: model.safetensors, or adapter_model.safetensors for an adapter run."""
    config = config if config is not None else read_run_config(run_dir)
    return Path(run_dir) / (ADAPTER_WEIGHTS_FILE if config.adapter is not None else WEIGHTS_FILE)


def run_file_problems(run_dir: Path, config: RunConfig, tokenizer: TextTokenizer) -> list[TfcliError]:
    """What config.json says the weights file and the tokenizer should be and they are not (the weights are
    not read: their size is checked, the tokenizer's sha256 too), and for an adapter run a missing parent."""
    problems = []
    weights = weights_path(run_dir, config)
    if not weights.is_file():
        problems.append(TfcliError(f"{run_dir} has no {weights.name}", hint="use an intact run directory"))
    elif (size := weights.stat().st_size) != config.weights_bytes:
        problems.append(
            TfcliError(
                f"{weights} holds {size:,} bytes but {CONFIG_FILE} expects {config.weights_bytes:,}",
                hint="the checkpoint is truncated or from another save; use an intact run directory",
            )
        )
    elif (header := weights_header_problem(weights)) is not None:
        problems.append(header)
    if tokenizer.vocab_size > config.model.vocab_size:
        problems.append(
            TfcliError(
                f"{run_dir / TOKENIZER_FILE} has {tokenizer.vocab_size:,} tokens but the model's vocabulary only {config.model.vocab_size:,}",
                hint="use the tokenizer the model was trained with",
            )
        )
    elif tokenizer.sha256 != config.tokenizer_sha256:
        problems.append(
            TfcliError(
                f"{run_dir / TOKENIZER_FILE} is not the tokenizer this model was saved with (sha256 differs)", hint="restore the run's own tokenizer.json"
            )
        )
    if config.adapter is not None:
        try:
            find_parent(run_dir, config.adapter)
        except TfcliError as error:
            problems.insert(0, error)
    return problems
