"""Labeled sets: `{"text", "label"}` for classification, `{"source", "target"}` for sequence-to-sequence, as
JSON lines, CSV / TSV or Parquet (compressed or not); the fields may go by other names (`--text-field`, ...).

A bad record is an error naming the file and the line or row (a training example is never dropped
silently). Texts become token ids here, framed the way the model reads them (the classification token
first for an encoder, the end-of-text token last for a decoder), so training, evaluation and prediction
frame them alike.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from tfcli.corpus.formats import sniff_file
from tfcli.corpus.reader import CorpusFile, ReadStats, iter_records, open_corpus_file, record_unit
from tfcli.corpus.records import value_problem
from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TextTokenizer

FIELDS = {"classify": ("text", "label"), "seq2seq": ("source", "target")}
FIELD_OPTIONS = {"text": "--text-field", "label": "--label-field", "source": "--source-field", "target": "--target-field"}


@dataclasses.dataclass
class LabeledSet:
    """Token ids per example; `targets` holds class ids (classify) or target token ids (seq2seq)."""

    inputs: list[list[int]]
    targets: list[Any]
    path: str

    def __len__(self) -> int:
        return len(self.inputs)


class Example(NamedTuple):
    input: str
    output: Any  # a label (classify) or a target text (seq2seq)
    line: int  # where it is in the file, for messages
    unit: str = "line"  # what `line` counts: lines (JSON lines, CSV) or rows (Parquet)


def field_names(task: str, fields: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The names of a task's two fields in the data: the defaults unless `fields` renames them.

    Example: field_names("classify", {"label": "stars"}) -> ("text", "stars")
    """
    roles = FIELDS[task]
    fields = dict(fields or {})
    unknown = sorted(set(fields) - set(roles))
    if unknown:
        raise TfcliError(
            f"{FIELD_OPTIONS.get(unknown[0], unknown[0])} does not apply to --task {task}", hint=f"{task} reads {' and '.join(FIELD_OPTIONS[r] for r in roles)}"
        )
    for role, name in fields.items():
        if not name or not name.strip():
            raise TfcliError(f"{FIELD_OPTIONS[role]} cannot be empty", hint=f"name the field, or leave the option out to read {role!r}")
    names = tuple(fields.get(role) or role for role in roles)
    if names[0] == names[1]:
        raise TfcliError(f"{FIELD_OPTIONS[roles[0]]} and {FIELD_OPTIONS[roles[1]]} name the same field {names[0]!r}")
    return names  # type: ignore[return-value]


def read_labeled(path: Path, task: str, fields: Mapping[str, str] | None = None) -> list[Example]:
    """The examples of a labeled file (JSON lines, CSV / TSV or Parquet); every problem names the file and
    the line or row."""
    roles = FIELDS[task]
    first, second = field_names(task, fields)
    shape = f'one {{"{first}": ..., "{second}": ...}} record per line or row'
    path = Path(path)
    if not path.is_file():
        raise TfcliError(
            f"labeled data {path} does not exist" if not path.exists() else f"{path} is not a file", hint=f"pass JSON lines, CSV or Parquet with {shape}"
        )
    sniffed = sniff_file(path)
    if sniffed.format == "text":  # an extension that names no format: JSON lines, as always
        sniffed = dataclasses.replace(sniffed, format="jsonl")
    if sniffed.binary:
        raise TfcliError(f"{path} looks like a binary file (it holds NUL bytes)", hint=f"pass JSON lines, CSV or Parquet with {shape}")
    source = CorpusFile(path, path.stat().st_size, sniffed.format, sniffed.compression)
    hint = f"name the columns with {FIELD_OPTIONS[roles[0]]} and {FIELD_OPTIONS[roles[1]]}"
    rows = []
    stats = ReadStats()
    with open_corpus_file(source, stats) as opened:
        unit = record_unit(opened)
        for row in iter_records(opened, (first, second), stats, strict=True, hint=hint):
            where = f"{path} {unit} {row.number}"
            if row.problem:
                raise TfcliError(f"{where} {row.problem}", hint=f'every record needs "{first}" and "{second}"')
            text, value = row.values
            if not isinstance(text, str):
                raise TfcliError(f"{where}: {value_problem(first, text)}")
            if task == "seq2seq" and not isinstance(value, str):
                raise TfcliError(f"{where}: {value_problem(second, value)}")
            if task == "classify" and (not isinstance(value, (str, int)) or isinstance(value, bool)):
                raise TfcliError(f"{where}: {second!r} must be a string or an integer, not {value!r}")
            rows.append(Example(text, value, row.number, unit))
    if stats.invalid_bytes:
        raise TfcliError(f"{path} is not UTF-8 text ({stats.invalid_bytes} invalid bytes)", hint="convert it to UTF-8")
    if not rows:
        raise TfcliError(f"{path} holds no labeled examples", hint=shape)
    if all(not row.input.strip() for row in rows):  # training would see no token of input at any step
        raise TfcliError(
            f"every {first!r} in {path} is empty ({len(rows):,} records), so there is no input to learn from",
            hint=f"put the input text in {first!r}, or name the field that holds it with {FIELD_OPTIONS[roles[0]]}",
        )
    return rows


