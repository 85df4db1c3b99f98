"""Bounded by design (docs/limits.md): no input exhausts memory or ends in a traceback, and a crash leaves
no garbage. Each case gets one line and exit 2 (or the documented handling) with nothing on disk changed:
unbounded reads (prompt files, stdin, records, decompression, JSON and tokenizer files), resource options,
non-finite and impossible numbers read back, hostile chat templates, a truncated .zst, crash leftovers, deep
TOML and odd paths, shards changed in place, misleading messages, and the browser tests in CI. The cases
where memory is the point run in a subprocess under an address-space cap (RLIMIT_AS)."""

from __future__ import annotations

import errno
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, TINY_TEXT, snapshot
from tests.helpers import run

TINY = ["--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "eval_batches=1"]
MEMORY_CAP = 3 << 30  # address space for a subprocess: torch's import maps about 1.5 GB of it


def one_line(result, *needles: str) -> str:
    """Exit 2 and one `error:` line, the last on stderr, holding each needle; returns the line."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 2, (result.code, result.stderr[-2000:])
    last = result.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith("error: "), result.stderr
    for needle in needles:
        assert needle in last, (needle, last)
    return last


@pytest.fixture(scope="module", autouse=True)
def quick_training():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tfcli.train.setup.peak_matmul_flops", lambda *args, **kwargs: 1e12)
        patch.setattr("tfcli.train.loop.plot_loss_curve", lambda *args, **kwargs: False)
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """A decoder run (random weights), shards of the tiny text, and a run trained on them for two steps."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    root = tmp_path_factory.mktemp("bounded")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    save_checkpoint(root / "decoder", Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=16)), tokenizer)
    (root / "corpus.txt").write_text(TINY_TEXT * 30, encoding="utf-8")
    encode_corpus(resolve_corpus([root / "corpus.txt"]), tokenizer, root / "shards", val_fraction=0.2)
    assert run(*train_args(root / "shards", root / "trained", "--max-steps", "2")).code == 0
    return {"root": root, "tokenizer": trained_tokenizer, "decoder": root / "decoder", "shards": root / "shards", "trained": root / "trained"}


def train_args(shards: Path, out: Path, *extra) -> list:
    return ["train", "pretrain", "--data", shards, "-o", out, "--block-size", "16", "--batch-size", "4", "--device", "cpu", *TINY, *extra]


def capped(args: list, feed: int = 0, cap: int = MEMORY_CAP) -> tuple[subprocess.CompletedProcess, int]:
    """`tfcli ARGS` in a process whose address space is capped at `cap`, with `feed` bytes of "a" and no
    newline piped to its stdin (the pipe closes when it stops reading); returns it and its peak RSS in bytes."""
    import threading

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    code = (
        "import resource, sys\n"
        "from tfcli.cli.app import main\n"
        "try:\n    main(sys.argv[1:])\nfinally:\n"
        # VmHWM is this process's own peak: ru_maxrss keeps the forking parent's (a test session's gigabyte) across exec
        "    status = open('/proc/self/status').read() if sys.platform.startswith('linux') else ''\n"
        "    hwm = [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith('VmHWM:')]\n"
        "    print('PEAK', hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE if feed else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
        cwd=REPO,
    )

    def write() -> None:
        block = b"a" * (1 << 20)
        try:
            for _ in range(feed >> 20):
                process.stdin.buffer.write(block)
            process.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the reader stopped reading: what the test wants

    writer = threading.Thread(target=write, daemon=True)
    if feed:
        writer.start()
    out, err = process.communicate(timeout=300) if not feed else (process.stdout.read(), process.stderr.read())
    process.wait(timeout=300)
    peak = int(err.rsplit("PEAK ", 1)[1].split()[0])
    return subprocess.CompletedProcess(args, process.returncode, out, err.rsplit("PEAK ", 1)[0]), peak


# ---- 1. unbounded reads ----------------------------------------------------------------------------------


def test_a_prompt_file_of_dev_zero_stops_after_one_block(world):
    done, peak = capped(["generate", world["decoder"], "--prompt-file", "/dev/zero", "-n", "2", "--device", "cpu"])
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        "error: /dev/zero looks like a binary file (it holds NUL bytes); pass a text file with one prompt per line"
    ), done.stderr
    print(f"--prompt-file /dev/zero: peak RSS {peak / 1e6:.0f} MB")


