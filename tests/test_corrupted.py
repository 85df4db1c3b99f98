"""Damaged and hostile artifacts: every one is refused with one line (exit 2; `info` exit 1), quickly, and
before anything is allocated for what it claims. Shards whose meta.json disagrees with the .bin files or
whose ids pass the vocabulary, tokenizers with huge or sparse vocabularies, JSON nested past Python's
recursion limit in every file tfcli reads, a trainer state from another run, a metrics.jsonl of gigabytes,
and safetensors headers that claim terabytes in a file of a few hundred bytes."""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import TINY_TEXT
from tests.helpers import run

pytestmark = pytest.mark.sweep

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on this
DEEP_OBJECT = '{"a": ' * 100_000 + "1" + "}" * 100_000  # and on this
TINY_MODEL = ["--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "eval_batches=1"]


def one_line(result, *needles: str, code: int = 2) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == code, (result.code, result.stderr)
    if code == 2:
        lines = result.stderr.strip().split("\n")
        assert lines[-1].startswith("error: "), result.stderr
        for needle in needles:
            assert needle in lines[-1], (needle, lines[-1])


@pytest.fixture(scope="module", autouse=True)
def no_flops_measurement():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tfcli.train.setup.peak_matmul_flops", lambda *args, **kwargs: 1e12)
        yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """Shards of the tiny text and a run trained on them for two steps (with its trainer state)."""
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer

    folder = tmp_path_factory.mktemp("corrupt")
    (folder / "corpus.txt").write_text(TINY_TEXT * 30, encoding="utf-8")
    shutil.copytree(trained_tokenizer, folder / "tokenizer")
    encode_corpus(resolve_corpus([folder / "corpus.txt"]), TextTokenizer.load(folder / "tokenizer"), folder / "shards", val_fraction=0.2)
    args = train_args(folder / "shards", folder / "run", "--max-steps", "2")
    assert run(*args).code == 0
    return {"shards": folder / "shards", "run": folder / "run", "tokenizer": folder / "tokenizer"}


def train_args(shards: Path, out: Path, *extra) -> list:
    return ["train", "pretrain", "--data", shards, "-o", out, "--block-size", "16", "--batch-size", "4", "--device", "cpu", *TINY_MODEL, *extra]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# ---- shards ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(train_tokens=m["train_tokens"] + 5), "train.bin holds"),
        (lambda m: m.update(val_tokens=10**15), "val.bin holds"),
        (lambda m: m.update(train_tokens=-3), "train_tokens is -3, less than 0"),
        (lambda m: m.update(dtype="uint32"), "train.bin holds"),  # the same bytes read as twice the width
        (lambda m: m.update(eos_id=10**6), "eos_id 1000000 is outside the vocabulary"),
        (lambda m: m.update(dtype="float64"), "dtype must be uint16 or uint32"),
        (lambda m: m.update(train_tokens="many"), "train_tokens must be an integer"),
    ],
)
def test_a_meta_json_that_disagrees_with_the_bin_files(cli, trained, tmp_path, change, message):
    shards = copy(trained["shards"], tmp_path / "shards")
    edit_json(shards / "meta.json", change)
    one_line(cli(*train_args(shards, tmp_path / "out", "--max-steps", "1")), message)
    one_line(cli("eval", trained["run"], "--data", shards, "--device", "cpu"), message)
    assert not (tmp_path / "out").exists()


def test_a_missing_bin_file(cli, trained, tmp_path):
    shards = copy(trained["shards"], tmp_path / "shards")
    (shards / "val.bin").unlink()
    one_line(cli("eval", trained["run"], "--data", shards, "--device", "cpu"), "val.bin holds 0 bytes")


def test_ids_past_the_vocabulary_are_refused_by_eval_too(cli, trained, tmp_path):
    """(training refuses them: tests/test_train.py::test_shards_with_ids_past_the_vocabulary_are_one_line)"""
    shards = copy(trained["shards"], tmp_path / "shards")
    ids = np.fromfile(shards / "val.bin", dtype=np.uint16)
    ids[::5] = 60000
    ids.tofile(shards / "val.bin")
    one_line(cli("eval", trained["run"], "--data", shards, "--device", "cpu"), "holds the token id 60000, outside the model's vocabulary")


# ---- tokenizers --------------------------------------------------------------------------------------


