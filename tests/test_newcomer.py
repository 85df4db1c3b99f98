"""Bugs a newcomer met going through the tour with bad and odd input: each refused in one line (exit 2) with
what to do, and nothing on disk lost."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from tests.conftest import snapshot
from tfcli.checkpoint import save_checkpoint
from tfcli.errors import TfcliError
from tfcli.fsutil import exclusive_lock, no_empty_folder_left
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer


@pytest.fixture(scope="module")
def run(tmp_path_factory, trained_tokenizer) -> Path:
    """A tiny GPT-2-shaped run (32 wide: q8_0 packs 32 values a block)."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=32, d_ff=64)
    folder = tmp_path_factory.mktemp("newcomer") / "run"
    save_checkpoint(folder, Transformer(config), tokenizer)
    return folder


def test_a_start_that_loses_the_race_for_a_new_folder_leaves_the_winners_run(tmp_path):
    """Two `train pretrain -o NEW` at once: the one refused by the other's lock once removed the folder the
    other had just made and was writing (it crashed with a traceback, and both runs were lost)."""
    folder = tmp_path / "run"
    with contextlib.ExitStack() as winner:
        with pytest.raises(TfcliError, match="another process is training into"):
            with no_empty_folder_left(folder, {"metrics.jsonl"}):  # the loser, which found no folder either
                folder.mkdir()
                winner.enter_context(exclusive_lock(folder, "training into"))
                (folder / "metrics.jsonl").touch()  # the winner's first write
                with exclusive_lock(folder, "training into"):
                    pass
        assert (folder / "metrics.jsonl").is_file()
    with pytest.raises(KeyboardInterrupt):  # with nobody else there, a failed start still takes its folder away
        with no_empty_folder_left(folder, {"metrics.jsonl"}):
            raise KeyboardInterrupt
    assert folder.is_dir()  # it was there before this start
    shutil.rmtree(folder)
    with pytest.raises(KeyboardInterrupt):
        with no_empty_folder_left(folder, {"metrics.jsonl"}):
            folder.mkdir()
            (folder / "metrics.jsonl").touch()
            raise KeyboardInterrupt
    assert not folder.exists()


def _commands(run: Path, tmp_path: Path, cli) -> dict[str, list]:
    exported, gguf_file = tmp_path / "exported", tmp_path / "run.gguf"
    assert cli("export", run, "--to", "hf", "-o", exported).code == 0
    assert cli("export", run, "--to", "gguf", "-o", gguf_file).code == 0
    return {
        "export hf": ["export", run, "--to", "hf", "-o"],
        "import hf": ["import", exported, "-o"],
        "import gguf": ["import", gguf_file, "-o"],
        "quantize": ["quantize", run, "--type", "q8_0", "-o"],
    }


def test_a_model_is_never_written_into_a_tokenizer_or_shard_folder(cli, run, tmp_path, trained_tokenizer, shards):
    """`export -o`, `import -o` and `quantize -o` at `tokenize train`'s folder replaced its tokenizer.json with
    the model's; at a shard folder they mixed a model into it."""
    folders = {"a tokenizer folder": tmp_path / "tokenizer", "a token-shard folder": tmp_path / "shards"}
    shutil.copytree(trained_tokenizer, folders["a tokenizer folder"])
    shutil.copytree(shards, folders["a token-shard folder"])
    (folders["a tokenizer folder"] / "tokenizer.json").write_text((trained_tokenizer / "tokenizer.json").read_text() + "\n")  # another's
    for name, args in _commands(run, tmp_path, cli).items():
        for kind, folder in folders.items():
            before = snapshot(folder)
            result = cli(*args, folder)
            assert result.code == 2, (name, kind, result.stderr)
            assert f"{folder} is {kind}" in result.stderr and result.stderr.count("\n") == 1, (name, result.stderr)
            assert snapshot(folder) == before, name


def test_an_adapter_is_never_merged_into_a_tokenizer_folder(cli, run, tmp_path, trained_tokenizer, shards):
    adapter = tmp_path / "lora"
    args = ["train", "finetune", "--init-from", run, "--task", "lm", "--data", shards, "-o", adapter]
    assert cli(*args, "--lora-rank", "2", "--max-steps", "1", "--batch-size", "2", "--block-size", "16").code == 0
    folder = shutil.copytree(trained_tokenizer, tmp_path / "tokenizer")
    before = snapshot(folder)
    result = cli("export", adapter, "--merge", "--to", "tfcli", "-o", folder)
    assert result.code == 2 and "is a tokenizer folder; the merged run would write over it" in result.stderr
    assert snapshot(folder) == before