def test_a_300_mb_line_on_stdin_stops_at_what_the_context_can_use(world):
    done, peak = capped(["generate", world["decoder"], "--prompt-file", "-", "-n", "2", "--device", "cpu"], feed=300 << 20)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "stdin line 1 is longer than 4 KiB, more than the context (32 tokens) can use" in last, done.stderr
    assert peak < 1 << 30
    print(f"a 300 MB line on stdin: peak RSS {peak / 1e6:.0f} MB")


def test_prompt_files_within_their_caps(world, tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"\xef\xbb\xbfOnce upon\r\n\n  \nthe fox\n")
    result = run("generate", world["decoder"], "--prompt-file", prompts, "-n", "1", "--device", "cpu", "--json")
    assert result.code == 0, result.stderr
    assert [c["prompt"] for c in result.json()["completions"]] == ["Once upon", "the fox"]
    monkeypatch.setenv("TFCLI_MAX_PROMPTS", "1")
    one_line(run("generate", world["decoder"], "--prompt-file", prompts, "-n", "1", "--device", "cpu"), "more than 1 prompts", "TFCLI_MAX_PROMPTS")
    monkeypatch.setenv("TFCLI_MAX_PROMPTS", "many")
    one_line(
        run("generate", world["decoder"], "--prompt-file", prompts, "-n", "1", "--device", "cpu"), "TFCLI_MAX_PROMPTS='many' is not a positive whole number"
    )
    monkeypatch.delenv("TFCLI_MAX_PROMPTS")
    monkeypatch.setenv("TFCLI_MAX_PROMPT_FILE_BYTES", "10")
    one_line(
        run("generate", world["decoder"], "--prompt-file", prompts, "-n", "1", "--device", "cpu"), "is larger than 10 bytes", "TFCLI_MAX_PROMPT_FILE_BYTES"
    )