def sparse_tokenizer(folder: Path) -> Path:
    """A tokenizer.json of four tokens, one of them numbered 1,000,000,000."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 3, "<|endoftext|>": 1, "<|unk|>": 2}, unk_token="<|unk|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    spec = json.loads(tokenizer.to_str())
    spec["model"]["vocab"]["b"] = 1_000_000_000  # by hand: the library would write every id up to it
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def test_a_tokenizer_with_ids_past_its_vocabulary(cli, tmp_path):
    folder = sparse_tokenizer(tmp_path / "sparse")
    (tmp_path / "text.txt").write_text("a b a\n\nb a b\n")
    one_line(cli("tokenize", "encode", tmp_path / "text.txt", "-t", folder, "-o", tmp_path / "shards"), "gives the token id 1,000,000,000", "4 tokens")
    assert not (tmp_path / "shards").exists()
    one_line(cli("tokenize", "show", "a b", "-t", folder), "gives the token id 1,000,000,000")


def test_a_tokenizer_with_a_huge_vocabulary(cli, tmp_path, trained_tokenizer, monkeypatch):
    import tfcli.tokenizer.core

    monkeypatch.setattr(tfcli.tokenizer.core, "MAX_VOCAB_SIZE", 100)  # the check, without a 4-million-token file
    one_line(cli("tokenize", "show", "the fox", "-t", trained_tokenizer), "has 320 tokens, more than tfcli supports (100)")


# ---- JSON nested past Python's recursion limit, in every file tfcli reads ----------------------------


def _deep_tokenizer(tmp_path, trained):
    folder = copy(trained["tokenizer"], tmp_path / "tok")
    (folder / "tokenizer.json").write_text(DEEP)
    return ["tokenize", "show", "hi", "-t", folder]


def _deep_tokenizer_config(tmp_path, trained):
    folder = copy(trained["run"], tmp_path / "run")
    (folder / "tokenizer_config.json").write_text(DEEP)
    return ["generate", folder, "-p", "hi", "-n", "1", "--device", "cpu"]


def _deep_run_config(tmp_path, trained):
    folder = copy(trained["run"], tmp_path / "run")
    (folder / "config.json").write_text(DEEP)
    return ["info", folder]


def _deep_meta(tmp_path, trained):
    shards = copy(trained["shards"], tmp_path / "shards")
    (shards / "meta.json").write_text(DEEP)
    return train_args(shards, tmp_path / "out", "--max-steps", "1")


def _deep_state(tmp_path, trained):
    folder = copy(trained["run"], tmp_path / "run")
    (folder / "trainer" / "state.json").write_text(DEEP)
    return train_args(trained["shards"], folder, "--max-steps", "4", "--resume")


def _deep_labels(tmp_path, trained):
    (tmp_path / "labels.jsonl").write_text(json.dumps({"text": "a", "label": "x"}) + "\n" + DEEP_OBJECT + "\n")
    return ["train", "finetune", "--init-from", trained["run"], "--task", "classify", "--data", tmp_path / "labels.jsonl", "-o", tmp_path / "out"]


def _deep_corpus_line(tmp_path, trained):
    (tmp_path / "corpus.jsonl").write_text(DEEP_OBJECT + "\n")
    return ["tokenize", "encode", tmp_path / "corpus.jsonl", "-t", trained["tokenizer"], "-o", tmp_path / "out"]


def _deep_hf_config(tmp_path, trained):
    assert run("export", trained["run"], "-o", tmp_path / "hf").code == 0
    (tmp_path / "hf" / "config.json").write_text(DEEP)
    return ["import", tmp_path / "hf", "-o", tmp_path / "out"]


def _deep_hf_index(tmp_path, trained):
    assert run("export", trained["run"], "-o", tmp_path / "hf").code == 0
    (tmp_path / "hf" / "model.safetensors").unlink()
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(DEEP)
    return ["import", tmp_path / "hf", "-o", tmp_path / "out"]


def _deep_special_tokens_map(tmp_path, trained):
    assert run("export", trained["run"], "-o", tmp_path / "hf").code == 0
    (tmp_path / "hf" / "special_tokens_map.json").write_text(DEEP)
    return ["import", tmp_path / "hf", "-o", tmp_path / "out"]


@pytest.mark.parametrize(
    "make, message",
    [
        (_deep_tokenizer, "is not a tokenizer.json"),
        (_deep_tokenizer_config, "tokenizer_config.json is not valid JSON (nested too deeply"),
        (_deep_run_config, "config.json is not valid JSON"),
        (_deep_meta, "meta.json is not valid JSON"),
        (_deep_state, "state.json is not valid JSON"),
        (_deep_labels, "line 2 is not valid JSON (nested too deeply)"),
        (_deep_corpus_line, "line 1 is not valid JSON"),
        (_deep_hf_config, "config.json is not valid JSON (nested too deeply"),
        (_deep_hf_index, "model.safetensors.index.json is not valid JSON (nested too deeply"),
        (_deep_special_tokens_map, "special_tokens_map.json is not valid JSON (nested too deeply"),
    ],
)
def test_json_nested_too_deeply_is_one_line(cli, trained, tmp_path, make, message):
    one_line(cli(*make(tmp_path, trained)), message)
    assert not (tmp_path / "out").exists()


def test_a_deeply_nested_metrics_line_ends_the_history(cli, trained, tmp_path):
    folder = copy(trained["run"], tmp_path / "run")
    with open(folder / "metrics.jsonl", "a") as handle:
        handle.write(DEEP + "\n")
    assert cli("info", folder).code == 0
    one_line(cli(*train_args(trained["shards"], folder, "--max-steps", "3", "--resume")), code=0)


# ---- a trainer state from another run; a metrics.jsonl of gigabytes -----------------------------------


def test_a_trainer_state_from_another_run_is_refused(cli, trained, tmp_path):
    other = tmp_path / "other"
    assert run(*train_args(trained["shards"], other, "--max-steps", "2", "--seed", "7")).code == 0
    folder = copy(trained["run"], tmp_path / "run")
    shutil.copy(other / "trainer" / "state.json", folder / "trainer" / "state.json")
    one_line(cli(*train_args(trained["shards"], folder, "--max-steps", "4", "--resume")), "the trainer state in", "does not belong to its model.safetensors")
    shutil.rmtree(folder / "trainer")
    shutil.copytree(other / "trainer", folder / "trainer")  # the whole folder, optimizer too
    one_line(cli(*train_args(trained["shards"], folder, "--max-steps", "4", "--resume")), "does not belong to its model.safetensors")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_a_metrics_file_of_gigabytes_costs_info_and_resume_nothing(cli, trained, tmp_path):
    folder = copy(trained["run"], tmp_path / "run")
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    with open(folder / "metrics.jsonl", "r+b") as handle:  # the records, then 3 GB of NUL bytes (sparse: no disk)
        handle.truncate(3 << 30)
    peak, began = _peak_rss_bytes(), time.perf_counter()
    shown = cli("info", folder, "--json")
    assert shown.code == 0 and json.loads(shown.stdout)["history"]["tail_only"]
    resumed = cli(*train_args(trained["shards"], folder, "--max-steps", "3", "--resume"))
    assert resumed.code == 0, resumed.stderr
    assert time.perf_counter() - began < 60 and _peak_rss_bytes() - peak < 1 << 30  # never read whole
    assert (folder / "metrics.jsonl").stat().st_size < 10_000  # the damage past the checkpoint's records is dropped
    assert [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()] == [*steps, 3]


# ---- safetensors headers that claim huge tensors --------------------------------------------------------


def claiming(names: list[str], shape=(1_000_000, 1_000_000)) -> bytes:
    """A safetensors file of a few hundred bytes whose header claims each tensor is `shape` float32 (4 TB);
    with one name, its offsets are consistent and only the file's size gives it away."""
    nbytes = 4 * shape[0] * shape[1]
    header = {name: {"dtype": "F32", "shape": list(shape), "data_offsets": [0, nbytes]} for name in names}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(64)


def tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        return list(handle.keys())


def test_run_weights_that_claim_terabytes(cli, trained, tmp_path):
    folder = copy(trained["run"], tmp_path / "run")
    names = tensor_names(folder / "model.safetensors")
    for data in (claiming(names), claiming(names[:1])):
        (folder / "model.safetensors").write_bytes(data)
        edit_json(folder / "config.json", lambda c, n=len(data): c.update(weights_bytes=n))  # the size agrees: the header is what lies
        peak = _peak_rss_bytes()
        one_line(cli("generate", folder, "-p", "hi", "-n", "1", "--device", "cpu"), "model.safetensors is not a valid safetensors file")
        one_line(cli("export", folder, "-o", tmp_path / "out"), "not a valid safetensors file")
        shown = cli("info", folder)
        assert shown.code == 1 and "not a valid safetensors file" in shown.stdout
        assert _peak_rss_bytes() - peak < 1 << 30
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 62) + b"{}")  # a header length of exabytes
    edit_json(folder / "config.json", lambda c: c.update(weights_bytes=10))
    one_line(cli("generate", folder, "-p", "hi", "-n", "1", "--device", "cpu"), "header too large")


def test_optimizer_state_that_claims_terabytes(cli, trained, tmp_path):
    folder = copy(trained["run"], tmp_path / "run")
    optimizer = folder / "trainer" / "optimizer.safetensors"
    names = tensor_names(optimizer)
    for data in (claiming(names), claiming(names[:1]), optimizer.read_bytes()[:100]):
        optimizer.write_bytes(data)
        one_line(cli(*train_args(trained["shards"], folder, "--max-steps", "4", "--resume")), "optimizer.safetensors is not a valid safetensors file")