def test_a_folder_of_runs_given_as_a_run_names_the_runs_in_it(cli, run):
    """`tfcli serve runs/quickstart` (as serve's --help once showed) said only that it has no config.json."""
    result = cli("info", run.parent)
    assert result.code == 2
    assert f"{run.parent} is not a run directory but holds runs; pass one of them: {run}" in result.stderr


def test_a_missing_gguf_file_is_said_to_be_missing(cli, tmp_path):
    result = cli("import", tmp_path / "model.gguf", "-o", tmp_path / "run")
    assert result.code == 2 and "model.gguf does not exist" in result.stderr and "not a folder" not in result.stderr


def test_a_text_file_given_where_shards_go_says_to_encode_it(cli, tmp_path, trained_tokenizer):
    text = tmp_path / "notes.txt"
    text.write_text("the fox saw the ball and it rolled away\n" * 50, encoding="utf-8")
    result = cli("train", "word2vec", "--data", text, "-o", tmp_path / "w2v", "--epochs", "1")
    assert result.code == 2
    assert f"{text} is a file, not a folder of token shards; encode it first: tfcli tokenize encode {text}" in result.stderr
    assert not (tmp_path / "w2v").exists()


def test_a_config_that_is_a_folder_or_binary_says_to_pass_a_toml_file(cli, tmp_path, shards):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x00\xd0\xff" * 10)
    for config, problem in ((tmp_path, "is a folder"), (binary, "is not UTF-8 text (byte 1)")):
        result = cli("train", "pretrain", "--data", shards, "-o", tmp_path / "run", "--config", config, "--max-steps", "1")
        assert result.code == 2 and f"config file {config} {problem}; pass a TOML file" in result.stderr, result.stderr


def test_an_sae_or_a_gguf_file_given_as_a_run_says_what_to_do_with_it(cli, tmp_path):
    sae = tmp_path / "sae"
    sae.mkdir()
    (sae / "cfg.json").write_text("{}")
    (sae / "sae_weights.safetensors").write_bytes(b"")
    result = cli("info", sae)
    assert result.code == 2 and f"{sae} is a sparse autoencoder, not a run directory; pass its model as the run and the SAE with --sae {sae}" in result.stderr
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    result = cli("generate", gguf, "--prompt", "hi")
    assert result.code == 2 and f"{gguf} is a GGUF file, not a run directory; import it first: tfcli import {gguf} -o RUN" in result.stderr


def test_a_peft_adapter_given_to_import_says_to_import_its_base(cli, tmp_path):
    """`tfcli export` of a LoRA run writes OUT/base and OUT/adapter; importing OUT (or the adapter) said only
    that there was no config.json."""
    exported = tmp_path / "exported"
    (exported / "base").mkdir(parents=True)
    (exported / "adapter").mkdir()
    (exported / "base" / "config.json").write_text("{}")
    (exported / "adapter" / "adapter_config.json").write_text("{}")
    result = cli("import", exported, "-o", tmp_path / "run")
    assert result.code == 2 and f"import {exported / 'base'}, or merge the adapter" in result.stderr
    result = cli("import", exported / "adapter", "-o", tmp_path / "run")
    assert result.code == 2 and "is a PEFT adapter, not a model: tfcli imports whole models; import its base model" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_second_command_writing_the_same_folder_at_once_is_refused(cli, run, tmp_path):
    """Two `export -o OUT` (or `quantize -o`, `import -o`) at once both said they wrote OUT, which held a mix of
    the two models' files. The second is refused while the first holds the folder; a finished export leaves no lock file."""
    out = tmp_path / "out"
    out.mkdir()
    with exclusive_lock(out, "exporting to"):  # the first command, still writing
        (out / "config.json").write_text("{}")
        before = snapshot(out)
        for args in (["export", run, "--to", "hf", "-o", out], ["quantize", run, "--type", "q8_0", "-o", out]):
            result = cli(*args)
            assert result.code == 2 and f"another process is writing into {out}" in result.stderr, result.stderr
            assert snapshot(out) == before
    fresh = tmp_path / "fresh"
    assert cli("export", run, "--to", "hf", "-o", fresh).code == 0
    assert sorted(p.name for p in fresh.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
