"""JSON records refuse bad keys and types; atomic writes never leave a half-written file."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_open, atomic_write_json, prepare_output_dir
from tfcli.schema import JsonRecord


@dataclasses.dataclass
class Inner(JsonRecord):
    name: str


@dataclasses.dataclass
class Record(JsonRecord):
    count: int
    ratio: float
    items: list[Inner]
    note: str | None = None


def test_round_trip():
    record = Record(count=3, ratio=0.5, items=[Inner("a")], note=None)
    assert Record.from_json(json.loads(json.dumps(record.to_json()))) == record


@pytest.mark.parametrize(
    "data, message",
    [
        ({"count": 1, "ratio": 1.0, "items": [], "extra": 1}, "unknown key 'extra'"),
        ({"count": "1", "ratio": 1.0, "items": []}, "Record.count must be an integer"),
        ({"count": True, "ratio": 1.0, "items": []}, "Record.count must be an integer"),
        ({"count": 1, "items": []}, "missing the key 'ratio'"),
        ({"count": 1, "ratio": 1.0, "items": [{"name": 3}]}, r"Record.items\[0\].name must be a string"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_bad_records_name_the_key(data, message):
    with pytest.raises(TfcliError, match=message):
        Record.from_json(data)


def test_load_reports_invalid_json_with_the_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("{not json")
    with pytest.raises(TfcliError, match="r.json is not valid JSON"):
        Record.load(path)


def test_failed_atomic_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "data.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(path, "w") as handle:
            handle.write('{"v": 2')
            raise RuntimeError("crash half-way")
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["data.json"]  # no temp file left behind


def test_strict_json_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "x.json", {"loss": float("nan")})
    assert not (tmp_path / "x.json").exists()


def test_output_dir_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("keep me")
    with pytest.raises(TfcliError, match="is a file"):
        prepare_output_dir(path)
    assert path.read_text() == "keep me"
