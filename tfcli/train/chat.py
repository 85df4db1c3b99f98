"""`tfcli train finetune --task chat | instruct`: the chat template and tokenizer a run gets, its data, its
and batches.

The template is --chat-template FILE, else the parent's (its tokenizer_config.json), else tfcli's default
(ChatML); ChatML's two markers are added to a tokenizer that lacks them where the template writes them: the embedding (and an untied output
layer) grows by as many rows, started at the mean of the existing rows
(`tfcli.adapters.vocabulary`; with --lora-rank they train whole beside the adapters). Conversations are padded on the
right to the longest in the batch (a decoder's causal mask keeps real tokens from seeing the padding, whose
targets carry no loss); they are not packed.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from tfcli.data.chat import encode_conversations, read_conversations, shifted_targets
from tfcli.data.labeled import split_validation
from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_json, atomic_write_text
from tfcli.limits import CHAT_TEMPLATE_FILE, read_text_capped
from tfcli.tokenizer.chat_template import DEFAULT_TEMPLATE, ChatTemplate, chat_tokenizer_files, template_source
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer
from tfcli.train.data import IGNORE, Batch, LabeledSource, pad_rows
from tfcli.train.fingerprint import digest, file_fingerprint


class ChatSource(LabeledSource):
    """Conversations in a fresh seeded order each epoch; inputs ids[:-1], targets the next id where it is an
    assistant's, else ignored."""

    def _make(self, data, idx: list[int]) -> Batch:
        ids, _ = pad_rows([data.inputs[i][:-1] for i in idx], self.pad_id)
        labels, _ = pad_rows([shifted_targets(data.inputs[i], data.targets[i], IGNORE) for i in idx], self.pad_id, fill=IGNORE)
        return Batch({"ids": ids, "labels": labels}, int((labels != IGNORE).sum()))


def _read_config(folder: Path) -> dict:
    path = folder / TOKENIZER_CONFIG_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _template_text(template_file: Path | None, parent_config: dict) -> str:
    if template_file is None:
        return template_source(parent_config) or DEFAULT_TEMPLATE
    try:
        text = read_text_capped(Path(template_file), CHAT_TEMPLATE_FILE)
    except (OSError, UnicodeDecodeError) as exc:
        raise TfcliError(f"cannot read the chat template {template_file} ({exc})", hint="pass a UTF-8 Jinja file") from None
    if not text.strip():
        raise TfcliError(f"the chat template {template_file} is empty", hint="write a template, or leave --chat-template out for tfcli's default (ChatML)")
    return text


def prepare_chat(job, *, template_file: Path | None, resume: bool) -> None:
    """Give a chat job its tokenizer (the parent's with the template, grown where needed), its model
    vocabulary, its conversations and its notes. Nothing is written here (`install_chat_tokenizer` does that)."""
    parent_dir = job.init_from
    source = _template_text(template_file, _read_config(parent_dir))
    text, config, added = chat_tokenizer_files(job.tokenizer, _read_config(parent_dir), source)
    with tempfile.TemporaryDirectory() as staging:
        atomic_write_text(Path(staging) / TOKENIZER_FILE, text)
        atomic_write_json(Path(staging) / TOKENIZER_CONFIG_FILE, config)
        tokenizer = TextTokenizer.load(Path(staging) / TOKENIZER_FILE)
    where = str(template_file) if template_file is not None else f"{parent_dir}" if source != DEFAULT_TEMPLATE else "tfcli's default"
    template = ChatTemplate.for_tokenizer(tokenizer, config, where)
    assert template is not None
    job.chat_files = (text, config)
    job.tokenizer = tokenizer
    before = job.model_config.vocab_size
    if tokenizer.vocab_size > before:
        job.model_config = dataclasses.replace(job.model_config, vocab_size=tokenizer.vocab_size)
        job.notes.append(
            f"the chat template's tokens {', '.join(added)} were added to the tokenizer: the embedding grows from {before:,} to "
            f"{tokenizer.vocab_size:,} rows{'' if job.model_config.tie_embeddings else ', and the output layer with it'}"
        )
    task, block = job.config.task, job.block_size
    train_set, report = encode_conversations(read_conversations(job.data, task), template, block, job.data)
    if job.val_data is not None:
        val_set, val_report = encode_conversations(read_conversations(job.val_data, task), template, block, job.val_data)
        report.cropped += val_report.cropped
        report.dropped += val_report.dropped
    else:
        train_set, val_set = split_validation(train_set, job.config.val_fraction, job.config.seed)
    if report.cropped or report.dropped:
        job.notes.append(
            f"{report.cropped + report.dropped:,} conversations are longer than the context of {block + 1:,} tokens: "
            f"{report.cropped:,} lost their oldest exchanges, {report.dropped:,} were dropped (their last exchange alone is longer)"
        )
    if len(train_set) == 0:
        raise TfcliError(
            f"no conversation in {job.data} fits the context of {block + 1:,} tokens", hint="shorten them, or fine-tune a model with a longer context"
        )
    job.labeled = (train_set, val_set)
    job.data_fingerprint = digest([file_fingerprint(job.data, job.val_data), source])


def install_chat_tokenizer(job) -> None:
    """Write the chat tokenizer into the run directory (a new run), or check it is the one there (--resume);
    the job's tokenizer is then the run's own."""
    text, config = job.chat_files
    run_dir = job.run_dir
    if job.resume:
        if (run_dir / TOKENIZER_FILE).read_text(encoding="utf-8") != text or _read_config(run_dir) != config:
            raise TfcliError(
                "cannot resume: the chat template or the tokenizer differs from the run's", hint="resume with the template the run was started with"
            )
    else:
        atomic_write_text(run_dir / TOKENIZER_FILE, text)
        atomic_write_json(run_dir / TOKENIZER_CONFIG_FILE, config)
    job.tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
