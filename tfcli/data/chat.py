"""Chat and instruction sets for `--task chat` and `--task instruct`, read into conversations and encoded
with a chat template.

chat: one `{"messages": [{"role": "system" | "user" | "assistant", "content": ...}, ...]}` per line.
instruct: one `{"prompt": ..., "response": ...}` per line (and an optional "system"), read as a user message
and the assistant's reply. JSON lines or Parquet, compressed or not. A bad record (not JSON, an unknown
role, no assistant message, a template that refuses it) is an error naming the file and the line.

The context rule: a conversation longer than the context (block size + 1 tokens, the last one only a
target) loses its oldest exchanges, whole (a user message and everything up to the next one), keeping a
leading system message; messages after the last assistant message carry no loss and are left out. A
conversation whose last exchange alone does not fit is dropped, and counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfcli.corpus.formats import sniff_file
from tfcli.corpus.reader import CorpusFile, ReadStats, iter_records, open_corpus_file, record_unit
from tfcli.corpus.records import value_problem
from tfcli.data.labeled import LabeledSet
from tfcli.errors import TfcliError
from tfcli.tokenizer.chat_template import CHAT_ROLES, ChatTemplate, EncodedChat, Message

CHAT_TASKS = ("chat", "instruct")
WHY_NOT_CSV = {"chat": " (a conversation's messages are nested)"}
SHAPES = {
    "chat": '{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]} per line',
    "instruct": '{"prompt": ..., "response": ...} per line',
}


@dataclasses.dataclass
class Conversation:
    messages: list[Message]
    line: int
    unit: str = "line"


@dataclasses.dataclass
class ChatSetReport:
    """What fitting a set into the context did: conversations kept, cropped (oldest exchanges left out), dropped."""

    kept: int = 0
    cropped: int = 0
    dropped: int = 0


def _messages(value: Any, where: str) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise TfcliError(f'{where}: \'messages\' must be a non-empty list of {{"role", "content"}} objects', hint=SHAPES["chat"])
    messages = []
    for number, item in enumerate(value, start=1):
        if not isinstance(item, dict) or "role" not in item or "content" not in item:
            raise TfcliError(f'{where}: message {number} is not a {{"role": ..., "content": ...}} object')
        role, content = item["role"], item["content"]
        if role not in CHAT_ROLES:
            raise TfcliError(f"{where}: message {number} has the unknown role {role!r}", hint=f"use {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise TfcliError(f"{where}: message {number}: {value_problem('content', content)}")
        messages.append(Message(role, content))
    return messages


def read_conversations(path: Path, task: str) -> list[Conversation]:
    """The conversations of a chat or instruct file; every problem names the file and the line or row."""
    path = Path(path)
    shape = SHAPES[task]
    if not path.is_file():
        raise TfcliError(f"chat data {path} does not exist" if not path.exists() else f"{path} is not a file", hint=f"pass JSON lines with {shape}")
    sniffed = sniff_file(path)
    if sniffed.format in ("csv", "tsv"):
        raise TfcliError(f"{path} is {sniffed.format.upper()}; --task {task} reads JSON lines or Parquet{WHY_NOT_CSV.get(task, '')}", hint=f"write {shape}")
    if sniffed.format == "text":  # an extension that names no format: JSON lines, as always
        sniffed = dataclasses.replace(sniffed, format="jsonl")
    if sniffed.binary:
        raise TfcliError(f"{path} looks like a binary file (it holds NUL bytes)", hint=f"pass JSON lines with {shape}")
    source = CorpusFile(path, path.stat().st_size, sniffed.format, sniffed.compression)
    fields = ("messages",) if task == "chat" else ("prompt", "response")
    conversations = []
    stats = ReadStats()
    with open_corpus_file(source, stats) as opened:
        unit = record_unit(opened)
        for row in iter_records(opened, fields, stats, strict=True, hint=f"every record needs {' and '.join(repr(f) for f in fields)}"):
            where = f"{path} {unit} {row.number}"
            if row.problem:
                raise TfcliError(f"{where} {row.problem}", hint=shape)
            if task == "chat":
                messages = _messages(row.values[0], where)
            else:
                for field, value in zip(fields, row.values):
                    if not isinstance(value, str):
                        raise TfcliError(f"{where}: {value_problem(field, value)}")
                messages = [Message("user", row.values[0]), Message("assistant", row.values[1])]
            if not any(m.role == "assistant" for m in messages):
                raise TfcliError(f"{where}: the conversation has no assistant message, so nothing to learn from", hint="add the reply, or leave the line out")
            conversations.append(Conversation(messages, row.number, unit))
    if stats.invalid_bytes:
        raise TfcliError(f"{path} is not UTF-8 text ({stats.invalid_bytes} invalid bytes)", hint="convert it to UTF-8")
    if not conversations:
        raise TfcliError(f"{path} holds no conversations", hint=shape)
    return conversations


def without_oldest_exchange(messages: Sequence[Message]) -> list[Message] | None:
    """The messages without their oldest exchange (a leading system message stays); None when only one is left.

    Example: [system, user a, assistant a, user b, assistant b] -> [system, user b, assistant b]
    """
    first = 1 if messages and messages[0].role == "system" else 0
    next_user = next((i for i in range(first + 1, len(messages)) if messages[i].role == "user"), None)
    if next_user is None:
        return None
    return [*messages[:first], *messages[next_user:]]


def fit_conversation(template: ChatTemplate, messages: Sequence[Message], max_tokens: int) -> tuple[EncodedChat | None, bool]:
    """The conversation encoded within `max_tokens` by the context rule (module docstring): the encoding (None:
    dropped) and whether exchanges were left out."""
    last_reply = max(i for i, m in enumerate(messages) if m.role == "assistant")
    kept: list[Message] | None = list(messages[: last_reply + 1])
    cropped = False
    while kept is not None:
        encoded = template.encode(kept)
        if len(encoded.ids) <= max_tokens:
            return encoded, cropped
        kept, cropped = without_oldest_exchange(kept), True
    return None, cropped


def encode_conversations(conversations: Sequence[Conversation], template: ChatTemplate, block_size: int, path: Path) -> tuple[LabeledSet, ChatSetReport]:
    """A set whose inputs are each conversation's ids and targets which of them the loss counts."""
    ids, trained = [], []
    report = ChatSetReport()
    for conversation in conversations:
        try:
            encoded, cropped = fit_conversation(template, conversation.messages, block_size + 1)
        except TfcliError as error:
            raise TfcliError(f"{path} {conversation.unit} {conversation.line}: {error.message}", hint=error.hint) from None
        if encoded is None:
            report.dropped += 1
            continue
        if not any(encoded.trained[1:]):
            raise TfcliError(f"{path} {conversation.unit} {conversation.line}: the assistant's messages are empty", hint="give each reply some text")
        report.kept += 1
        report.cropped += cropped
        ids.append(encoded.ids)
        trained.append(encoded.trained)
    return LabeledSet(ids, trained, str(path)), report


def shifted_targets(ids: Sequence[int], trained: Sequence[bool], ignore: int) -> list[int]:
    """The target of each input position (ids[:-1]): the next id where the loss counts it, else `ignore`.

    Example: ids [5, 6, 7], trained [False, False, True] -> [ignore, 7]
    """
    return [ids[j + 1] if trained[j + 1] else ignore for j in range(len(ids) - 1)]