def test_hugging_face_weights_that_claim_terabytes(cli, trained, tmp_path):
    hf = tmp_path / "hf"
    assert run("export", trained["run"], "-o", hf).code == 0
    names = tensor_names(hf / "model.safetensors")
    (hf / "model.safetensors").write_bytes(claiming(names))
    one_line(cli("import", hf, "-o", tmp_path / "out"), "model.safetensors is not a valid safetensors file")
    (hf / "model.safetensors").unlink()  # shards, the second of which lies
    (hf / "model-00001-of-00002.safetensors").write_bytes(claiming(names[:2], shape=(2, 2)))
    (hf / "model-00002-of-00002.safetensors").write_bytes(claiming(names[2:]))
    weight_map = {name: f"model-0000{1 if i < 2 else 2}-of-00002.safetensors" for i, name in enumerate(names)}
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    one_line(cli("import", hf, "-o", tmp_path / "out"), "is not a valid safetensors file")
    assert not (tmp_path / "out").exists()


# ---- arbitrary bytes in every file a command reads (a property test) ---------------------------------

EXAMPLES = int(os.environ.get("TFCLI_SWEEP_EXAMPLES", "0"))
SNIPPETS = [b"NaN", b"-Infinity", b"-3", b"1e999", b"\x00", b"\xff\xfe", b"[" * 3000, b'{"a": ' * 3000, b"\n" * 50, b'"\\ud800"', b"null", b"{}", b"[]"]
PEAK_BOUND = 512 << 20  # what the worst example may add to this process's peak RSS
seen: dict[str, list[int]] = {}  # reader -> peak RSS added by each example (bytes)


def hostile_bytes(valid: bytes):
    """Arbitrary bytes, or `valid` cut short, or with a hostile snippet spliced in or written over it."""
    from hypothesis import strategies as st

    cut = st.integers(0, len(valid)).map(lambda i: valid[:i])
    spliced = st.tuples(st.integers(0, len(valid)), st.sampled_from(SNIPPETS), st.booleans()).map(
        lambda t: valid[: t[0]] + t[1] + valid[t[0] + (len(t[1]) if t[2] else 0) :]
    )
    flipped = st.tuples(st.integers(0, max(len(valid) - 1, 0)), st.integers(1, 255)).map(
        lambda t: valid[: t[0]] + bytes([valid[t[0]] ^ t[1]]) + valid[t[0] + 1 :] if valid else b""
    )
    return st.one_of(st.binary(max_size=3000), cut, spliced, flipped)


def _library(call) -> Any:
    """A library reader: success, or one TfcliError of one line."""
    from tfcli.errors import TfcliError

    try:
        return call()
    except TfcliError as exc:
        assert "\n" not in str(exc), str(exc)
        return exc


def _command(*args, codes=(0, 2)) -> None:
    result = run(*args)
    assert "Traceback" not in result.stderr and result.code in codes, (args, result.code, result.stderr[-2000:])
    if result.code == 2:
        assert result.stderr.rstrip("\n").split("\n")[-1].startswith("error: "), result.stderr


