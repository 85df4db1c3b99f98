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


def test_json_text_round_trips_lone_surrogates_and_refuses_deep_nesting(tmp_path):
    from tfcli.jsontext import dumps_json, loads_json

    value = {"path": "caf\udce9 \udcff.txt", "plain": "Zoë 🦊"}  # a file name that is not UTF-8, as Python decodes it
    text = dumps_json(value)
    assert text.encode("utf-8") and "Zoë 🦊" in text and json.loads(text) == value
    atomic_write_json(tmp_path / "x.json", value)
    assert json.loads((tmp_path / "x.json").read_text(encoding="utf-8")) == value
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        loads_json("[" * 100_000)
    (tmp_path / "deep.json").write_text('{"count": ' * 100_000)
    with pytest.raises(TfcliError, match="deep.json is not valid JSON"):
        Record.load(tmp_path / "deep.json")


def test_a_signal_waits_for_the_last_rename_of_a_staged_commit(tmp_path, monkeypatch):
    import signal

    from tfcli.fsutil import commit_staged, stage_file

    for name in ("a", "b", "c"):
        (tmp_path / name).write_text("old")
    staged = [(stage_file(tmp_path / name, "new"), tmp_path / name) for name in ("a", "b", "c")]
    real_replace, renamed = os.replace, []

    def replace(tmp, final):
        if not renamed:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C as the first file goes in
        real_replace(tmp, final)
        renamed.append(final)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        commit_staged(staged)
    assert len(renamed) == 3 and all((tmp_path / name).read_text() == "new" for name in ("a", "b", "c"))
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
