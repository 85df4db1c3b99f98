"""More bugs a newcomer met: an SAE from another run taken without a word, an encode into a run directory
or two at once into one folder, a GGUF export to a folder, token-id prompts the server misreported, and a
small JSON file that cost its cap in memory. Bad input is one line (exit 2) or one clear 400."""

from __future__ import annotations

import fcntl
import importlib.util
import io
import json
import os
import shutil
import tracemalloc
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_TEXT, snapshot
from tests.helpers import missing_tool, one_line
from tfcli.checkpoint import save_checkpoint
from tfcli.errors import TfcliError
from tfcli.fsutil import exclusive_lock
from tfcli.limits import JSON_FILE, Limit, read_capped, read_file_capped
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.sae.files import sae_config, save_sae
from tfcli.sae.model import SparseAutoencoder
from tfcli.tokenizer.core import TextTokenizer

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """Two tiny GPT-2-shaped runs of one shape (random weights, two seeds): "mine" and "other"."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=32, d_ff=64)
    root = tmp_path_factory.mktemp("newcomer-more")
    folders = {}
    for seed, name in enumerate(("mine", "other")):
        torch.manual_seed(seed)
        save_checkpoint(root / name, Transformer(config), tokenizer)
        folders[name] = root / name
    return folders


# ---- an SAE from another run ---------------------------------------------------------------------------------


def _sae(folder: Path, hook: str = HOOK, **metadata) -> Path:
    torch.manual_seed(0)
    sae = SparseAutoencoder(32, 64, "topk", k=4)
    save_sae(folder, sae, sae_config(sae, hook, **metadata))
    return folder


def _sae_commands(run: Path, sae: Path, shards: Path) -> list[list]:
    return [
        ["generate", run, "-p", "the fox", "-n", "2", "--steer", f"{sae}:3:2"],
        ["inspect-features", run, "--sae", sae, "--text", "the fox"],
        ["eval", run, "--sae", sae, "--data", shards, "--device", "cpu"],
    ]


def test_an_sae_used_on_another_run_of_its_shape_says_so_in_a_note(cli, runs, shards, tmp_path):
    """An SAE trained on one run was taken without a word by another run of the same width."""
    sae = _sae(tmp_path / "sae", tfcli_run=str(runs["mine"].resolve()))
    for args in _sae_commands(runs["other"], sae, shards):
        result = cli(*args)
        assert result.code == 0, (args, result.stderr)
        note = f"note: the SAE in {sae} was trained on {runs['mine'].resolve()}, not {runs['other']}"
        assert note in result.stderr.replace("\n", " ") and "error" not in result.stderr, (args, result.stderr)
    for args in _sae_commands(runs["mine"], sae, shards):
        result = cli(*args)
        assert result.code == 0 and "was trained on" not in result.stderr, (args, result.stderr)


def test_an_sae_that_names_its_run_relatively_or_names_none_gets_no_note(cli, runs, shards, tmp_path, monkeypatch):
    monkeypatch.chdir(runs["mine"].parent)
    relative = _sae(tmp_path / "relative", tfcli_run="mine")  # as `tfcli train sae` recorded it before
    foreign = _sae(tmp_path / "saelens")  # SAELens's own SAEs name no tfcli run
    for sae in (relative, foreign):
        result = cli("generate", runs["mine"], "-p", "the fox", "-n", "2", "--steer", f"{sae}:3:2")
        assert result.code == 0 and "was trained on" not in result.stderr, result.stderr
    result = cli("generate", Path("other"), "-p", "the fox", "-n", "2", "--steer", f"{relative}:3:2")
    assert result.code == 0 and "was trained on mine, not other" in result.stderr.replace("\n", " "), result.stderr


def test_an_sae_whose_hook_the_run_lacks_is_one_line_in_every_command(cli, runs, shards, tmp_path):
    sae = _sae(tmp_path / "deep", hook="blocks.5.hook_resid_post", tfcli_run=str(runs["mine"].resolve()))
    for args in _sae_commands(runs["mine"], sae, shards):
        one_line(cli(*args), f"the SAE in {sae} reads blocks.5.hook_resid_post, which {runs['mine']} does not have")


# ---- tokenize encode -o: a run directory, two encodes at once -----------------------------------------------


def test_encode_into_a_run_directory_is_refused(cli, runs, trained_tokenizer, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 5, encoding="utf-8")
    run = shutil.copytree(runs["mine"], tmp_path / "run")
    before = snapshot(run)
    one_line(cli("tokenize", "encode", corpus, "-t", trained_tokenizer, "-o", run), f"{run} is a run directory", "pass a new or empty folder")
    assert snapshot(run) == before


def test_a_second_encode_into_one_folder_at_once_is_refused(cli, trained_tokenizer, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 5, encoding="utf-8")
    out = tmp_path / "shards"
    out.mkdir()
    with exclusive_lock(out, "encoding into"):  # the first encode, at work
        one_line(cli("tokenize", "encode", corpus, "-t", trained_tokenizer, "-o", out), f"another process is encoding into {out}")
        assert not (out / "train.bin").exists()
    (out / ".lock").unlink()  # as the first encode takes its lock file away when it ends
    assert cli("tokenize", "encode", corpus, "-t", trained_tokenizer, "-o", out).code == 0
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # its lock taken away with it
    assert cli("tokenize", "encode", corpus, "-t", trained_tokenizer, "-o", out, "--seed", "1").code == 0  # shards replace shards
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


# ---- export --to gguf -o a folder, two exports at once --------------------------------------------------------


@pytest.fixture
def gguf_installed() -> None:
    if importlib.util.find_spec("gguf") is None:
        missing_tool("could not import gguf, llama.cpp's package (the gguf extra)")


def test_a_gguf_export_to_a_folder_writes_the_run_name_in_it(cli, runs, tmp_path, gguf_installed):
    """`-o dir/` wrote a file named dir."""
    made = cli("export", runs["mine"], "--to", "gguf", "-o", f"{tmp_path / 'new'}/")
    assert made.code == 0, made.stderr
    assert (tmp_path / "new").is_dir() and (tmp_path / "new" / "mine.gguf").read_bytes()[:4] == b"GGUF"
    assert f"to {tmp_path / 'new' / 'mine.gguf'} (GGUF gpt2" in made.stdout.replace("\n", "")
    (tmp_path / "there").mkdir()
    assert cli("export", runs["other"], "--to", "gguf", "-o", tmp_path / "there").code == 0  # as llama.cpp's converter takes a folder
    assert [p.name for p in (tmp_path / "there").iterdir()] == ["other.gguf"]
    one_line(cli("export", runs["other"], "--to", "gguf", "-o", tmp_path / "there"), f"{tmp_path / 'there' / 'other.gguf'} already exists")
    assert cli("export", runs["mine"], "--to", "gguf", "-o", tmp_path / "plain.gguf").code == 0  # a file path as before
    before = snapshot(runs["other"])
    one_line(cli("export", runs["mine"], "--to", "gguf", "-o", runs["other"]), f"{runs['other']} is a run directory; the GGUF file would be written into it")
    assert snapshot(runs["other"]) == before
    assert (tmp_path / "plain.gguf").read_bytes()[:4] == b"GGUF"


def test_a_second_gguf_export_to_one_file_at_once_is_refused(cli, runs, tmp_path, gguf_installed):
    """Two exports to one path at once both said they had written it; the last one's file was kept."""
    target = tmp_path / "model.gguf"
    with open(tmp_path / ".model.gguf.lock", "a") as held:  # the first export, at work
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        one_line(cli("export", runs["mine"], "--to", "gguf", "-o", target), f"another process is exporting to {target}")
        assert not target.exists()
    assert cli("export", runs["mine"], "--to", "gguf", "-o", target).code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]  # no lock file left beside it


