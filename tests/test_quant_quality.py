"""What quantizing costs in quality: `tfcli eval`'s perplexity of a trained run at each type beside its f32
perplexity (Q8_0 within 0.5%, Q4_K_M within 5%, as the issue asks), and beside llama.cpp's perplexity on the GGUF
file `tfcli export --to gguf --type` writes from the quantized run (the same block bytes), scored over the same
back-to-back windows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests import test_gguf_types
from tests.conftest import TINY_TEXT
from tests.test_gguf import _llama, _llama_cpp
from tfcli.tokenizer.core import TextTokenizer
from tfcli.train.evaluate import _text_tokens

gguf = pytest.importorskip("gguf")
f32_file = test_gguf_types.f32_file  # the fixture: a Llama-shaped run (256 wide, 2 layers) trained on the tiny text, and its f32 GGUF export

# the two (bf16 and q4_0 were measured once for docs/quantize.md: -0.04% and -1.22% against f32, llama.cpp's
# within 0.1%; left out here to keep the suite fast)
TYPES = ("q8_0", "q4_k_m")
WITHIN_F32 = {"q8_0": 0.005, "q4_k_m": 0.05}  # tfcli's perplexity at a type against its f32 perplexity
# llama.cpp's perplexity on the same file against tfcli's: it rounds the activations to 8 bits before each
# quantized product (measured: 0.5% apart at q8_0, 0.3% at q4_k_m, under 0.1% at f32, bf16, q4_0)
WITHIN_LLAMA = 0.01


def _llama_perplexity(llm, tokens: np.ndarray, block: int) -> float:
    """llama.cpp's perplexity over the windows `tfcli eval` scores: tokens[s : s + block] predicting the next
    token at each position, s = 0, block, 2 block, ... while a whole window and its last target fit."""
    total, count = 0.0, 0
    for start in range(0, len(tokens) - block, block):
        window = tokens[start : start + block + 1]
        llm.reset()
        llm.eval(window[:-1].tolist())
        logits = np.array(llm.scores[:block], dtype=np.float64)  # (block, vocab)
        top = logits.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        total += float((log_z - logits[np.arange(block), window[1:]]).sum())
        count += block
    return float(np.exp(total / count))


def _tfcli_perplexity(cli, run: Path, data: Path) -> float:
    result = cli("eval", run, "--data", data, "--json")
    assert result.code == 0, result.stderr
    return float(json.loads(result.stdout)["ppl"])


def test_perplexity_at_each_type_beside_f32_and_llama_cpp(cli, tmp_path, f32_file, capsys):
    run, f32 = f32_file
    data = tmp_path / "text.txt"
    data.write_text(TINY_TEXT * 8, encoding="utf-8")
    tokens = _text_tokens(data, TextTokenizer.load(run))
    block = json.loads((run / "config.json").read_text())["model"]["block_size"]
    llama_cpp = _llama_cpp()
    ours = {"f32": _tfcli_perplexity(cli, run, data)}
    theirs = {"f32": _llama_perplexity(_llama(llama_cpp, f32), tokens, block)}
    for kind in TYPES:
        assert cli("quantize", run, "-o", tmp_path / kind, "--type", kind).code == 0
        exported = cli("export", tmp_path / kind, "--to", "gguf", "-o", tmp_path / f"{kind}.gguf", "--type", kind)
        assert exported.code == 0, exported.stderr
        ours[kind] = _tfcli_perplexity(cli, tmp_path / kind, data)
        theirs[kind] = _llama_perplexity(_llama(llama_cpp, tmp_path / f"{kind}.gguf"), tokens, block)
    with capsys.disabled():
        print(f"\nperplexity on {len(tokens):,} tokens (windows of {block}): type, tfcli, vs f32, llama.cpp")
        for kind in ("f32", *TYPES):
            print(f"{kind:7} {ours[kind]:.4f} {ours[kind] / ours['f32'] - 1:+.2%} {theirs[kind]:.4f}")
    for kind in TYPES:
        assert abs(ours[kind] / ours["f32"] - 1) < WITHIN_F32[kind], (kind, ours)
    for kind in ("f32", *TYPES):
        assert abs(theirs[kind] / ours[kind] - 1) < WITHIN_LLAMA, (kind, ours, theirs)
    assert ours["f32"] < 20  # the model learned the text (random weights: about its vocabulary of 512)
