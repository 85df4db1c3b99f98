"""`tfcli eval --tasks --limit N` on a local JSON-lines task reads the first rows of its data, not the whole
file (the harness's loader parses a whole file into an Arrow cache first), and scores them as the harness
scores the same rows in a file of their own."""

from __future__ import annotations

import functools
import io
import json
import os
from collections import Counter
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import lm_eval  # noqa: F401  CI installs the test extra, which holds the harness: missing, these tests fail
else:
    pytest.importorskip("lm_eval", reason="could not import lm_eval: the eval extra, pip install 'tfcli[eval]'")

FIRST = [
    {"question": "The cat sat on the", "choices": ["mat", "sky"], "label": 0},
    {"question": "A red", "choices": ["ball", "run"], "label": 0},
    {"question": "Tom had three", "choices": ["apples", "the"], "label": 1},
]
BIG_ROWS = 200_000  # about 12 MB of short rows: the harness would parse every one of them
TASK = {
    "task": "mine",
    "dataset_path": "json",
    "output_type": "multiple_choice",
    "test_split": "test",
    "doc_to_text": "{{question}}",
    "doc_to_choice": "{{choices}}",
    "doc_to_target": "label",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory, trained_tokenizer) -> Path:
    """A tiny decoder run (untrained: the same rows give the same numbers whatever they are)."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    torch.manual_seed(0)
    tokenizer = TextTokenizer.load(trained_tokenizer)
    folder = tmp_path_factory.mktemp("limits") / "run"
    save_checkpoint(folder, Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layers=1, n_heads=2, d_model=16)), tokenizer)
    return folder


def write_task(folder: Path, data_files: dict[str, str], **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {**TASK, "dataset_kwargs": {"data_files": data_files}, **fields}
    (folder / "task.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()), encoding="utf-8")
    return folder


def write_jsonl(path: Path, records: list[dict], *, filler: int = 0) -> Path:
    """`records`, then `filler` other rows, then (with filler) a broken last line that a whole read would stop at."""
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(r) + "\n" for r in records)
        out.writelines(json.dumps({"question": f"row {i}", "choices": ["a", "b"], "label": i % 2}) + "\n" for i in range(filler))
        if filler:
            out.write('{"question": "not JSON at all\n')
    return path


def samples(run: Path, folder: Path, *, limit: int | None, num_fewshot: int | None = None) -> dict:
    """The harness's results with each document's prompts, the task folder given as --include-path."""
    from tfcli.harness.evaluate import TaskOptions, run_harness
    from tfcli.harness.model import TfcliLM

    options = TaskOptions(("mine",), (folder,), num_fewshot=num_fewshot, limit=limit, batch_size=4, log_samples=True)
    return run_harness(TfcliLM(run, batch_size=4), options)


def assert_same(bounded: dict, whole: dict) -> None:
    assert bounded["results"]["mine"] == whole["results"]["mine"]
    assert [s["arguments"] for s in bounded["samples"]["mine"]] == [s["arguments"] for s in whole["samples"]["mine"]]
    assert [s["doc"] for s in bounded["samples"]["mine"]] == [s["doc"] for s in whole["samples"]["mine"]]


@pytest.fixture
def reads(monkeypatch, tmp_path):
    """Bytes tfcli's row reader took from each file, and the data files every call that reached datasets'
    own loader named: a spy under the harness's `datasets.load_dataset` (its Arrow caches kept in tmp_path)."""
    import datasets

    import tfcli.harness.data

    taken: Counter[str] = Counter()
    loaded: list[str] = []

    class CountingFile(io.FileIO):
        def read(self, size: int = -1) -> bytes:
            data = super().read(size)
            taken[os.path.realpath(self.name)] += len(data)
            return data

    def counting_open(path, mode="r", *args, **kwargs):
        return CountingFile(path, mode) if mode in ("rb", "wb") else open(path, mode, *args, **kwargs)

    real_load_dataset = datasets.load_dataset

    @functools.wraps(real_load_dataset)
    def spy(*args, **kwargs):
        files = kwargs.get("data_files") or {}
        for value in files.values() if isinstance(files, dict) else [files]:
            loaded.extend(os.path.realpath(v) for v in ([value] if isinstance(value, str) else value))
        return real_load_dataset(*args, **kwargs)

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.setattr(tfcli.harness.data, "open", counting_open, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", spy)
    return taken, loaded


def test_limit_reads_only_the_first_rows_and_scores_them_as_the_harness_does(run, cli, tmp_path, reads):
    from tfcli.limits import READ_BLOCK

    taken, loaded = reads
    big = write_task(tmp_path / "big", {"test": "data.jsonl"})
    data = os.path.realpath(write_jsonl(big / "data.jsonl", FIRST, filler=BIG_ROWS))
    small = write_task(tmp_path / "small", {"test": "data.jsonl"})
    write_jsonl(small / "data.jsonl", FIRST)

    bounded = samples(run, big, limit=3)
    assert taken[data] <= READ_BLOCK + 16  # one block of rows (and the first bytes, for compression) ...
    assert os.path.getsize(data) > 10 * READ_BLOCK  # ... of a file far larger
    assert data not in loaded  # datasets' loader never saw the big file, only the first rows copied out of it
    whole = samples(run, small, limit=None)  # the harness's own reading of the same three rows
    assert_same(bounded, whole)

    result = cli("eval", run, "--tasks", "mine", "--include-path", big, "--limit", "3", "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["results"]["mine"] == whole["results"]["mine"]
    # read whole (no --limit), the big file stops at its broken last line: the bounded read never got there
    result = cli("eval", run, "--tasks", "mine", "--include-path", big)
    assert result.code == 2 and "task mine cannot load its data" in result.stderr, result.stderr


def test_few_shot_examples_come_from_their_whole_split(run, tmp_path, reads):
    """Few-shot examples are drawn (seeded) from the whole few-shot split, which is read whole; the evaluated
    split gives its first rows. A date string stays a timestamp in both, as the JSON reader makes it."""
    from tfcli.limits import READ_BLOCK

    taken, loaded = reads
    train = [{"question": f"Example {i} on 2021-03-0{i + 1}", "choices": ["yes", "no"], "label": i % 2, "when": f"2021-03-0{i + 1}"} for i in range(6)]
    dated = [{**r, "when": "2022-01-02"} for r in FIRST]
    fields = {"training_split": "train", "fewshot_split": "train", "doc_to_text": "{{question}} ({{when}})"}
    big = write_task(tmp_path / "big", {"train": "train.jsonl", "test": "data.jsonl"}, **fields)
    write_jsonl(big / "train.jsonl", train)
    data = os.path.realpath(write_jsonl(big / "data.jsonl", dated, filler=BIG_ROWS))
    small = write_task(tmp_path / "small", {"train": "train.jsonl", "test": "data.jsonl"}, **fields)
    write_jsonl(small / "train.jsonl", train)
    write_jsonl(small / "data.jsonl", dated[:2])

    bounded = samples(run, big, limit=2, num_fewshot=2)
    assert taken[data] <= READ_BLOCK + 16 and data not in loaded
    assert os.path.realpath(big / "train.jsonl") in loaded  # the few-shot split: the harness's own reading, whole
    whole = samples(run, small, limit=None, num_fewshot=2)
    assert_same(bounded, whole)
    prompt = bounded["samples"]["mine"][0]["arguments"][0][0]
    assert prompt.count("Example") == 2 and "(2022-01-02 00:00:00)" in prompt  # two examples; the date read as the harness reads it


@pytest.mark.parametrize(
    "case, expected",
    [
        ("zero-shot", {"train": 4, "test": 4}),
        ("few-shot", {"train": None, "test": 4}),
        ("few-shot from the evaluated split", {"train": 4, "test": None}),
        ("no limit", None),
        ("process_docs", None),
        ("csv", None),
        ("glob", None),
        ("a Hub dataset", None),
    ],
)
def test_which_tasks_read_first_rows(tmp_path, monkeypatch, case, expected):
    """The plan: every split's first N rows, the few-shot split whole when examples are drawn from it; the
    harness's own reading wherever the first rows might not be the first documents, or the files are not
    plain local JSON lines."""
    from tfcli.harness.data import first_rows_plan

    monkeypatch.chdir(tmp_path)
    for name in ("a.jsonl", "b.jsonl"):
        write_jsonl(tmp_path / name, FIRST)
    (tmp_path / "c.csv").write_text("question,label\nx,0\n", encoding="utf-8")
    config = {**TASK, "dataset_kwargs": {"data_files": {"train": "a.jsonl", "test": "b.jsonl"}}, "training_split": "train", "fewshot_split": "train"}
    limit, shots = 4, 0
    if case == "few-shot":
        shots = 2
    elif case == "few-shot from the evaluated split":
        config, shots = {**config, "fewshot_split": "test"}, 2
    elif case == "no limit":
        limit = None
    elif case == "process_docs":
        config["process_docs"] = print
    elif case == "csv":
        config = {**config, "dataset_path": "csv", "dataset_kwargs": {"data_files": {"test": "c.csv"}}}
    elif case == "glob":
        config["dataset_kwargs"] = {"data_files": {"train": "a.jsonl", "test": "*.jsonl"}}
    elif case == "a Hub dataset":
        config = {**config, "dataset_path": "Rowan/hellaswag", "dataset_kwargs": None}
    plan = first_rows_plan(config, limit, shots)
    assert (plan.rows if plan is not None else None) == expected


def test_a_compressed_file_is_read_by_the_harness(run, tmp_path, reads):
    """A .jsonl file that is gzip inside: datasets decompresses it; tfcli's row reader leaves it to it."""
    import gzip

    taken, loaded = reads
    folder = write_task(tmp_path / "gz", {"test": "data.jsonl"})
    data = folder / "data.jsonl"
    data.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in FIRST).encode()))
    results = samples(run, folder, limit=2)
    assert [s["doc"]["question"] for s in results["samples"]["mine"]] == [r["question"] for r in FIRST[:2]]
    assert os.path.realpath(data) in loaded and taken[os.path.realpath(data)] <= 16


def test_data_outside_a_task_folder_is_refused_before_a_byte_is_read(run, cli, tmp_path, reads):
    """The first-rows reader sits under --include-path's data check: a file outside the folder is refused
    before it opens it (or datasets does)."""
    taken, loaded = reads
    outside = os.path.realpath(write_jsonl(tmp_path / "outside.jsonl", FIRST))
    folder = write_task(tmp_path / "tasks", {"test": outside})
    result = cli("eval", run, "--tasks", "mine", "--include-path", folder, "--limit", "2")
    assert result.code == 2 and "is outside the task folder" in result.stderr, result.stderr
    assert taken[outside] == 0 and outside not in loaded


def test_bench_eval_reads_the_documents_it_times_as_eval_does():
    """`tfcli bench eval --limit N` builds its requests from the first N documents, read as eval --limit reads them."""
    from tfcli.bench.eval import task_requests

    requests = task_requests("tfcli_story_choice", 3)
    assert {request.doc_id for request in requests} == {0, 1, 2} and len(requests) >= 6  # each document's choices
