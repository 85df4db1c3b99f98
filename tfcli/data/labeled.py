"""Labeled JSONL sets: `{"text", "label"}` for classification, `{"source", "target"}` for sequence-to-sequence.

A bad line is reported by file and line number. Texts become token ids here, framed the way the model
reads them (the classification token first for an encoder, the end-of-text token last for a decoder), so
training, evaluation and prediction frame them alike.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, NamedTuple

from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TextTokenizer

FIELDS = {"classify": ("text", "label"), "seq2seq": ("source", "target")}


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


def read_jsonl(path: Path, task: str) -> list[Example]:
    """The examples of a JSONL file; every problem names the file and the line."""
    first, second = FIELDS[task]
    path = Path(path)
    if not path.is_file():
        raise TfcliError(f"labeled data {path} does not exist" if not path.exists() else f"{path} is not a file",
                         hint=f"pass a JSONL file with one {{\"{first}\": ..., \"{second}\": ...}} object per line")
    rows = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TfcliError(f"{path} line {number} is not valid JSON ({exc.msg})") from exc
                if not isinstance(record, dict):
                    raise TfcliError(f"{path} line {number} is not a JSON object")
                for field in (first, second):
                    if field not in record:
                        raise TfcliError(f"{path} line {number} has no {field!r} field",
                                         hint=f"every line needs \"{first}\" and \"{second}\"")
                if not isinstance(record[first], str):
                    raise TfcliError(f"{path} line {number}: {first!r} must be a string")
                value = record[second]
                if task == "seq2seq" and not isinstance(value, str):
                    raise TfcliError(f"{path} line {number}: {second!r} must be a string")
                if task == "classify" and (not isinstance(value, (str, int)) or isinstance(value, bool)):
                    raise TfcliError(f"{path} line {number}: {second!r} must be a string or an integer")
                rows.append(Example(record[first], value, number))
    except UnicodeDecodeError as exc:
        raise TfcliError(f"{path} is not UTF-8 text") from exc
    if not rows:
        raise TfcliError(f"{path} holds no labeled examples", hint=f"one {{\"{first}\": ..., \"{second}\": ...}} object per line")
    return rows


def label_names(values: list[Any]) -> list[str]:
    """Class names in a stable order: numbers numerically, else alphabetically. Example: [2, 10, 1] -> ["1", "2", "10"]."""
    names = {str(v) for v in values}
    if all(isinstance(v, int) for v in values):
        return sorted(names, key=int)
    return sorted(names)


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


def load_labeled(path: Path, task: str, tokenizer: TextTokenizer, arch: str, block_size: int,
                 labels: list[str] | None = None) -> tuple[LabeledSet, list[str] | None]:
    """Read and encode a set. classify: the class names come from `labels` if given (a label outside them is
    an error naming the line), else from the data."""
    rows = read_jsonl(path, task)
    inputs_text = [r[0] for r in rows]
    if task == "classify":
        if labels is None:
            labels = label_names([r[1] for r in rows])
            if len(labels) < 2:
                raise TfcliError(f"{path} has only one label ({labels[0]!r}); a classifier needs at least two")
        index = {name: i for i, name in enumerate(labels)}
        targets = []
        for row in rows:
            if str(row.output) not in index:
                raise TfcliError(f"{path} line {row.line} has the label {row.output!r}, which the model does not know",
                                 hint=f"labels: {', '.join(labels)}")
            targets.append(index[str(row.output)])
        inputs = classification_ids(tokenizer, arch, inputs_text, block_size)
    else:
        inputs = seq2seq_ids(tokenizer, inputs_text, block_size, target=False)
        targets = seq2seq_ids(tokenizer, [r[1] for r in rows], block_size, target=True)
    return LabeledSet(inputs, targets, str(path)), labels


def split_validation(data: LabeledSet, fraction: float, seed: int) -> tuple[LabeledSet, LabeledSet]:
    """Hold out `fraction` of the examples (a seeded shuffle) as the validation set."""
    import random

    order = list(range(len(data)))
    random.Random(seed).shuffle(order)
    n_val = int(round(len(order) * fraction))
    if fraction > 0 and len(order) >= 2:
        n_val = min(max(n_val, 1), len(order) - 1)
    val_idx, train_idx = sorted(order[:n_val]), sorted(order[n_val:])

    def subset(idx):
        return LabeledSet([data.inputs[i] for i in idx], [data.targets[i] for i in idx], data.path)

    return subset(train_idx), subset(val_idx)