def _reader_cases(trained: dict[str, Path], folder: Path) -> dict[str, tuple[Path, Any]]:
    """Reader name -> (the file the bytes go in, what reads it)."""
    from tfcli.data.chat import read_conversations
    from tfcli.data.labeled import read_labeled
    from tfcli.data.shards import load_shard_meta
    from tfcli.train.state import find_trainer_state, read_metrics, read_optimizer_tensors

    run_dir = folder / "run"
    shards = folder / "shards"
    tok = folder / "tok"
    generate = ("generate", run_dir, "-p", "hi", "-n", "1", "--device", "cpu")
    return {
        "prompt file": (folder / "prompts.txt", lambda p: _command("generate", trained["run"], "--prompt-file", p, "-n", "1", "--device", "cpu")),
        "corpus text": (folder / "corpus.txt", lambda p: _command("tokenize", "encode", p, "-t", trained["tokenizer"], "-o", folder / "out")),
        "corpus JSON lines": (folder / "corpus.jsonl", lambda p: _command("tokenize", "encode", p, "-t", trained["tokenizer"], "-o", folder / "out")),
        "corpus gzip": (folder / "corpus.txt.gz", lambda p: _command("tokenize", "encode", p, "-t", trained["tokenizer"], "-o", folder / "out")),
        "labeled JSON lines": (folder / "labels.jsonl", lambda p: _library(lambda: read_labeled(p, "classify"))),
        "chat JSON lines": (folder / "chat.jsonl", lambda p: _library(lambda: read_conversations(p, "chat"))),
        "run config.json": (run_dir / "config.json", lambda p: _command(*generate)),
        "tokenizer.json": (tok / "tokenizer.json", lambda p: _command("tokenize", "show", "hi", "-t", tok)),
        "tokenizer_config.json": (run_dir / "tokenizer_config.json", lambda p: _command(*generate)),
        "trainer state.json": (run_dir / "trainer" / "state.json", lambda p: _library(lambda: find_trainer_state(run_dir))),
        "metrics.jsonl": (run_dir / "metrics.jsonl", lambda p: (_library(lambda: read_metrics(p)), _command("info", run_dir, codes=(0, 1, 2)))),
        "shards meta.json": (shards / "meta.json", lambda p: _library(lambda: load_shard_meta(shards))),
        "model.safetensors": (run_dir / "model.safetensors", lambda p: _command(*generate)),
        "optimizer.safetensors": (run_dir / "trainer" / "optimizer.safetensors", lambda p: _library(lambda: read_optimizer_tensors(p))),
    }


def _valid(name: str, path: Path) -> bytes:
    if name == "corpus gzip":
        import gzip

        return gzip.compress((TINY_TEXT * 3).encode())
    if path.is_file():
        data = path.read_bytes()
        return data[:3000] if name == "model.safetensors" or name == "optimizer.safetensors" else data
    return {
        "prompt file": b"Once upon a time\nthe fox\n",
        "corpus text": (TINY_TEXT * 2).encode(),
        "corpus JSON lines": b'{"text": "the fox"}\n{"text": "a ball"}\n',
        "labeled JSON lines": b'{"text": "the fox", "label": "pos"}\n{"text": "a dog", "label": "neg"}\n',
        "chat JSON lines": b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n',
    }[name]


READERS = ["prompt file", "corpus text", "corpus JSON lines", "corpus gzip", "labeled JSON lines", "chat JSON lines", "run config.json", "tokenizer.json"]
READERS += ["tokenizer_config.json", "trainer state.json", "metrics.jsonl", "shards meta.json", "model.safetensors", "optimizer.safetensors"]


@pytest.fixture(scope="module")
def report_peaks():
    yield
    if seen:
        worst = max(seen, key=lambda k: max(seen[k]))
        print(f"\nhostile files tried per reader: {', '.join(f'{k} {len(v)}' for k, v in seen.items())}")
        print(f"worst peak RSS added: {max(seen[worst]) / 1e6:.1f} MB ({worst}); bound {PEAK_BOUND >> 20} MB")


@pytest.mark.parametrize("reader", READERS)
def test_arbitrary_bytes_in_every_file_a_command_reads(trained, tmp_path_factory, report_peaks, reader):
    """Any bytes in the file give success or one line and exit 2 (a damaged run: `info` exit 1), and the
    process's peak memory grows by less than PEAK_BOUND, whatever the bytes (measured with `resource`)."""
    from hypothesis import HealthCheck, Phase, given, settings

    folder = tmp_path_factory.mktemp("bytes")
    shutil.copytree(trained["run"], folder / "run")
    shutil.copytree(trained["shards"], folder / "shards")
    shutil.copytree(trained["tokenizer"], folder / "tok")
    target, read = _reader_cases(trained, folder)[reader]
    valid = _valid(reader, target)
    pristine = target.read_bytes() if target.is_file() else None

    @settings(
        max_examples=EXAMPLES or 6, deadline=None, suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate), derandomize=not EXAMPLES
    )
    @given(data=hostile_bytes(valid))
    def check(data: bytes) -> None:
        target.write_bytes(data)
        if reader == "model.safetensors":  # the size agrees with config.json: the header is what is read
            edit_json(folder / "run" / "config.json", lambda c: c.update(weights_bytes=len(data)))
        before = _peak_rss_bytes()
        read(target)
        seen.setdefault(reader, []).append(_peak_rss_bytes() - before)
        assert _peak_rss_bytes() - before < PEAK_BOUND
        shutil.rmtree(folder / "out", ignore_errors=True)

    try:
        check()
    finally:
        if pristine is not None:
            target.write_bytes(pristine)