def test_a_long_line_in_a_conversation_is_dropped_and_the_conversation_goes_on(world, monkeypatch):
    import io

    stdin = io.TextIOWrapper(io.BytesIO(b"a" * 100_000 + b"\nhello\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    result = run("generate", world["decoder"], "--interactive", "-n", "2", "--device", "cpu")
    assert result.code == 0 and "that line is longer than 4,096 bytes" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_one_record_past_its_cap(world, tmp_path, monkeypatch):
    data = tmp_path / "corpus.jsonl"
    data.write_text(json.dumps({"text": "short"}) + "\n" + json.dumps({"text": "x" * 5000}) + "\n", encoding="utf-8")
    monkeypatch.setenv("TFCLI_MAX_RECORD_CHARS", "1K")
    one_line(
        run("tokenize", "encode", data, "-t", world["tokenizer"], "-o", tmp_path / "out"),
        "corpus.jsonl line 2 is longer than 1,024 characters",
        "TFCLI_MAX_RECORD_CHARS",
    )
    assert not (tmp_path / "out").exists()


def test_a_gzip_bomb_is_stopped_by_the_ratio(world, tmp_path, monkeypatch):
    monkeypatch.setattr("tfcli.corpus.formats.DECOMPRESSION_FREE", 1 << 20)
    bomb = tmp_path / "bomb.txt.gz"
    bomb.write_bytes(gzip.compress(b"the fox " * (2 << 20), compresslevel=9))  # 16 MiB that gzip packs about 1,000x
    assert (16 << 20) / bomb.stat().st_size > 200
    one_line(
        run("tokenize", "encode", bomb, "-t", world["tokenizer"], "-o", tmp_path / "out"), "decompresses to more than 200x", "TFCLI_MAX_DECOMPRESSION_RATIO"
    )
    assert not (tmp_path / "out").exists()


def test_a_truncated_zst_is_one_line_as_gz_and_xz_are(world, tmp_path):
    zstandard = pytest.importorskip("zstandard")
    whole = zstandard.ZstdCompressor().compress((TINY_TEXT * 200).encode())
    (tmp_path / "whole.txt.zst").write_bytes(whole)
    assert run("tokenize", "encode", tmp_path / "whole.txt.zst", "-t", world["tokenizer"], "-o", tmp_path / "ok").code == 0
    (tmp_path / "cut.txt.zst").write_bytes(whole[: len(whole) // 2])
    one_line(
        run("tokenize", "encode", tmp_path / "cut.txt.zst", "-t", world["tokenizer"], "-o", tmp_path / "out"),
        "is damaged or truncated (zstd: the file ends inside a frame)",
    )
    assert not (tmp_path / "out").exists()


def test_zstd_frames_are_followed_to_their_end():
    zstandard = pytest.importorskip("zstandard")
    from tfcli.corpus.formats import ZstdFrames

    text = (TINY_TEXT * 50).encode()
    skippable = b"\x50\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"abc"
    streams = [  # each a list of frames; a cut where a frame ends leaves a whole (shorter) stream, undetectable by design
        [zstandard.ZstdCompressor().compress(text)],
        [zstandard.ZstdCompressor(write_checksum=True, write_content_size=False).compress(text), skippable, zstandard.ZstdCompressor().compress(b"")],
        [zstandard.ZstdCompressor(level=1).compress(os.urandom(300_000))],  # raw blocks
        [zstandard.ZstdCompressor().compress(b"a" * 500_000)],  # RLE blocks
    ]
    for pieces in streams:
        data = b"".join(pieces)
        ends = {sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces))}
        for cut in sorted({*range(0, len(data), max(1, len(data) // 97)), *ends, *(e - 1 for e in ends)}):
            frames = ZstdFrames()
            for i in range(0, cut, 1000):  # fed in pieces, as a stream reads
                frames.feed(data[i : min(cut, i + 1000)])
            assert frames.complete() == (cut in ends), (len(data), cut)


@pytest.mark.parametrize(
    "env, value, where, command",
    [
        ("TFCLI_MAX_JSON_BYTES", "100", "config.json is larger than 100 bytes", "generate"),
        ("TFCLI_MAX_TOKENIZER_BYTES", "1K", "tokenizer.json is larger than 1 KiB", "show"),
        ("TFCLI_MAX_JSON_BYTES", "50", "meta.json is larger than 50 bytes", "train"),
    ],
)
def test_json_files_past_their_cap(world, tmp_path, monkeypatch, env, value, where, command):
    args = {
        "generate": ["generate", world["decoder"], "-p", "hi", "-n", "1", "--device", "cpu"],
        "show": ["tokenize", "show", "hi", "-t", world["tokenizer"]],
        "train": train_args(world["shards"], tmp_path / "out", "--max-steps", "1"),
    }[command]
    monkeypatch.setenv(env, value)
    one_line(run(*args), where, env)
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_json_nested_100k_deep_is_too_deep_not_a_syntax_error(tmp_path):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line(run("tokenize", "show", "hi", "-t", tmp_path / "tok"), "is not a tokenizer.json (nested too deeply)")


# ---- 2. resource options ---------------------------------------------------------------------------------


def test_threads_past_the_machine_are_refused(world):
    from tfcli.runtime import usable_cores

    for threads in (100_000, usable_cores() + 1, -1):
        one_line(run("generate", world["decoder"], "-p", "hi", "-n", "1", "--device", "cpu", "--threads", threads), f"usable cores, not {threads:,}")
    assert run("generate", world["decoder"], "-p", "hi", "-n", "1", "--device", "cpu", "--threads", usable_cores()).code == 0


def test_a_batch_no_memory_holds_is_refused_before_anything_is_written(world, tmp_path):
    one_line(
        run(*train_args(world["shards"], tmp_path / "out", "--max-steps", "1", "--batch-size", "100000000")), "--batch-size 100,000,000", "for its activations"
    )
    assert not (tmp_path / "out").exists()


def test_a_tiny_temperature_decodes_greedily(world):
    base = ["generate", world["decoder"], "-p", "the fox", "-n", "6", "--device", "cpu", "--json"]
    greedy = run(*base)
    for temperature in ("1e-38", "1e-30", "0.0001"):
        tiny = run(*base, "--strategy", "sample", "--temperature", temperature, "--seed", "3")
        assert tiny.code == 0 and tiny.json()["completions"][0]["text"] == greedy.json()["completions"][0]["text"], tiny.stderr


@pytest.mark.parametrize(
    "option, value",
    [("--num-beams", "100000"), ("--num-samples", "100000"), ("--batch-size", "0"), ("--max-new-tokens", "0"), ("--max-new-tokens", str(10**30))],
)
def test_decoding_counts_out_of_range(world, option, value):
    args = ["generate", world["decoder"], "-p", "hi", "--device", "cpu", option, value]
    args += ["--strategy", "beam"] if option == "--num-beams" else ["--strategy", "sample"] if option == "--num-samples" else []
    one_line(run(*args), option)


# ---- 3. non-finite and impossible numbers read back ------------------------------------------------------


def test_a_nan_in_a_hugging_face_config(world, tmp_path):
    hf = tmp_path / "hf"
    assert run("export", world["decoder"], "-o", hf).code == 0
    config = json.loads((hf / "config.json").read_text())
    config["layer_norm_epsilon"] = float("nan")
    (hf / "config.json").write_text(json.dumps(config))
    one_line(run("import", hf, "-o", tmp_path / "out"), "config.json is not valid JSON (layer_norm_epsilon is nan")
    assert not (tmp_path / "out").exists()


def test_a_nan_in_metrics_jsonl_ends_the_history_on_resume(world, tmp_path):
    folder = Path(shutil.copytree(world["trained"], tmp_path / "run"))
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    lines[-1] = lines[-1].replace('"loss": ', '"loss": NaN, "was": ', 1)
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = run(*train_args(world["shards"], folder, "--max-steps", "3", "--resume"))
    assert result.code == 0 and "Traceback" not in result.stderr, result.stderr
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert steps == [*range(1, len(lines)), 3]


@pytest.mark.parametrize("key, value", [("step", -3), ("tokens_seen", -1), ("world_size", 0), ("best_val_loss", -2.5), ("elapsed_seconds", "NaN")])
def test_impossible_numbers_in_trainer_state(world, tmp_path, key, value):
    folder = Path(shutil.copytree(world["trained"], tmp_path / "run"))
    state = folder / "trainer" / "state.json"
    state.write_text(_set_key(state.read_text(), key, value))
    before = snapshot(folder)
    line = one_line(run(*train_args(world["shards"], folder, "--max-steps", "4", "--resume")), "state.json")
    assert key in line
    assert snapshot(folder) == before


def _set_key(text: str, key: str, value) -> str:
    data = json.loads(text)
    data[key] = "@@" if value == "NaN" else value
    return json.dumps(data).replace('"@@"', "NaN")


# ---- 4. hostile chat templates ---------------------------------------------------------------------------

HOSTILE_TEMPLATES = {
    "range": ("{% for i in range(10**9) %}x{% endfor %}", "template line 1: OverflowError"),
    "divide": ("fine\n{{ 1/0 }}", "template line 2: ZeroDivisionError"),
    "recursion": ("{% macro f(x) %}{{ f(x) }}{% endmacro %}\n\n{{ f(1) }}", "nests too deeply"),
    "empty": (" \n", "is empty"),
    "repeat": ("{{ 'a' * 4000000000 }}", "a repetition of 4,000,000,000"),
    "power": ("{{ 7 ** 10000000 }}", "a power 7 ** 10000000"),
    "output": ("{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}", "TFCLI_MAX_CHAT_TEMPLATE_CHARS"),
    "syntax": ("{% for %}", "is not valid Jinja (template line 1"),
    "attribute": ("{{ messages.__class__.__mro__[1].__subclasses__() }}", "failed to render"),
    "keyerror": ("{{ messages[0]['nope']['deeper'] }}", "failed to render"),
}


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_hostile_chat_templates(trained_tokenizer, name):
    from tfcli.errors import TfcliError
    from tfcli.tokenizer.chat_template import ChatTemplate, Message
    from tfcli.tokenizer.core import TextTokenizer

    source, needle = HOSTILE_TEMPLATES[name]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TfcliError) as caught:
        ChatTemplate(source, TextTokenizer.load(trained_tokenizer), "t.jinja").render([Message("user", "hi")])
    assert needle in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024 < 512 << 20


def test_a_hostile_template_file_through_the_command(world, tmp_path):
    (tmp_path / "t.jinja").write_text("{{ 1/0 }}")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n")
    args = ["train", "finetune", "--init-from", world["decoder"], "--task", "chat", "--data", chat, "--chat-template", tmp_path / "t.jinja"]
    one_line(run(*args, "-o", tmp_path / "out", "--max-steps", "1", "--device", "cpu"), "template line 1: ZeroDivisionError")
    assert not (tmp_path / "out").exists()


# ---- 6. crash leftovers ----------------------------------------------------------------------------------


def test_a_resume_removes_the_stale_temp_files_of_a_killed_save_and_says_so(world, tmp_path):
    folder = Path(shutil.copytree(world["trained"], tmp_path / "run"))
    stale = [folder / ".model.safetensors.k2j4_x9q.tmp", folder / ".tokenizer.json.abcdefgh.tmp", folder / "best" / ".config.json.12345678.tmp"]
    for path in stale:
        path.write_bytes(b"x" * 1000)
    mine = [folder / ".notes.txt.abcdefgh.tmp", folder / "model.safetensors.abcdefgh.tmp", folder / ".model.safetensors.tmp"]  # not tfcli's naming
    for path in mine:
        path.write_bytes(b"keep")
    result = run(*train_args(world["shards"], folder, "--max-steps", "3", "--resume"))
    assert result.code == 0, result.stderr
    assert "removed 2 temporary files left by an interrupted run in" in result.stderr and ".model.safetensors.k2j4_x9q.tmp" in result.stderr
    assert "removed 1 temporary file left by an interrupted run in" in result.stderr
    assert not any(p.exists() for p in stale) and all(p.read_bytes() == b"keep" for p in mine)


def test_an_encode_removes_the_shard_files_of_dead_writers_only(world, tmp_path):
    out = Path(shutil.copytree(world["shards"], tmp_path / "shards"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (out / f".train.bin.{dead}.tmp").write_bytes(b"\0" * 100)
    (out / f".val.bin.{os.getppid()}.tmp").write_bytes(b"\0" * 100)  # a live writer's (this test's parent stands in)
    (out / ".meta.json.abcdefgh.tmp").write_bytes(b"{}")  # just written: maybe a live encode's
    result = run("tokenize", "encode", world["root"] / "corpus.txt", "-t", world["tokenizer"], "-o", out)
    assert result.code == 0 and f"removed 1 temporary file left by an interrupted run in {out}: .train.bin.{dead}.tmp" in result.stderr, result.stderr
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == sorted([f".val.bin.{os.getppid()}.tmp", ".meta.json.abcdefgh.tmp"])


# ---- 7. deep TOML, paths that are not UTF-8 ------------------------------------------------------------


def test_a_deeply_nested_toml_config(world, tmp_path):
    (tmp_path / "deep.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    one_line(
        run(*train_args(world["shards"], tmp_path / "out", "--config", tmp_path / "deep.toml")),
        "deep.toml's nesting goes past 64 levels",
        "TFCLI_MAX_TOML_DEPTH",
    )
    assert not (tmp_path / "out").exists()


def test_an_output_path_that_is_not_utf8_is_refused_up_front(world, tmp_path):
    out = Path(os.fsdecode(bytes(tmp_path) + b"/run_\xff"))
    one_line(run(*train_args(world["shards"], out, "--max-steps", "1")), "is not UTF-8", "safetensors")
    one_line(run("export", world["decoder"], "-o", out), "is not UTF-8")
    assert list(tmp_path.iterdir()) == []


# ---- 8. shards changed in place --------------------------------------------------------------------------


def test_shards_shuffled_in_place_stop_a_resume(world, tmp_path, monkeypatch):
    shards = Path(shutil.copytree(world["shards"], tmp_path / "shards"))
    folder = tmp_path / "run"
    assert run(*train_args(shards, folder, "--max-steps", "2")).code == 0
    ids = np.fromfile(shards / "train.bin", dtype=np.uint16)
    np.random.default_rng(0).shuffle(ids)
    ids.tofile(shards / "train.bin")  # the same count, so meta.json's sizes still agree
    before = snapshot(folder)
    one_line(run(*train_args(shards, folder, "--max-steps", "3", "--resume")), "train.bin is not the file meta.json describes (its sampled blocks differ")
    monkeypatch.setenv("TFCLI_VERIFY_SHARDS", "full")
    one_line(run(*train_args(shards, folder, "--max-steps", "3", "--resume")), "its sha256 differs")
    assert snapshot(folder) == before


def test_shards_without_checks_still_train_and_a_copy_passes(world, tmp_path):
    shards = Path(shutil.copytree(world["shards"], tmp_path / "shards"))  # copied: new mtimes, so the blocks are hashed
    assert run(*train_args(shards, tmp_path / "a", "--max-steps", "1")).code == 0
    meta = json.loads((shards / "meta.json").read_text())
    del meta["checks"]  # as tfcli wrote it before this check
    (shards / "meta.json").write_text(json.dumps(meta))
    assert run(*train_args(shards, tmp_path / "b", "--max-steps", "1")).code == 0


# ---- 9. messages that mislead ----------------------------------------------------------------------------


def test_a_brand_new_run_on_a_full_disk_says_there_was_no_checkpoint_and_leaves_no_folder(world, tmp_path, monkeypatch):
    import safetensors.torch

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    line = one_line(run(*train_args(world["shards"], tmp_path / "out", "--max-steps", "2")), "No space left on device")
    assert "is intact" not in line and ("saved no checkpoint yet" in line or "there was no best checkpoint before" in line), line
    assert not (tmp_path / "out").exists()


def test_a_bad_token_id_at_step_one_leaves_no_folder(world, tmp_path):
    shards = Path(shutil.copytree(world["shards"], tmp_path / "shards"))
    ids = np.fromfile(shards / "train.bin", dtype=np.uint16)
    ids[:] = 60000
    ids.tofile(shards / "train.bin")
    meta = json.loads((shards / "meta.json").read_text())
    del meta["checks"]
    (shards / "meta.json").write_text(json.dumps(meta))
    one_line(run(*train_args(shards, tmp_path / "out", "--max-steps", "1")), "60000")
    assert not (tmp_path / "out").exists()


# ---- 10. the browser tests fail in CI where there is no browser -----------------------------------------


def test_browser_tests_fail_in_ci_without_a_browser(monkeypatch):
    from tests import helpers

    monkeypatch.setattr(helpers, "chromium", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        helpers.require_chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        helpers.require_chromium()


def test_a_text_past_the_token_cap_is_one_line_before_it_is_held(world, tmp_path, monkeypatch):
    text = tmp_path / "long.txt"
    text.write_text("the fox ran over the hill.\n\n" * 2000, encoding="utf-8")
    assert run("eval", world["decoder"], "--data", text, "--device", "cpu").code == 0
    monkeypatch.setenv("TFCLI_MAX_TEXT_TOKENS", "1000")
    one_line(run("eval", world["decoder"], "--data", text, "--device", "cpu"), "holds more than 1,000 tokens", "tokenize encode", "TFCLI_MAX_TEXT_TOKENS")


def test_a_long_text_file_for_a_window_view_is_refused_or_cropped_before_it_is_tokenized(world, tmp_path):
    """inspect-attention --text-file of one 100 MB line once took 20 GB and five minutes to say the text was
    longer than the block size: every token of it was made into a view first (and with --crop, the title split
    every word). Past what the block size can hold (128 bytes a token at most), it is refused, or cut."""
    text = tmp_path / "long.txt"
    text.write_text("word " * 2_000_000, encoding="utf-8")  # 10 MB, 2 M tokens
    for command in ("inspect-attention", "inspect-logits", "inspect-ablate"):
        done, peak = capped([command, world["decoder"], "--text-file", text, "--device", "cpu"])
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2 and "the text is 10,000,000 characters, more than the model's block size (32 tokens) can hold" in last, done.stderr
    done, peak = capped(["inspect-attention", world["decoder"], "--text-file", text, "--crop", "--device", "cpu"])
    assert done.returncode == 0 and "32 tokens" in done.stdout.splitlines()[0], done.stdout  # the note on the crop is in --json
    assert peak < 1 << 30
    print(f"inspect-attention --crop of a 10 MB line: peak RSS {peak / 1e6:.0f} MB")