# ---- serve: token-id prompts ------------------------------------------------------------------------------------


def test_token_id_prompts_that_are_empty_negative_or_outside_the_vocabulary_are_named(runs):
    """`prompt: []` and `prompt: [-1]` got "prompt: Input should be a valid string"."""
    if importlib.util.find_spec("openai") is None:
        missing_tool("could not import openai, the official client the serve tests use")
    import openai

    from tests.serving import running_server

    vocab = json.loads((runs["mine"] / "config.json").read_text())["model"]["vocab_size"]
    cases = {
        "[]": ([], "prompt is an empty list; send the prompt as text, or as a list of token ids"),
        "[-1]": ([-1], "prompt[0] is token id -1; token ids are 0 or more"),
        "[[3], []]": ([[3], []], "prompt[1] is an empty list of token ids"),
        "[[3, -2]]": ([[3, -2]], "prompt[0][1] is token id -2"),
        "out of the vocabulary": ([3, vocab], f"holds token id {vocab}, outside the vocabulary (0 to {vocab - 1})"),
        "[3, 'fox']": ([3, "fox"], "prompt[1] is a string, not a token id"),
        "[1.5]": ([1.5], "prompt[0] is a decimal number (1.5), not a token id"),
    }
    with running_server(runs["mine"], max_batch=2) as server:
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)
        for name, (prompt, message) in cases.items():
            with pytest.raises(openai.BadRequestError) as refused:
                client.completions.create(model="mine", prompt=prompt, max_tokens=2)
            error = refused.value.body
            assert refused.value.status_code == 400 and message in error["message"], (name, error)
            assert error["type"] == "invalid_request_error" and error["param"] == "prompt", (name, error)
            assert "valid string" not in error["message"], (name, error)
        assert client.completions.create(model="mine", prompt=[3, 4], max_tokens=2).choices[0].text is not None


