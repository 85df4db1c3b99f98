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
from typing import Any

from tfcli.data.chat import encode_conversations, read_conversations, shifted_targets
from tfcli.data.labeled import LabeledSet, split_validation
from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_json, atomic_write_text
from tfcli.limits import CHAT_TEMPLATE_FILE, read_text_capped
from tfcli.tokenizer.chat_template import DEFAULT_TEMPLATE, ChatTemplate, chat_tokenizer_files, template_source
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer
from tfcli.tokenizer.specials import END_OF_GENERATION_KEY, end_of_generation_ids
from tfcli.train.data import IGNORE, Batch, LabeledSource, pad_rows


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


@dataclasses.dataclass(frozen=True)
class ChatFiles:
    """The tokenizer a chat run gets, as the files the run keeps: tokenizer.json's text and tokenizer_config.json."""

    text: str
    config: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ChatTokenizer:
    """The parent's tokenizer with the chat template (grown where needed), loaded and as files; the template."""

    files: ChatFiles
    tokenizer: TextTokenizer
    template: ChatTemplate
    source: str  # the template's Jinja text
    added: list[str]  # the markers added to the vocabulary


@dataclasses.dataclass(frozen=True)
class ChatSets:
    """The encoded conversations, and what was said about those that did not fit."""

    train_set: LabeledSet
    val_set: LabeledSet
    notes: tuple[str, ...]


def chat_tokenizer(parent_dir: Path, parent_tokenizer: TextTokenizer, template_file: Path | None) -> ChatTokenizer:
    """The chat tokenizer of a run fine-tuned from `parent_dir`. Nothing is written here (`install_chat_tokenizer` does that)."""
    parent_config = _read_config(parent_dir)
    source = _template_text(template_file, parent_config)
    text, config, added = chat_tokenizer_files(parent_tokenizer, parent_config, source)
    with tempfile.TemporaryDirectory() as staging:
        atomic_write_text(Path(staging) / TOKENIZER_FILE, text)
        atomic_write_json(Path(staging) / TOKENIZER_CONFIG_FILE, config)
        tokenizer = TextTokenizer.load(Path(staging) / TOKENIZER_FILE)
    where = str(template_file) if template_file is not None else f"{parent_dir}" if source != DEFAULT_TEMPLATE else "tfcli's default"
    template = ChatTemplate.for_tokenizer(tokenizer, config, where)
    assert template is not None
    config = with_turn_ends(config, tokenizer, template)
    return ChatTokenizer(ChatFiles(text, config), tokenizer, template, source, added)


def with_turn_ends(config: dict, tokenizer: TextTokenizer, template: ChatTemplate) -> dict:
    """CONFIG with the template's end of turn among its end-of-generation ids (beside eos): a chat run's plain
    completions stop there too, as transformers' generate does on its export and llama.cpp on its GGUF."""
    ends = {tokenizer.hf.token_to_id(text) for text in template.end_of_turn_texts} - {None, tokenizer.special_ids.get("eos")}
    if not ends:
        return config
    kept = end_of_generation_ids(config, tokenizer.vocab_size, "the parent's tokenizer_config.json")
    return {**config, END_OF_GENERATION_KEY: sorted(kept | ends)}


def grown_vocabulary_note(chat: ChatTokenizer, before: int, tied: bool) -> str:
    return (
        f"the chat template's tokens {', '.join(chat.added)} were added to the tokenizer: the embedding grows from {before:,} to "
        f"{chat.tokenizer.vocab_size:,} rows{'' if tied else ', and the output layer with it'}"
    )


def chat_sets(template: ChatTemplate, task: str, data: Path, val_data: Path | None, block: int, *, val_fraction: float, seed: int) -> ChatSets:
    """The conversations of --data (and --val-data, else a held-out share of --data) rendered and cropped to the context."""
    train_set, report = encode_conversations(read_conversations(data, task), template, block, data)
    if val_data is not None:
        val_set, val_report = encode_conversations(read_conversations(val_data, task), template, block, val_data)
        report.cropped += val_report.cropped
        report.dropped += val_report.dropped
    else:
        train_set, val_set = split_validation(train_set, val_fraction, seed)
    notes = []
    if report.cropped or report.dropped:
        notes.append(
            f"{report.cropped + report.dropped:,} conversations are longer than the context of {block + 1:,} tokens: "
            f"{report.cropped:,} lost their oldest exchanges, {report.dropped:,} were dropped (their last exchange alone is longer)"
        )
    if len(train_set) == 0:
        raise TfcliError(f"no conversation in {data} fits the context of {block + 1:,} tokens", hint="shorten them, or fine-tune a model with a longer context")
    return ChatSets(train_set, val_set, tuple(notes))


def install_chat_tokenizer(run_dir: Path, files: ChatFiles, resume: bool) -> TextTokenizer:
    """Write the chat tokenizer into the run directory (a new run), or check it is the one there (--resume);
    returns the run's own tokenizer."""
    if resume:
        if (run_dir / TOKENIZER_FILE).read_text(encoding="utf-8") != files.text or _read_config(run_dir) != files.config:
            raise TfcliError(
                "cannot resume: the chat template or the tokenizer differs from the run's", hint="resume with the template the run was started with"
            )
    else:
        atomic_write_text(run_dir / TOKENIZER_FILE, files.text)
        atomic_write_json(run_dir / TOKENIZER_CONFIG_FILE, files.config)
    return TextTokenizer.load(run_dir / TOKENIZER_FILE)
