"""`tfcli eval`: a run's loss, perplexity and bits per byte on shards or text, or its accuracy and macro-F1
on a labeled set (JSON lines, CSV or Parquet). Language-model evaluation covers the data with back-to-back windows, every
token scored once."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tfcli.corpus.documents import iter_document_pieces
from tfcli.corpus.formats import RECORD_FORMATS, format_of_name
from tfcli.corpus.reader import ReadStats, resolve_corpus
from tfcli.data.chat import encode_conversations, read_conversations
from tfcli.data.labeled import load_labeled
from tfcli.data.shards import load_shard_meta, open_shard
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind
from tfcli.limits import TEXT_TOKENS
from tfcli.loader import load_run
from tfcli.tokenizer.chat_template import ChatTemplate
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE
from tfcli.train import data as d
from tfcli.train.chat import ChatSource
from tfcli.train.objectives import evaluate
from tfcli.train.setup import check_token_ids, pick_device, token_byte_lengths
from tfcli.training_config import TrainConfig


def _text_tokens(path: Path, tokenizer) -> np.ndarray:
    """A text file (or a folder of them) as one token stream, documents (paragraphs) ended by [eos]; held in
    memory, so at most TEXT_TOKENS tokens (a larger text is encoded into shards, which are read from disk)."""
    eos, cap = tokenizer.require("eos"), TEXT_TOKENS.value
    chunks: list[np.ndarray] = []
    held = 0
    pieces = iter_document_pieces(resolve_corpus([path]), "paragraph", ReadStats())
    while batch := list(itertools.islice(pieces, 1024)):
        ids: list[int] = []
        for piece, piece_ids in zip(batch, tokenizer.encode_batch([p.text for p in batch])):
            ids.extend(piece_ids)
            if piece.ends_document:
                ids.append(eos)
        held += len(ids)
        if held > cap:
            raise TfcliError(
                f"{path} holds more than {cap:,} tokens, the limit on {TEXT_TOKENS.what}",
                hint=f"encode it into shards (tfcli tokenize encode), which are read from disk; or {TEXT_TOKENS.how_to_raise()}",
            )
        chunks.append(np.asarray(ids, dtype=np.int64))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)


def evaluate_run(
    run: Path, data: Path, *, split: str = "val", batch_size: int = 16, max_batches: int | None = None, device: str = "auto", seed: int = 0
) -> dict[str, Any]:
    target = pick_device(device)
    checkpoint = load_run(run, "evaluate", str(target))
    tokenizer, config, model = checkpoint.tokenizer, checkpoint.config.model, checkpoint.model
    data = Path(data)
    result: dict[str, Any] = {"run": str(run), "data": str(data)}
    if split != "val" and not (data.is_dir() and (data / "meta.json").is_file()):
        raise TfcliError(
            f"--split {split} chooses a split of a shard folder, and {data} is not one", hint="drop --split: a text file or a labeled set is scored whole"
        )
    if format_of_name(data.name)[0] in RECORD_FORMATS and not artifact_kind(data):  # not meta.json of shards, say
        task, batches = _labeled_batches(checkpoint, run, data, batch_size, max_batches, seed, result)
    else:
        task, batches = _text_batches(checkpoint, run, data, split, batch_size, max_batches, seed, result)
    byte_lengths = token_byte_lengths(tokenizer, config.vocab_size) if task == "lm" else None
    metrics = evaluate(model, batches, task, target, contextlib.nullcontext, byte_lengths)
    result["task"] = task
    result.update({k.removeprefix("val_"): v for k, v in metrics.items()})
    return result


def _labeled_batches(checkpoint, run: Path, data: Path, batch_size: int, max_batches: int | None, seed: int, result: dict):
    """(task, batches) of a JSONL set: classification for a run with a head, else sequence-to-sequence."""
    tokenizer, config = checkpoint.tokenizer, checkpoint.config.model
    template = _chat_template(checkpoint, run) if config.arch == "decoder" and not config.n_classes else None
    if template is not None:
        return _chat_batches(checkpoint, template, data, batch_size, max_batches, seed, result)
    if config.n_classes:
        task = "classify"
        labels = (checkpoint.config.training or {}).get("labels") or [str(i) for i in range(config.n_classes)]
    elif config.arch == "encoder-decoder":
        task, labels = "seq2seq", None
    else:
        raise TfcliError(
            f"{run} has no classification head, no chat template and is not an encoder-decoder; a labeled set cannot score it",
            hint="evaluate a language model on shards or a text file",
        )
    fields = (checkpoint.config.training or {}).get("fields")  # the field names it was fine-tuned with
    labeled, _ = load_labeled(data, task, tokenizer, config.arch, config.block_size, labels=labels, fields=fields)
    source = d.LabeledSource(task, labeled, labeled, batch_size, seed, pad_id=tokenizer.require("pad"), eos_id=tokenizer.special_ids.get("eos", 0), accum=1)
    batches = source.validation(0, batch_size)
    if max_batches:
        batches = batches[:max_batches]
    result["examples"] = min(len(labeled), len(batches) * batch_size)
    return task, batches


def _chat_template(checkpoint, run: Path):
    """The chat template a decoder run keeps in its tokenizer_config.json, or None."""
    path = checkpoint.tokenizer.path.parent / TOKENIZER_CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return ChatTemplate.for_tokenizer(checkpoint.tokenizer, config, str(run))


def _chat_batches(checkpoint, template, data: Path, batch_size: int, max_batches: int | None, seed: int, result: dict):
    """(task, batches) of a chat or instruct file (as the run was fine-tuned; chat for a run imported with a
    template), encoded and fitted to the context as training does: the loss and accuracy of the replies."""
    trained = (checkpoint.config.training or {}).get("task")
    task = trained if trained in ("chat", "instruct") else "chat"
    conversations, report = encode_conversations(read_conversations(data, task), template, checkpoint.config.model.block_size, data)
    if len(conversations) == 0:
        raise TfcliError(f"no conversation in {data} fits the context of the run", hint="shorten them")
    tokenizer = checkpoint.tokenizer
    pad = tokenizer.special_ids.get("pad", tokenizer.special_ids.get("eos", 0))
    batches = ChatSource(task, conversations, conversations, batch_size, seed, pad_id=pad, eos_id=pad, accum=1).validation(0, batch_size)
    if max_batches:
        batches = batches[:max_batches]
    result["examples"] = min(len(conversations), len(batches) * batch_size)
    if report.cropped or report.dropped:
        result["note"] = f"{report.cropped:,} conversations lost their oldest exchanges to fit the context, {report.dropped:,} were dropped"
    return task, batches


def _tokens_to_score(checkpoint, run: Path, data: Path, split: str, result: dict):
    """The token ids of a shard folder's split or of a text file, checked against the run's tokenizer."""
    if data.is_dir() and (data / "meta.json").is_file():
        meta = load_shard_meta(data)
        if meta.tokenizer_sha256 != checkpoint.tokenizer.sha256:
            raise TfcliError(
                f"the shards in {data} were encoded with another tokenizer than {run}'s",
                hint="encode the text with the run's tokenizer.json, or pass a text file",
            )
        tokens = open_shard(data, split)
        if len(tokens) == 0:
            other = "train" if split == "val" else "val"
            raise TfcliError(f"the {split} split of {data} is empty", hint=f"evaluate on the other one with --split {other}")
        result["split"] = split
        return tokens
    if data.exists():
        kind = artifact_kind(data)
        if kind:
            where = f"the folder {data.parent}" if data.is_file() and kind.endswith("a token-shard folder") else "a shard folder"
            raise TfcliError(f"{data} is {kind}, not data to evaluate", hint=f"pass {where}, a text file or a labeled set")
        return _text_tokens(data, checkpoint.tokenizer)
    raise TfcliError(f"{data} does not exist", hint="pass a shard folder, a text file or a labeled set")


def _text_batches(checkpoint, run: Path, data: Path, split: str, batch_size: int, max_batches: int | None, seed: int, result: dict):
    """(task, batches) covering the tokens with back-to-back windows of the run's own objective."""
    tokenizer, config = checkpoint.tokenizer, checkpoint.config.model
    task = {"decoder": "lm", "encoder": "mlm", "encoder-decoder": "denoise"}[config.arch]
    tokens = _tokens_to_score(checkpoint, run, data, split, result)
    block = config.block_size
    window = block if task == "lm" else block - 2  # the masked and denoising windows leave room for [cls] / [eos]
    trained = {**dataclasses.asdict(_default_train_config()), **((checkpoint.config.training or {}).get("config") or {})}
    if len(tokens) < window + 1:
        raise TfcliError(f"{data} holds {len(tokens):,} tokens, fewer than one window of {window + 1:,}", hint="evaluate on more text")
    sources = {
        "lm": lambda: d.LMSource(tokens, tokens, block, batch_size, seed),
        "mlm": lambda: d.MLMSource(
            tokens,
            tokens,
            block,
            batch_size,
            seed,
            cls_id=tokenizer.require("cls"),
            mask_id=tokenizer.require("mask"),
            vocab=tokenizer.vocab_size,
            prob=trained["mask_prob"],
        ),
        "denoise": lambda: d.DenoiseSource(
            tokens,
            tokens,
            block,
            batch_size,
            seed,
            pad_id=tokenizer.require("pad"),
            mask_id=tokenizer.require("mask"),
            eos_id=tokenizer.require("eos"),
            density=trained["noise_density"],
            mean_span=trained["mean_span"],
        ),
    }
    source = sources[task]()
    last = len(tokens) - window - 1
    # back to back, every token read once: a next-token row's last token is the next row's first input
    # (it is only a target here), a masked or denoising row uses all window + 1 of its tokens
    stride = window if task == "lm" else window + 1
    starts = torch.arange(0, last + 1, stride)
    if max_batches:
        starts = starts[: max_batches * batch_size]
    gen = d.generator(seed, "eval")
    make = (lambda rows: source._make(rows)) if task == "lm" else (lambda rows: source._make(rows, gen))
    result["tokens"] = int(starts.numel() * stride)
    batches = [make(source.val.rows(chunk)) for chunk in starts.split(batch_size)]
    for batch in batches:  # damaged shards (or another tokenizer's) would fail deep inside the embedding
        check_token_ids(batch, task, config.vocab_size, data)
    return task, batches


def _default_train_config():
    return TrainConfig()


def unigram_entropy(shard_dir: Path) -> float:
    """Entropy in nats of the train split's token frequencies: the loss of a model that knows only how
    often each token occurs. A language model has learned something when its validation loss is below it."""
    meta = load_shard_meta(shard_dir)
    counts = np.bincount(np.asarray(open_shard(shard_dir, "train")), minlength=meta.vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum()) if len(p) else math.nan