# ---- read_capped: a small file costs its size --------------------------------------------------------------


def test_a_small_file_read_under_a_large_cap_costs_its_size(tmp_path):
    """read_capped read `cap + 1` bytes at once, so a 100-byte config.json held 64 MiB while it was read."""
    path = tmp_path / "config.json"
    path.write_bytes(b"x" * 100)
    tracemalloc.start()
    try:
        assert read_file_capped(path, JSON_FILE) == b"x" * 100
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10, peak


@pytest.mark.parametrize("size, refused", [(4096, False), (4097, True)])
def test_a_pipe_or_a_file_stops_at_the_cap(tmp_path, monkeypatch, size, refused):
    monkeypatch.setenv("TFCLI_MAX_TEST_BYTES", "4K")
    limit = Limit("TFCLI_MAX_TEST_BYTES", 1 << 10, "a test file")
    monkeypatch.setattr("tfcli.limits.READ_BLOCK", 1000)  # a stream read in several blocks
    path = tmp_path / "data"
    path.write_bytes(os.urandom(size))
    for read in (lambda: read_file_capped(path, limit), lambda: read_capped(io.BytesIO(path.read_bytes()), limit, "the pipe")):
        if refused:
            with pytest.raises(TfcliError, match="is larger than 4 KiB, the limit on a test file"):
                read()
        else:
            assert read() == path.read_bytes()


def test_a_file_that_grew_after_its_size_was_seen_is_still_capped(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLI_MAX_TEST_BYTES", "100")
    limit = Limit("TFCLI_MAX_TEST_BYTES", 1 << 10, "a test file")
    path = tmp_path / "data"
    path.write_bytes(b"a" * 50)
    with open(path, "rb") as handle:
        monkeypatch.setattr("tfcli.limits._regular_file_size", lambda handle: 50)
        path.write_bytes(b"a" * 500)  # an appender at work
        with pytest.raises(TfcliError, match="larger than 100 bytes"):
            read_capped(handle, limit, str(path))