def _is_number(value: Any) -> bool:
    """An integer label, or one written as text. Example: 3 -> True, "3" -> True, "-1" -> True, "three" -> False."""
    return isinstance(value, int) or str(value).removeprefix("-").isdigit()


def label_names(values: list[Any]) -> list[str]:
    """Class names in a stable order: numbers numerically, else alphabetically. Example: [2, 10, 1] -> ["1", "2", "10"]."""
    names = {str(v) for v in values}
    if all(isinstance(v, int) for v in values):
        return sorted(names, key=int)
    return sorted(names)


def _refuse_mixed_labels(path: Path, rows: list[Example]) -> None:
    """Labels that are numbers (1, or "1") beside labels that are words: one of them is a mistake in the data, which
    would otherwise train as a class of its own."""
    number = next((row for row in rows if isinstance(row.output, int)), None)
    word = next((row for row in rows if not _is_number(row.output)), None)
    if number is not None and word is not None:
        raise TfcliError(
            f"{path} {word.unit} {word.line} has the label {word.output!r}, a word, but {number.unit} {number.line} has the number {number.output}",
            hint="give the labels all as words or all as numbers",
        )


def classification_ids(tokenizer: TextTokenizer, arch: str, texts: list[str], block_size: int) -> list[list[int]]:
    """An encoder reads [cls] + text, + [sep] where the tokenizer has one as BERT's does (its classifier looks
    at the first position); a decoder reads text + [eos] (its classifier looks at the last, the only
    position that has seen everything)."""
    encoded = tokenizer.encode_batch(texts)
    if arch == "encoder":
        cls = tokenizer.require("cls")
        sep = [tokenizer.special_ids["sep"]] if "sep" in tokenizer.special_ids else []
        return [[cls] + ids[: block_size - 1 - len(sep)] + sep for ids in encoded]
    eos = tokenizer.require("eos")
    return [ids[: block_size - 1] + [eos] for ids in encoded]


def seq2seq_ids(tokenizer: TextTokenizer, texts: list[str], block_size: int, *, target: bool) -> list[list[int]]:
    """Sources are cropped to the block; targets end with [eos] (decoding starts from [eos] too)."""
    encoded = tokenizer.encode_batch(texts)
    if not target:
        return [ids[:block_size] for ids in encoded]
    eos = tokenizer.require("eos")
    return [ids[: block_size - 1] + [eos] for ids in encoded]


def load_labeled(
    path: Path, task: str, tokenizer: TextTokenizer, arch: str, block_size: int, labels: list[str] | None = None, fields: Mapping[str, str] | None = None
) -> tuple[LabeledSet, list[str] | None]:
    """Read and encode a set. classify: the class names come from `labels` if given (a label outside them is
    an error naming the line), else from the data. `fields` renames the task's fields (see `field_names`)."""
    rows = read_labeled(path, task, fields)
    inputs_text = [r[0] for r in rows]
    if task == "classify":
        if labels is None:
            _refuse_mixed_labels(Path(path), rows)
            labels = label_names([r[1] for r in rows])
            if len(labels) < 2:
                raise TfcliError(f"{path} has only one label ({labels[0]!r}); a classifier needs at least two")
        index = {name: i for i, name in enumerate(labels)}
        targets = []
        for row in rows:
            if str(row.output) not in index:
                raise TfcliError(
                    f"{path} {row.unit} {row.line} has the label {row.output!r}, which the model does not know", hint=f"labels: {', '.join(labels)}"
                )
            targets.append(index[str(row.output)])
        inputs = classification_ids(tokenizer, arch, inputs_text, block_size)
    else:
        inputs = seq2seq_ids(tokenizer, inputs_text, block_size, target=False)
        targets = seq2seq_ids(tokenizer, [r[1] for r in rows], block_size, target=True)
    return LabeledSet(inputs, targets, str(path)), labels


def split_validation(data: LabeledSet, fraction: float, seed: int) -> tuple[LabeledSet, LabeledSet]:
    """Hold out `fraction` of the examples (a seeded shuffle) as the validation set."""
    order = list(range(len(data)))
    random.Random(seed).shuffle(order)
    n_val = int(round(len(order) * fraction))
    if fraction > 0 and len(order) >= 2:
        n_val = min(max(n_val, 1), len(order) - 1)
    val_idx, train_idx = sorted(order[:n_val]), sorted(order[n_val:])

    def subset(idx):
        return LabeledSet([data.inputs[i] for i in idx], [data.targets[i] for i in idx], data.path)

    return subset(train_idx), subset(val_idx)
