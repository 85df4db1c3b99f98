"""Bugs a newcomer met importing the files people download: Hugging Face folders as transformers of today saves
them, GGUF files as llama.cpp's converter of today writes them. Each imports and runs as the other project runs
it, or is refused in one line (exit 2) with what to do, and nothing on disk lost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.gguf_files import gguf_copy
from tests.helpers import missing_tool, require
from tfcli.checkpoint import load_checkpoint
from tfcli.tokenizer.chat_template import ChatTemplate, Message
from tfcli.tokenizer.core import TextTokenizer

transformers = require("transformers")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory) -> Path:
    """A byte-level BPE with ChatML's markers as special tokens and a chat template, saved by transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    hf.train_from_iterator([TINY_TEXT] * 20, trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=specials))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=hf, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    folder = tmp_path_factory.mktemp("chat-tokenizer")
    tokenizer.save_pretrained(str(folder))
    return folder


def _hub_llama(folder: Path, tokenizer_dir: Path, **overrides):
    """A tiny random LlamaForCausalLM saved as transformers saves it, with the tokenizer's files beside it."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=320, **{**SHAPE, **overrides})
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(str(folder))
    transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(folder))
    return model


def test_the_chat_template_of_chat_template_jinja_comes_with_the_model(cli, tmp_path, chat_tokenizer):
    """transformers (4.50 and later) saves a tokenizer's chat template in chat_template.jinja, not in
    tokenizer_config.json; import read only the latter, so every chat model saved since came in without its
    template and `generate --chat` said to fine-tune it for chat first."""
    _hub_llama(tmp_path / "hf", chat_tokenizer)
    if not (tmp_path / "hf" / "chat_template.jinja").is_file():  # an older transformers: the file as today's writes it
        config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
        (tmp_path / "hf" / "chat_template.jinja").write_text(config.pop("chat_template"))
        (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    assert "chat_template" not in json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    question = "Where did the fox go?"
    result = cli("generate", tmp_path / "run", "--chat", "-p", question, "--max-new-tokens", "3")
    assert result.code == 0, result.stderr
    run_config = json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())
    template = ChatTemplate.for_tokenizer(TextTokenizer.load(tmp_path / "run"), run_config, "run")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    prompt = theirs.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True)
    assert template.prompt_ids([Message("user", question)]) == list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    assert cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "back").code == 0
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back")).chat_template == CHAT_TEMPLATE


def test_an_unreadable_chat_template_jinja_is_one_line_and_writes_nothing(cli, tmp_path, chat_tokenizer):
    _hub_llama(tmp_path / "hf", chat_tokenizer)
    (tmp_path / "hf" / "chat_template.jinja").write_bytes(b"{{ '\xff' }}")
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "chat_template.jinja" in result.stderr
    assert not (tmp_path / "run").exists()


# --- GGUF: Gemma 3 as llama.cpp's converter writes it today ----------------------------------------------------------


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        missing_tool("llama-cpp-python is not installed")
    return llama_cpp


def test_a_gemma3_gguf_with_its_local_layers_and_their_base_named_runs_as_llama_cpp_runs_it(cli, tmp_path, trained_tokenizer):
    """llama.cpp's converter writes gemma3.rope.freq_base_swa in every Gemma 3 file (and its loader reads
    gemma3.attention.sliding_window_pattern where a file has it); import refused both keys by name, so no
    Gemma 3 GGUF made today imported. A base of 20,000 and a pattern other than every-sixth-global, so both matter."""
    from tests.test_gguf import _llama, _llama_logits
    from tests.test_gguf_gemma3 import _hf_gemma3, ggml_gelu

    llama_cpp = _llama_cpp()
    _hf_gemma3(tmp_path / "hf", trained_tokenizer)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    assert cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "exported.gguf").code == 0
    pattern = [True, False, True, True, False, True, True]  # 7 layers; llama.cpp's default would be all but the 6th
    with gguf_copy(tmp_path / "exported.gguf", tmp_path / "today.gguf") as writer:
        writer.add_float32("gemma3.rope.freq_base_swa", 20000.0)
        writer.add_array("gemma3.attention.sliding_window_pattern", pattern)
    result = cli("import", tmp_path / "today.gguf", "-o", tmp_path / "back")
    assert result.code == 0, result.stderr
    config = load_checkpoint(tmp_path / "back").config.model
    assert config.local_layers == (0, 2, 3, 5, 6) and config.rope_local_base == 20000.0
    prompt = TextTokenizer.load(tmp_path / "run").encode(TINY_TEXT)[:40]  # five windows of 8
    cpp = _llama_logits(_llama(llama_cpp, tmp_path / "today.gguf"), prompt)
    model = load_checkpoint(tmp_path / "back").model
    with torch.no_grad(), ggml_gelu():  # llama.cpp's fp16 GELU table (see test_gguf_gemma3)
        ours = model(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(cpp - ours).max() < 2e-3, np.abs(cpp - ours).max()  # llama.cpp's table steps of 2**-11, as test_gguf_gemma3 says
    model = load_checkpoint(tmp_path / "run").model  # the same tensors with llama.cpp's defaults: far from what it computes here
    with torch.no_grad(), ggml_gelu():
        defaults = model(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(cpp - defaults).max() > 0.05, np.abs(cpp - defaults).max()


def test_a_gemma3_gguf_whose_pattern_llama_cpp_cannot_read_is_one_line(cli, tmp_path, trained_tokenizer):
    from tests.test_gguf_gemma3 import _hf_gemma3

    _hf_gemma3(tmp_path / "hf", trained_tokenizer, num_hidden_layers=2)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    assert cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "exported.gguf").code == 0
    with gguf_copy(tmp_path / "exported.gguf", tmp_path / "bad.gguf") as writer:
        writer.add_array("gemma3.attention.sliding_window_pattern", [True, False, True])  # 3 flags for 2 layers
    result = cli("import", tmp_path / "bad.gguf", "-o", tmp_path / "back")
    assert result.code == 2 and "sliding_window_pattern is neither a period nor one true or false for each of the 2 layers" in result.stderr
    assert not (tmp_path / "back").exists()


def test_a_file_of_a_model_folder_given_to_import_names_the_folder_to_pass(cli, tmp_path, chat_tokenizer):
    """`tfcli import DIR/model.safetensors` (or a shard, or config.json) said only that it was not a folder."""
    _hub_llama(tmp_path / "hf", chat_tokenizer)
    for name in ("model.safetensors", "config.json"):
        result = cli("import", tmp_path / "hf" / name, "-o", tmp_path / "run")
        assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert (
            f"is a file of a Hugging Face model folder; tfcli imports the whole folder; pass the folder: tfcli import {tmp_path / 'hf'} -o {tmp_path / 'run'}"
            in result.stderr
        )
    assert not (tmp_path / "run").exists()


def test_import_onto_a_downloaded_model_folder_says_it_holds_a_model_and_changes_nothing(cli, tmp_path, chat_tokenizer):
    """`-o` naming the downloaded folder itself was refused as holding "a run", which it does not."""
    from tests.conftest import snapshot

    _hub_llama(tmp_path / "hf", chat_tokenizer)
    _hub_llama(tmp_path / "other", chat_tokenizer)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    assert cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "model.gguf").code == 0
    before = snapshot(tmp_path / "other")
    for source in (tmp_path / "hf", tmp_path / "model.gguf"):
        result = cli("import", source, "-o", tmp_path / "other")
        assert result.code == 2 and f"{tmp_path / 'other'} already holds a model; import into another folder with -o" in result.stderr, result.stderr
        result = cli("import", source, "-o", tmp_path / "run")
        assert result.code == 2 and "already holds a tfcli run" in result.stderr, result.stderr
    assert snapshot(tmp_path / "other") == before


@pytest.mark.parametrize("method", ["fp8", "bitsandbytes"])
def test_a_folder_quantized_for_transformers_is_refused_not_read_as_plain_weights(cli, tmp_path, chat_tokenizer, method):
    """An FP8 checkpoint (Qwen3-*-FP8, DeepSeek's) stores its linear weights as float8 beside their scales
    (weight_scale_inv): import read the float8 values as the weights, without the scales, and wrote a run whose
    every output was wrong. Any quantization_config is now one line."""
    from safetensors.torch import load_file, save_file

    _hub_llama(tmp_path / "hf", chat_tokenizer)
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        scale = tensors[name].abs().max() / 448
        tensors[name] = (tensors[name] / scale).to(torch.float8_e4m3fn)
        tensors[name.replace(".weight", ".weight_scale_inv")] = scale.reshape(1, 1)
    save_file(tensors, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "weight_block_size": [128, 128]}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"describes weights quantized by {method!r} (its quantization_config), which tfcli does not read" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_mistral_with_a_sliding_window_goes_to_gguf_with_the_window_as_its_context(cli, tmp_path, chat_tokenizer):
    """With the window kept on every layer (as transformers computes Mistral), export --to gguf would refuse the
    run: llama.cpp's llama has no window. It writes the window as the file's context instead, as import once cut
    it, and says so; within it llama.cpp computes what tfcli and transformers compute."""
    from tests.test_gguf import _llama, _llama_logits

    llama_cpp = _llama_cpp()
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=320, sliding_window=8, head_dim=8, **SHAPE)
    hf = transformers.MistralForCausalLM(config).eval()
    hf.save_pretrained(str(tmp_path / "hf"))
    transformers.AutoTokenizer.from_pretrained(str(chat_tokenizer)).save_pretrained(str(tmp_path / "hf"))
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    result = cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 0, result.stderr
    assert "note: context 8 in the file, the run's sliding window" in result.stderr
    llm = _llama(llama_cpp, tmp_path / "model.gguf")
    assert llm.metadata["llama.context_length"] == "8"
    prompt = TextTokenizer.load(tmp_path / "run").encode(TINY_TEXT)[:8]
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(_llama_logits(llm, prompt) - theirs).max() < 1e-4


def test_dynamic_rope_scaling_imports_as_transformers_computes_it_within_the_context(cli, tmp_path, chat_tokenizer):
    """rope_scaling "dynamic" (NTK) was refused; transformers turns q and k as without it up to
    max_position_embeddings, where tfcli's context ends, so the model imports and computes the same."""
    hf = _hub_llama(tmp_path / "hf", chat_tokenizer, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    run = load_checkpoint(tmp_path / "run")
    assert run.config.model.block_size == 64 and run.config.model.rope_scaling is None
    ids = torch.randint(5, 320, (1, 64))
    with torch.no_grad():
        assert (hf(ids).logits - run.model(ids).logits).abs().max() < 1e-4


def test_yarn_rope_scaling_is_refused_with_the_way_to_the_model_as_released(cli, tmp_path, chat_tokenizer):
    _hub_llama(tmp_path / "hf", chat_tokenizer, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "asks for rope scaling 'yarn', which tfcli does not implement" in result.stderr and "once rope_scaling is removed from config.json" in result.stderr
    assert not (tmp_path / "run").exists()


LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize 176520\n".format("4c0b" * 16)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "model.gguf"])
def test_a_git_lfs_pointer_where_a_file_should_be_says_to_fetch_it(cli, tmp_path, chat_tokenizer, name):
    """`git clone` of a model repository without git-lfs leaves a pointer of some 130 bytes for each large file;
    import said the weights were truncated, or the tokenizer.json was not JSON, or the file was not GGUF."""
    _hub_llama(tmp_path / "hf", chat_tokenizer)
    pointer = tmp_path / name if name.endswith(".gguf") else tmp_path / "hf" / name
    pointer.write_text(LFS_POINTER)
    source = pointer if name.endswith(".gguf") else tmp_path / "hf"
    result = cli("import", source, "-o", tmp_path / "run")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "is a Git LFS pointer, not the file itself: the repository was cloned without Git LFS; run `git lfs install && git lfs pull`" in result.stderr
    assert name in result.stderr and not (tmp_path / "run").exists()


def test_a_download_laid_out_another_way_names_what_to_import(cli, tmp_path, chat_tokenizer):
    """Each said only "has no config.json": a -GGUF repository's folder, the Hugging Face cache's folder of a model
    (models--ORG--NAME, whose files are in snapshots/REVISION), a folder of model folders, Mistral's own format."""
    import shutil

    _hub_llama(tmp_path / "hf", chat_tokenizer)
    cases = {}
    (tmp_path / "ggufs").mkdir()
    for name in ("model-Q4_K_M.gguf", "model-Q8_0.gguf"):
        (tmp_path / "ggufs" / name).write_bytes(b"GGUF")
    cases["ggufs"] = (
        f"holds GGUF files (model-Q4_K_M.gguf, model-Q8_0.gguf), not a Hugging Face model folder; import one file: tfcli import {tmp_path / 'ggufs' / 'model-Q4_K_M.gguf'} -o RUN"
    )
    cache = tmp_path / "models--org--tiny"
    for revision in ("aaa", "bbb"):
        shutil.copytree(tmp_path / "hf", cache / "snapshots" / revision)
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("aaa")  # the current revision, not the last by name
    cases["models--org--tiny"] = (
        f"is the Hugging Face cache's folder of a model; its files are in {cache / 'snapshots' / 'aaa'}; tfcli import {cache / 'snapshots' / 'aaa'} -o RUN"
    )
    shutil.copytree(tmp_path / "hf", tmp_path / "models" / "tiny-llama")
    cases["models"] = f"holds a model in tiny-llama, not one of its own; pass one: tfcli import {tmp_path / 'models' / 'tiny-llama'} -o RUN"
    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "params.json").write_text("{}")
    (tmp_path / "mistral" / "consolidated.safetensors").write_bytes(b"")
    cases["mistral"] = "holds Mistral's own format (params.json, consolidated weights), not a Hugging Face model folder"
    for folder, message in cases.items():
        result = cli("import", tmp_path / folder, "-o", tmp_path / "run")
        assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert message in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()
    assert cli("import", cache / "snapshots" / "aaa", "-o", tmp_path / "run").code == 0  # what the line says to do works


def test_a_quantized_run_goes_to_gguf_in_its_own_blocks_unless_told_f32(cli, tmp_path, chat_tokenizer):
    """`tfcli quantize --type q8_0` then `tfcli export --to gguf` wrote an f32 file four times the size: --type's
    default, f32, dequantized the blocks. Without --type a quantized run's blocks now go out as they are."""
    gguf = require("gguf")
    _hub_llama(tmp_path / "hf", chat_tokenizer)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    assert cli("quantize", tmp_path / "run", "-o", tmp_path / "q8", "--type", "q8_0").code == 0
    result = cli("export", tmp_path / "q8", "--to", "gguf", "-o", tmp_path / "q8.gguf")
    assert result.code == 0 and "(GGUF llama, q8_0," in result.stdout, result.stdout + result.stderr
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "q8.gguf").tensors}
    assert kinds["blk.0.attn_q.weight"] == "Q8_0" and kinds["token_embd.weight"] == "Q8_0"
    assert cli("export", tmp_path / "q8", "--to", "gguf", "-o", tmp_path / "f32.gguf", "--type", "f32").code == 0
    assert {t.name: t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "f32.gguf").tensors}["blk.0.attn_q.weight"] == "F32"


