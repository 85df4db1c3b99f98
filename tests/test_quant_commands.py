"""Commands on a quantized run: the loader's notes (weights dequantized on load) reach the user as one dim line on
stderr from every command that loads a run, and `generate` on a Q4_K_M run holds the block bytes, not the
dequantized weights: its peak memory stays within 1.3x the weights file plus the KV cache."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tfcli.checkpoint import quantize_run, save_checkpoint
from tfcli.loader import load_run
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.rundir import read_run_config
from tfcli.tokenizer.core import TextTokenizer

BLOCK = 128


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """Two GPT-2-shaped runs quantized to q4_k_m: a tiny one, and one with GPT-2's vocabulary of 50,257 (its tied
    head, q6_K, is most of the file: 51 MB dequantized, 10.6 MB in blocks)."""
    root = tmp_path_factory.mktemp("quant-commands")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    out = {}
    for name, vocab, layers in (("tiny", 512, 1), ("wide", 50257, 2)):
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=vocab, block_size=BLOCK, n_layers=layers, n_heads=4, d_model=256)
        save_checkpoint(root / f"{name}-f32", Transformer(config).eval(), tokenizer)
        quantize_run(root / f"{name}-f32", root / name, "q4_k_m")
        out[name] = root / name
    return out


def test_a_command_that_dequantizes_on_load_says_so_in_one_dim_line(cli, runs, monkeypatch):
    inspected = cli("inspect-attention", runs["tiny"], "--text", "the cat sat", "--format", "json")
    assert inspected.code == 0, inspected.stderr
    notes = [line for line in inspected.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: {runs['tiny']}'s q4_K, q6_K weights were dequantized to f32 (for inspect)"], inspected.stderr
    monkeypatch.setenv("TFCLI_ACCEL", "0")
    generated = cli("generate", runs["tiny"], "--prompt", "the cat", "--max-new-tokens", "4", "--temperature", "0")
    assert generated.code == 0, generated.stderr
    assert [line for line in generated.stderr.splitlines() if "dequantized" in line] == [
        f"note: {runs['tiny']}'s q4_K, q6_K weights were dequantized to f32 (TFCLI_ACCEL=0)"
    ]
    monkeypatch.delenv("TFCLI_ACCEL")
    kept = cli("generate", runs["tiny"], "--prompt", "the cat", "--max-new-tokens", "4", "--temperature", "0")
    assert kept.code == 0 and "note: " not in kept.stderr, kept.stderr  # decoding keeps the blocks: nothing to say


def test_a_program_gets_the_notes_through_the_tfcli_loader_logger(runs, caplog):
    with caplog.at_level(logging.WARNING, logger="tfcli.loader"):
        checkpoint = load_run(runs["tiny"], "inspect", "cpu")
    assert [record.getMessage() for record in caplog.records if record.name == "tfcli.loader"] == checkpoint.notes
    assert len(checkpoint.notes) == 1


PEAK = """
import resource, sys
from tfcli.cli.app import main

def run(args):
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, exc.code

options = ["--prompt", "the cat", "--max-new-tokens", "16", "--temperature", "0", "--ignore-eos"]
run(["generate", sys.argv[1], *options])  # the tiny run first: every import, the C kernels, the tokenizer
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(["generate", sys.argv[2], *options])
print(1024 * (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before))
"""


def test_generate_on_a_q4_k_m_run_holds_the_blocks_not_the_dequantized_weights(runs):
    """The peak RSS `generate` adds for the wide run, over the same process after the tiny one, is at most 1.3x
    its weights file plus its KV cache. Measured: 10.8 MB for a 11.7 MB file; 62 MB when the decoding window read
    the quantized head's `weight` for its device (each read dequantizes the head), 78 MB with TFCLI_ACCEL=0."""
    done = subprocess.run([sys.executable, "-c", PEAK, str(runs["tiny"]), str(runs["wide"])], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    added = int(done.stdout.strip().splitlines()[-1])
    config = read_run_config(runs["wide"]).model
    kv_cache = 2 * config.n_layers * BLOCK * config.d_model * 4  # keys and values, f32
    weights = (runs["wide"] / "model.safetensors").stat().st_size
    assert added <= 1.3 * weights + kv_cache, (added, weights, kv_cache)


def test_info_says_which_block_types_a_run_holds(cli, runs):
    result = cli("info", runs["tiny"], "--json")
    assert result.code == 0, result.stderr
    held = json.loads(result.stdout)["quantized"]
    assert set(held) == {"q4_K", "q6_K"} and sum(held.values()) >= 5  # qkv, out, fc, proj and the embedding, at least
    shown = " ".join(cli("info", runs["tiny"]).stdout.split())
    assert f"quantized: q4_K {held['q4_K']} tensor" in shown and "q6_K" in shown
