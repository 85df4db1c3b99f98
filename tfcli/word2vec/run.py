"""A word2vec run directory: config.json (with a "word2vec" section where a transformer run has "model"),
model.safetensors (the input and output vector tables and each token's count in the training shards) and the
tokenizer, written atomically and read back with every check first, as `tfcli.checkpoint` does for a model."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tfcli import __version__
from tfcli.errors import TfcliError
from tfcli.fsutil import commit_staged, prepare_output_dir, stage_copy, stage_json, stage_written, staging
from tfcli.jsontext import loads_json
from tfcli.rundir import CHECKPOINT_FORMAT, CONFIG_FILE, WEIGHTS_FILE
from tfcli.schema import JsonRecord
from tfcli.tensorfile import read_tensors, weights_header_problem
from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer
from tfcli.word2vec.config import Word2VecConfig, Word2VecRecord

INPUT, OUTPUT, COUNTS = "input_vectors", "output_vectors", "counts"


@dataclasses.dataclass
class VectorsRunConfig(JsonRecord):
    """config.json of a word2vec run."""

    format_version: int
    word2vec: Word2VecConfig
    tokenizer_sha256: str
    weights_bytes: int
    tfcli_version: str = ""
    training: Word2VecRecord | None = None


@dataclasses.dataclass
class WordVectors:
    """A loaded word2vec run: the tables (V, dim) and counts (V,) as numpy arrays."""

    config: VectorsRunConfig
    tokenizer: TextTokenizer
    input_vectors: np.ndarray
    output_vectors: np.ndarray
    counts: np.ndarray
    path: Path


def is_word2vec_run(run_dir: Path) -> bool:
    """Whether RUN/config.json is a word2vec run's (told by its "word2vec" section; nothing else is checked)."""
    try:
        data = loads_json((Path(run_dir) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "word2vec" in data and "model" not in data


def save_vectors(
    run_dir: Path,
    config: Word2VecConfig,
    tokenizer: TextTokenizer,
    tables: dict[str, np.ndarray],
    training: Word2VecRecord | None,
    *,
    before_commit: Callable[[Path], None] | None = None,
    after_commit: Callable[[], None] | None = None,
) -> VectorsRunConfig:
    """Write RUN/config.json, RUN/model.safetensors and the tokenizer files, config.json last, each staged first:
    a crash leaves the previous save whole. `before_commit(staged_weights)` and `after_commit()` as in
    `checkpoint.save_checkpoint` (the trainer stages and swaps its state there)."""
    for name, table in tables.items():
        if not np.isfinite(table).all():
            raise TfcliError(f"the {name} hold non-finite values; not saving broken vectors", hint="lower --lr")
    run_dir = prepare_output_dir(Path(run_dir), "run")
    with staging() as staged:
        arrays = {name: np.ascontiguousarray(table) for name, table in tables.items()}
        weights_tmp = stage_written(run_dir / WEIGHTS_FILE, lambda tmp: save_file(arrays, str(tmp), metadata={"format": "np"}))
        staged.append((weights_tmp, run_dir / WEIGHTS_FILE))
        staged += [(stage_copy(origin, final), final) for origin, final in tokenizer.copies_into(run_dir)]
        run_config = VectorsRunConfig(CHECKPOINT_FORMAT, config, tokenizer.sha256, weights_tmp.stat().st_size, __version__, training)
        staged.append((stage_json(run_dir / CONFIG_FILE, run_config.to_json()), run_dir / CONFIG_FILE))
        if before_commit is not None:
            before_commit(weights_tmp)
    commit_staged(staged, then=after_commit)
    return run_config


def read_vectors_config(run_dir: Path) -> VectorsRunConfig:
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise TfcliError(f"{run_dir} has no {CONFIG_FILE}; it is not a run directory", hint="train one with `tfcli train pretrain --objective word2vec`")
    config = VectorsRunConfig.load(run_dir / CONFIG_FILE)
    if config.format_version != CHECKPOINT_FORMAT:
        raise TfcliError(f"{run_dir / CONFIG_FILE} has checkpoint format {config.format_version}; this tfcli reads {CHECKPOINT_FORMAT}")
    return config


def vectors_file_problems(run_dir: Path, config: VectorsRunConfig, tokenizer: TextTokenizer) -> list[TfcliError]:
    """What config.json says the weights file and the tokenizer should be and they are not."""
    problems = []
    weights = Path(run_dir) / WEIGHTS_FILE
    if not weights.is_file():
        problems.append(TfcliError(f"{run_dir} has no {WEIGHTS_FILE}", hint="use an intact run directory"))
    elif (size := weights.stat().st_size) != config.weights_bytes:
        problems.append(TfcliError(f"{weights} holds {size:,} bytes but {CONFIG_FILE} expects {config.weights_bytes:,}", hint="use an intact run directory"))
    elif (header := weights_header_problem(weights)) is not None:
        problems.append(header)
    if tokenizer.vocab_size != config.word2vec.vocab_size:
        problems.append(TfcliError(f"{run_dir / TOKENIZER_FILE} has {tokenizer.vocab_size:,} tokens but the vectors {config.word2vec.vocab_size:,}"))
    elif tokenizer.sha256 != config.tokenizer_sha256:
        problems.append(TfcliError(f"{run_dir / TOKENIZER_FILE} is not the tokenizer these vectors were saved with (sha256 differs)"))
    return problems


def load_vectors(run_dir: Path) -> WordVectors:
    """Load a word2vec run, checking the config, the tokenizer and every table (names, shapes, finite) first."""
    run_dir = Path(run_dir)
    config = read_vectors_config(run_dir)
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
    problems = vectors_file_problems(run_dir, config, tokenizer)
    if problems:
        raise problems[0]
    v, d = config.word2vec.vocab_size, config.word2vec.dim
    tables = read_tensors(run_dir / WEIGHTS_FILE, {INPUT: (v, d), OUTPUT: (v, d), COUNTS: (v,)})
    arrays = {name: tensor.numpy() for name, tensor in tables.items()}
    return WordVectors(config, tokenizer, arrays[INPUT].astype(np.float32), arrays[OUTPUT].astype(np.float32), arrays[COUNTS].astype(np.int64), run_dir)