def test_llama3_rope_scaling_comes_from_rope_freqs_alone_as_llama_cpps_converter_writes_it(cli, tmp_path, chat_tokenizer):
    """llama.cpp's converter writes Llama 3.1's scaling as rope_freqs.weight alone, without the original context it
    was made for; import tried only 8,192, so a model made for another (here 16) was refused. The divisors say it."""
    from tests.test_gguf import _llama, _llama_logits

    llama_cpp = _llama_cpp()
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    _hub_llama(tmp_path / "hf", chat_tokenizer, rope_scaling=scaling)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    assert cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "tfcli.gguf").code == 0
    with gguf_copy(tmp_path / "tfcli.gguf", tmp_path / "converter.gguf", drop={"llama.rope.scaling.original_context_length"}):
        pass
    result = cli("import", tmp_path / "converter.gguf", "-o", tmp_path / "back")
    assert result.code == 0, result.stderr
    back = load_checkpoint(tmp_path / "back")
    assert back.config.model.rope_scaling == load_checkpoint(tmp_path / "run").config.model.rope_scaling
    prompt = TextTokenizer.load(tmp_path / "run").encode(TINY_TEXT)[:48]
    with torch.no_grad():
        ours = back.model(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(_llama_logits(_llama(llama_cpp, tmp_path / "converter.gguf"), prompt) - ours).max() < 1e-4


def test_a_gemma3_gguf_with_a_window_and_a_soft_cap_is_capped_as_llama_cpp_caps_it(cli, tmp_path, trained_tokenizer):
    """llama.cpp's gemma3 soft-caps the logits wherever the file gives final_logit_softcapping, with a sliding
    window too; import left the cap out there (with a note saying llama.cpp did too), and export refused a
    capped Gemma 3. Both now carry it; a cap of 0.5 bends these logits, so it shows."""
    from tests.test_gguf import _llama, _llama_logits
    from tests.test_gguf_gemma3 import _hf_gemma3, ggml_gelu

    llama_cpp = _llama_cpp()
    hf = _hf_gemma3(tmp_path / "hf", trained_tokenizer, final_logit_softcapping=0.5)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    result = cli("export", tmp_path / "run", "--to", "gguf", "-o", tmp_path / "model.gguf")
    assert result.code == 0, result.stderr
    result = cli("import", tmp_path / "model.gguf", "-o", tmp_path / "back")
    assert result.code == 0 and "soft cap" not in result.stderr, result.stderr
    back = load_checkpoint(tmp_path / "back")
    assert back.config.model.logit_softcap == 0.5 and back.config.model.sliding_window == 8
    prompt = TextTokenizer.load(tmp_path / "run").encode(TINY_TEXT)[:24]
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0].numpy()
        ours = back.model(torch.tensor([prompt])).logits[0].numpy()
        with ggml_gelu():  # llama.cpp's fp16 GELU table (see test_gguf_gemma3)
            emulated = back.model(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(theirs).max() <= 0.5 and np.abs(ours - theirs).max() < 1e-4  # capped, as transformers caps them
    assert np.abs(_llama_logits(_llama(llama_cpp, tmp_path / "model.gguf"), prompt) - emulated).max() < 1e-3
