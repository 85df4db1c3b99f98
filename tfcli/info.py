"""`tfcli info`: what a run directory holds, from its config and tokenizer (the weights are not loaded)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from tfcli.jsontext import loads_json
from tfcli.model.config import ModelConfig
from tfcli.rundir import read_run_config, run_file_problems, weights_path
from tfcli.tokenizer.core import TOKENIZER_FILE, TextTokenizer
from tfcli.word2vec.run import is_word2vec_run, read_vectors_config, vectors_file_problems

METRICS_FILE = "metrics.jsonl"
# Imported classes whose checkpoints have no masked-LM head: tfcli's encoder got a fresh one, which
# transformers' count of the class leaves out.
HEADLESS_CLASSES = ("BertModel", "BertForSequenceClassification")


def source_parameters(model: ModelConfig, source_class: str | None) -> int | None:
    """The parameter count of the imported model as transformers counts its class (shared tensors once)."""
    if source_class is None:
        return None
    total = model.parameter_estimate()
    if source_class in HEADLESS_CLASSES:
        d = model.d_model
        total -= d * d + d + 2 * d + model.vocab_size + (0 if model.tie_embeddings else model.vocab_size * d)
    return total


def run_info(run_dir: Path) -> dict[str, Any]:
    """Config, parameters by part, memory, KV-cache cost per token, tokenizer, training history, and what is
    wrong with the weights file or the tokenizer (`problems`, empty for an intact run)."""
    run_dir = Path(run_dir)

    if is_word2vec_run(run_dir):
        return vectors_info(run_dir)
    config = read_run_config(run_dir)
    model = config.model
    counts = model.parameter_counts()
    total = sum(counts.values())
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
    weights = weights_path(run_dir, config)
    info: dict[str, Any] = {
        "run": str(run_dir),
        "model": model.to_json(),
        "parameters": {"total": total, **counts},
        "weights_bytes": {"fp32": total * 4, "bf16": total * 2, "file": weights.stat().st_size if weights.is_file() else 0},
        "kv_cache_bytes_per_token": {
            "fp32": model.kv_cache_bytes_per_token(4),
            "bf16": model.kv_cache_bytes_per_token(2),
            "multi_head_equivalent_bf16": 2 * model.decoder_layers * model.n_heads * model.head_dim * 2 if model.has_decoder else 0,
            "kv_heads": model.kv_heads,
            "query_heads": model.n_heads,
            # an encoder-decoder also caches every decoder layer's cross-attention keys/values of the source
            "cross_attention_per_source_token_bf16": model.kv_cache_bytes_per_token(2) if model.arch == "encoder-decoder" else 0,
        },
        "tokenizer": _tokenizer_info(tokenizer),
        "source": config.source,
        "source_class": config.source_class,
        "source_parameters": source_parameters(model, config.source_class),
        "tfcli_version": config.tfcli_version,
        "training": config.training,
        "history": training_history(run_dir / METRICS_FILE),
        "problems": [problem.message for problem in run_file_problems(run_dir, config, tokenizer)],
        "adapter": adapter_info(model, config.adapter),
        "quantized": dict(sorted(Counter((config.quantized or {}).values()).items())),  # block type -> tensors held in it
    }
    return info


def _tokenizer_info(tokenizer: TextTokenizer) -> dict[str, Any]:
    return {
        "vocab_size": tokenizer.vocab_size,
        "model": tokenizer.family,
        "pre_tokenizer": tokenizer.pre_tokenizer_kind,
        "special_tokens": {role: tokenizer.hf.id_to_token(i) for role, i in tokenizer.special_ids.items()},
        "sha256": tokenizer.sha256,
    }


def vectors_info(run_dir: Path) -> dict[str, Any]:
    """A word2vec run: its vectors and objective, parameters, tokenizer, training and history, problems."""
    config = read_vectors_config(run_dir)
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
    vectors = config.word2vec
    weights = run_dir / "model.safetensors"
    total = 2 * vectors.vocab_size * vectors.dim
    return {
        "run": str(run_dir),
        "word2vec": vectors.to_json(),
        "parameters": {"total": total, "input_vectors": total // 2, "output_vectors": total // 2},
        "weights_bytes": {"fp32": total * 4, "file": weights.stat().st_size if weights.is_file() else 0},
        "tokenizer": _tokenizer_info(tokenizer),
        "tfcli_version": config.tfcli_version,
        "training": config.training.to_json() if config.training else None,
        "history": training_history(run_dir / METRICS_FILE),
        "problems": [problem.message for problem in vectors_file_problems(run_dir, config, tokenizer)],
    }


def adapter_info(model: ModelConfig, record) -> dict[str, Any] | None:
    """An adapter run's LoRA: rank, alpha, layers, the parameters it trains, and its parent (None for a full run)."""
    if record is None:
        return None
    from tfcli.adapters.lora import expected_adapter_shapes  # noqa: PLC0415  torch (a meta-device model) for adapter runs only: info stays torch-free

    parameters = sum(math.prod(shape) for shape in expected_adapter_shapes(model, record).values())
    return {
        "kind": record.kind,
        "rank": record.rank,
        "alpha": record.alpha,
        "dropout": record.dropout,
        "targets": record.targets,
        "layers": len(record.modules),
        "modules_to_save": record.modules_to_save,
        "parameters": parameters,
        "parent": record.parent,
        "parent_path": record.parent_path,
    }


TAIL_BYTES = 4 << 20  # a metrics file larger than this is summarised from its first line and its last 4 MB


def training_history(path: Path) -> dict[str, Any] | None:
    """A summary of metrics.jsonl: records logged, the first and last step, last and best losses. A file of
    gigabytes is not read whole: its first record and the records in its last TAIL_BYTES are (`tail_only`;
    `records` then counts those read, and the best validation loss is the best among them)."""
    if not path.is_file():
        return None
    size = path.stat().st_size
    tail_only = size > 2 * TAIL_BYTES
    with open(path, "rb") as handle:
        if tail_only:
            lines = [handle.readline(TAIL_BYTES)]  # a file of NUL bytes (a crash, a sparse file) has no first line to stop at
            handle.seek(size - TAIL_BYTES)
            lines += handle.read().split(b"\n")[1:]  # the first piece is the end of a line cut by the seek
        else:
            lines = handle.read().split(b"\n")
    records = []
    for line in lines:
        line = line.strip()
        if line:
            try:
                record = loads_json(line, finite=False)  # non-finite losses are passed over below
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict):  # anything else is not a metrics record
                records.append(record)
    if not records:
        return None

    def finite(key: str) -> list[float]:
        return [r[key] for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]

    steps = [r.get("step") for r in records if isinstance(r.get("step"), int)]
    train, val = finite("loss"), finite("val_loss")
    return {
        "records": len(records),
        "tail_only": tail_only,
        "file_bytes": size,
        "first_step": min(steps) if steps else None,
        "last_step": max(steps) if steps else None,
        "last_loss": train[-1] if train else None,
        "best_val_loss": min(val) if val else None,
        "tokens_seen": max((r.get("tokens", 0) for r in records if isinstance(r.get("tokens"), int)), default=None),
    }
