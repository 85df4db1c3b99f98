"""Generation stops where the model's own files say it stops: a Hugging Face folder whose generation_config.json
lists two eos ids stops in tfcli where transformers' `generate` stops (plain, sampling, beam, a batch, serve,
chat), and its export writes the list back; a GGUF whose end-of-generation tokens include one other than eos
(found by its text, as llama.cpp's loader finds it, or named by tokenizer.ggml.eot_token_id; one written by
llama.cpp's own convert_hf_to_gguf.py) stops in tfcli where llama-cpp-python's greedy completion stops, and an
export names the run's other end as eot; llama.cpp's rules for that set, case by case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_TEXT
from tests.gguf_files import new_gguf
from tests.helpers import missing_tool, require
from tfcli.gguf.vocab import CONTROL, NORMAL, llama_cpp_end_ids
from tfcli.tokenizer.specials import END_OF_GENERATION_KEY

PROMPT = "Once upon a time a little fox"
NEW_TOKENS = 16
SPECIALS = ["<|endoftext|>", "<|im_end|>"]


def _tiny_llama(vocab_size: int):
    transformers = require("transformers")
    torch.manual_seed(3)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.08)
    return model


def _greedy(model, prompt: list[int]) -> list[int]:
    """transformers' greedy `generate`, ending where the model's generation_config says: the new tokens, the end
    token included where it stopped at one."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def _never_ending(model):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _first_new(tokens: list[int], excluded: set[int]) -> int:
    """The step of the first token, from the third on, that greedy decoding has not met before (nor is excluded)."""
    return next(k for k in range(2, len(tokens)) if tokens[k] not in set(tokens[:k]) | excluded)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> tuple[Path, list[int], int, list[int]]:
    """A tiny Llama folder made with transformers whose generation_config.json says eos_token_id [eos, stop], where
    stop is a plain token greedy decoding meets first; returns the folder, the prompt, stop, and transformers' tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("hf-eos-list")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TINY_TEXT] * 20, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": SPECIALS[0], "tokenizer_class": "PreTrainedTokenizerFast"}))
    eos = tokenizer.token_to_id(SPECIALS[0])
    model = _tiny_llama(tokenizer.get_vocab_size())
    prompt = tokenizer.encode(PROMPT).ids
    unstopped = _greedy(_never_ending(model), prompt)
    step = _first_new(unstopped, set(prompt) | {eos, tokenizer.token_to_id(SPECIALS[1])})
    stop = unstopped[step]
    model.generation_config.eos_token_id = [eos, stop]
    model.generation_config.pad_token_id = eos
    model.save_pretrained(str(folder))
    theirs = _greedy(type(model).from_pretrained(str(folder)).eval(), prompt)
    assert theirs == unstopped[: step + 1]  # transformers stops at the second id, where it first meets it
    return folder, prompt, stop, theirs


@pytest.fixture(scope="module")
def imported(hf_folder, tmp_path_factory) -> Path:
    from tfcli.hf.convert import import_hf

    run = tmp_path_factory.mktemp("imported") / "run"
    import_hf(hf_folder[0], run)
    return run


def _generate(cli, run: Path, *options: str, prompt: str = PROMPT) -> list[dict]:
    result = cli("generate", run, "-p", prompt, "--max-new-tokens", str(NEW_TOKENS), "--json", *options)
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)["completions"]


def test_import_records_the_ids_generation_config_lists(hf_folder, imported):
    folder, _, stop, _ = hf_folder
    eos = json.loads((folder / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    assert json.loads((imported / "tokenizer_config.json").read_text())[END_OF_GENERATION_KEY] == [eos, stop]


@pytest.mark.parametrize(
    "options",
    [[], ["--strategy", "sample", "--top-k", "1", "--seed", "1"], ["--strategy", "beam", "--num-beams", "1"], ["--no-cache"]],
    ids=["greedy", "sampling", "beam", "no-cache"],
)
def test_generate_stops_where_transformers_generate_stops(cli, hf_folder, imported, options):
    _, prompt, stop, theirs = hf_folder
    (completion,) = _generate(cli, imported, *options)
    assert completion["prompt_tokens"] == len(prompt)
    assert completion["tokens"] == theirs[:-1] and completion["finish_reason"] == "eos"
    (unstopped,) = _generate(cli, imported, "--ignore-eos")
    assert unstopped["tokens"][len(theirs) - 1] == stop  # the stop was the model's own choice


def test_a_batch_stops_each_row_at_its_own_end(cli, hf_folder, imported, tmp_path):
    _, _, _, theirs = hf_folder
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"The fox\n{PROMPT}\n", encoding="utf-8")
    result = cli("generate", imported, "--prompt-file", prompts, "--max-new-tokens", str(NEW_TOKENS), "--json")
    assert result.code == 0, result.stderr
    alone, ours = json.loads(result.stdout)["completions"]
    assert ours["tokens"] == theirs[:-1] and ours["finish_reason"] == "eos"
    assert alone["tokens"] == _generate(cli, imported, prompt="The fox")[0]["tokens"]


def test_serve_finishes_with_stop_at_the_same_token(hf_folder, imported):
    httpx = require("httpx")
    require("fastapi")
    from tests.serving import running_server

    _, _, _, theirs = hf_folder
    with running_server(imported) as server:
        body = {"model": "run", "prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0, "return_token_ids": True}
        (choice,) = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"]
    assert choice["token_ids"] == theirs[:-1] and choice["finish_reason"] == "stop"


def test_export_writes_the_ids_back_to_generation_config(cli, hf_folder, imported, tmp_path):
    transformers = require("transformers")
    folder, prompt, _, theirs = hf_folder
    result = cli("export", imported, "--to", "hf", "-o", tmp_path / "out")
    assert result.code == 0, result.stderr
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert written["eos_token_id"] == json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert END_OF_GENERATION_KEY not in json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert _greedy(again, prompt) == theirs


def test_a_bad_list_is_one_line(cli, imported, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(imported, run)
    config = json.loads((run / "tokenizer_config.json").read_text())
    config[END_OF_GENERATION_KEY] = [1, "two"]
    (run / "tokenizer_config.json").write_text(json.dumps(config))
    result = cli("generate", run, "-p", PROMPT, "--max-new-tokens", "2")
    assert result.code == 2 and "end_of_generation_ids must be a list of token ids" in result.stderr
    assert "Traceback" not in result.stderr


# --- GGUF: the end-of-generation tokens as llama.cpp's loader finds them ------------------------------------


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        missing_tool("llama-cpp-python is not installed")
    return llama_cpp


def _llama(llama_cpp, path: Path):
    return llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=1, n_threads_batch=1, type_k=0, type_v=0, verbose=False)


def _llama_completion(llm) -> tuple[str, int, str]:
    """llama-cpp-python's greedy completion of PROMPT: its text, its token count and why it ended."""
    out = llm.create_completion(PROMPT, max_tokens=NEW_TOKENS, temperature=0.0, top_k=1, repeat_penalty=1.0)
    return out["choices"][0]["text"], out["usage"]["completion_tokens"], out["choices"][0]["finish_reason"]


def _write_gguf(path: Path, model, tokens: list[str], types: list[int], extra: dict[str, int]) -> None:
    """A GGUF of a transformers Llama with a byte-level BPE tokenizer, as llama.cpp's converter writes one (f32)."""
    from tests.test_gguf import _converter_permute

    gguf = require("gguf")
    spec = json.loads(Path(path.parent / "tokenizer.json").read_text())
    c = model.config
    with new_gguf(path, "llama") as writer:
        writer.add_name("tiny")
        writer.add_context_length(c.max_position_embeddings)
        writer.add_embedding_length(c.hidden_size)
        writer.add_block_count(c.num_hidden_layers)
        writer.add_feed_forward_length(c.intermediate_size)
        writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
        writer.add_head_count(c.num_attention_heads)
        writer.add_head_count_kv(c.num_key_value_heads)
        writer.add_layer_norm_rms_eps(c.rms_norm_eps)
        writer.add_rope_freq_base(10000.0)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_vocab_size(c.vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
        writer.add_eos_token_id(tokens.index(SPECIALS[0]))
        writer.add_bos_token_id(tokens.index(SPECIALS[0]))
        writer.add_add_bos_token(False)
        for key, value in extra.items():
            writer.add_uint32(key, value)
        names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
        for i in range(c.num_hidden_layers):
            for theirs, ours in (
                ("self_attn.q_proj", "attn_q"),
                ("self_attn.k_proj", "attn_k"),
                ("self_attn.v_proj", "attn_v"),
                ("self_attn.o_proj", "attn_output"),
                ("mlp.gate_proj", "ffn_gate"),
                ("mlp.up_proj", "ffn_up"),
                ("mlp.down_proj", "ffn_down"),
                ("input_layernorm", "attn_norm"),
                ("post_attention_layernorm", "ffn_norm"),
            ):
                names[f"model.layers.{i}.{theirs}.weight"] = f"blk.{i}.{ours}.weight"
        for name, tensor in model.state_dict().items():
            data = tensor.detach().numpy().astype("float32")
            if name.endswith("q_proj.weight"):
                data = _converter_permute(data, c.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                data = _converter_permute(data, c.num_key_value_heads)
            writer.add_tensor(names[name], data)


@pytest.fixture(scope="module")
def gguf_case(hf_folder, tmp_path_factory):
    """The tiny Llama with its rows for <|im_end|> and the plain token greedy decoding first meets swapped (embedding
    and head): the same model but for the two ids' names, so greedy decoding now meets <|im_end|> there."""
    import transformers

    folder, prompt, _, _ = hf_folder
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    model = _never_ending(transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval())
    unstopped = _greedy(model, prompt)
    im_end = tokens.index(SPECIALS[1])
    step = _first_new(unstopped, set(prompt) | {tokens.index(SPECIALS[0]), im_end})
    met = unstopped[step]
    with torch.no_grad():
        for weight in (model.model.embed_tokens.weight, model.lm_head.weight):
            weight[[met, im_end]] = weight[[im_end, met]]
    out = tmp_path_factory.mktemp("gguf-eog")
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out, model, tokens, step


@pytest.mark.parametrize("named", [False, True], ids=["found-by-text", "eot-key"])
def test_gguf_import_stops_where_llama_cpp_stops(cli, gguf_case, named, tmp_path):
    llama_cpp = _llama_cpp()
    folder, model, tokens, step = gguf_case
    types = [CONTROL if t in SPECIALS else NORMAL for t in tokens]
    extra = {}
    if named:  # a name no rule knows: llama.cpp ends there only because the key says so
        extra = {"tokenizer.ggml.eot_token_id": tokens.index(SPECIALS[1])}
        tokens = [("<|turn_end|>" if t == SPECIALS[1] else t) for t in tokens]
    path = folder / f"tiny-{named}.gguf"
    _write_gguf(path, model, tokens, types, extra)
    text, count, reason = _llama_completion(_llama(llama_cpp, path))
    assert count == step and reason == "stop"
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    (completion,) = _generate(cli, tmp_path / "run")
    assert len(completion["tokens"]) == step and completion["text"] == text and completion["finish_reason"] == "eos"


@pytest.fixture(scope="module")
def llama_cpp_converter(kernel_cache) -> Path:
    """llama.cpp's own convert_hf_to_gguf.py (with its conversion/ and gguf-py/), from the sdist the lock pins."""
    from tests.llama_cpp_sdist import Unavailable, converter_folder

    try:
        return converter_folder(Path(os.environ["TFCLI_CACHE_DIR"]))
    except Unavailable as exc:
        missing_tool(f"llama.cpp's converter cannot be had: {exc}")


def test_a_gguf_of_llama_cpp_s_converter_stops_where_llama_cpp_stops(cli, llama_cpp_models, llama_cpp_converter, tmp_path):
    """GPT-2's vocabulary (llama.cpp's ggml-vocab-gpt-2.gguf, through transformers' converter) with <|im_end|> added, on
    a tiny Llama whose greedy decoding meets <|im_end|> (rows swapped, as in `gguf_case`); the file is what llama.cpp's
    convert_hf_to_gguf.py writes, which names eos alone: llama.cpp finds <|im_end|> by its text, and so does tfcli."""
    llama_cpp = _llama_cpp()
    transformers = require("transformers")
    from tokenizers import Tokenizer

    from tests.llama_cpp_sdist import converted

    folder = tmp_path / "hf"
    folder.mkdir()
    tokenizer = Tokenizer.from_file(str(converted(llama_cpp_models, "gpt-2", Path(os.environ["TFCLI_CACHE_DIR"])) / "tokenizer.json"))
    tokenizer.add_special_tokens([SPECIALS[1]])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": SPECIALS[0], "tokenizer_class": "PreTrainedTokenizerFast"}))
    eos, im_end = tokenizer.token_to_id(SPECIALS[0]), tokenizer.token_to_id(SPECIALS[1])
    torch.manual_seed(5)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = _never_ending(transformers.LlamaForCausalLM(config).eval())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.08)
    prompt = tokenizer.encode(PROMPT).ids
    unstopped = _greedy(model, prompt)
    step = _first_new(unstopped, set(prompt) | {eos, im_end})
    met = unstopped[step]
    with torch.no_grad():
        for weight in (model.model.embed_tokens.weight, model.lm_head.weight):
            weight[[met, im_end]] = weight[[im_end, met]]
    model.save_pretrained(str(folder))
    path = tmp_path / "tiny.gguf"
    command = [sys.executable, str(llama_cpp_converter / "convert_hf_to_gguf.py"), str(folder), "--outfile", str(path), "--outtype", "f32"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    llm = _llama(llama_cpp, path)
    assert "tokenizer.ggml.eot_token_id" not in llm.metadata and llm.metadata["tokenizer.ggml.eos_token_id"] == str(eos)
    text, count, reason = _llama_completion(llm)
    assert count == step and reason == "stop"
    result = cli("import", path, "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())[END_OF_GENERATION_KEY] == [eos, im_end]
    (completion,) = _generate(cli, tmp_path / "run")
    assert len(completion["tokens"]) == step and completion["text"] == text and completion["finish_reason"] == "eos"


def test_gguf_export_names_the_run_s_other_end_as_eot(cli, hf_folder, imported, tmp_path):
    llama_cpp = _llama_cpp()
    _, _, stop, theirs = hf_folder
    result = cli("export", imported, "--to", "gguf", "-o", tmp_path / "out.gguf")
    assert result.code == 0, result.stderr
    llm = _llama(llama_cpp, tmp_path / "out.gguf")
    assert llm.metadata["tokenizer.ggml.eot_token_id"] == str(stop)
    text, count, reason = _llama_completion(llm)
    (ours,) = _generate(cli, imported)
    assert count == len(theirs) - 1 and reason == "stop" and text == ours["text"]


@pytest.mark.parametrize(
    ("tokens", "ids", "metadata", "expected"),
    [
        (["a", "<|endoftext|>", "<|im_end|>", "b"], {"eos": 1}, {}, [1, 2]),  # Qwen2.5-Instruct's two, found by text
        (["a", "</s>", "<|turn|>"], {"eos": 1}, {"tokenizer.ggml.eot_token_id": 2}, [1, 2]),  # eot by its key
        (["a", "</s>", "<|turn|>"], {"eos": 1}, {"tokenizer.ggml.eot_token_id": 0xFFFFFFFF}, [1]),  # the converter's "no such token"
        (["a", "<|eom_id|>", "<|fim_pad|>", "<PAD>"], {}, {}, [1, 2]),  # eom and FIM pad by text (the first FIM pad only)
        (["<|end|>", "<|return|>", "<|call|>", "x"], {}, {}, [1, 2]),  # gpt-oss: <|end|> is not an end there
        (["<|end|>", "x"], {}, {}, [0]),  # Phi-3's <|end|> is
        (["</s>", "<|tool_response>", "x"], {}, {}, [1]),  # Gemma 4: </s> is an ordinary token
        (["a", "b"], {"eos": 1}, {}, [1]),
    ],
)
def test_llama_cpp_end_of_generation_rules(tokens, ids, metadata, expected):
    assert llama_cpp_end_ids(tokens, ids, metadata) == expected


def test_gguf_export_of_a_quantized_run_says_what_it_wrote(cli, imported, tmp_path):
    require("gguf")
    result = cli("quantize", imported, "-o", tmp_path / "q8", "--type", "q8_0")
    assert result.code == 0, result.stderr
    result = cli("export", tmp_path / "q8", "--to", "gguf", "-o", tmp_path / "q8.gguf")
    assert result.code == 0, result.stderr
    assert "dequantized to f32" not in result.stderr and "own q8_0 blocks as they are" in result.stderr
    result = cli("export", tmp_path / "q8", "--to", "gguf", "-o", tmp_path / "f32.gguf", "--type", "f32")
    assert result.code == 0, result.stderr
    assert "q8_0 weights dequantized, as f32" in result.stderr


def test_chat_stops_at_the_run_s_ids_and_the_turn_s_end(hf_folder, imported, tmp_path):
    import shutil

    from tfcli.checkpoint import load_checkpoint
    from tfcli.generate.chat import ChatSession, run_template
    from tfcli.generate.decoding import Generator
    from tfcli.generate.settings import GenerationSettings

    _, _, stop, _ = hf_folder
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    config = json.loads((run / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}assistant: "
    (run / "tokenizer_config.json").write_text(json.dumps(config))
    checkpoint = load_checkpoint(run)
    generator = Generator(checkpoint.model, checkpoint.tokenizer, GenerationSettings(max_new_tokens=4))
    session = ChatSession(generator, run_template(run, generator))
    ids = checkpoint.tokenizer.special_ids
    assert session.generator.end_ids == {ids["eos"], stop, checkpoint.tokenizer.hf.token_to_id("<|im_end|>")}


TURNS = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}assistant: "


@pytest.mark.parametrize(("special", "template"), [("<|end|>", None), ("<end_of_turn>", None), ("<|im_end|>", TURNS)])
def test_gguf_export_names_a_special_llama_cpp_ends_at_by_its_spelling(cli, tmp_path, special, template):
    """A tfcli tokenizer with an extra special token llama.cpp reads as an end of generation by its text: the export's
    note names it and the fix (end_of_generation_ids), and says where tfcli's chat stops there already (the chat
    template's end of turn); llama.cpp's vocabulary says it ends there (llama_vocab_is_eog), and once the run lists
    it tfcli ends there too and the note is gone."""
    llama_cpp = _llama_cpp()
    from tests.test_gguf import _random_run
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.generate.window import Vocabulary
    from tfcli.model.config import ModelConfig
    from tfcli.tokenizer.core import TextTokenizer
    from tfcli.tokenizer.specials import SpecialTokens, default_specials
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    (tmp_path / "corpus.txt").write_text(TINY_TEXT * 5, encoding="utf-8")
    specials = SpecialTokens(roles=default_specials("bpe"), extra=(special,))
    train_tokenizer(resolve_corpus([tmp_path / "corpus.txt"]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=300, special_tokens=specials))
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    end = tokenizer.hf.token_to_id(special)
    shape = dict(positions="rotary", norm="rmsnorm", activation="swiglu")
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layers=1, n_heads=2, d_model=16, d_ff=32, **shape)
    run = _random_run(tmp_path / "run", config, tokenizer)
    if template is not None:
        roles = json.loads((run / "tokenizer_config.json").read_text())
        (run / "tokenizer_config.json").write_text(json.dumps({**roles, "chat_template": template}))
    result = cli("export", run, "--to", "gguf", "-o", tmp_path / "out.gguf")
    assert result.code == 0, result.stderr
    assert f"llama.cpp ends a text at {special!r} (id {end})" in result.stderr, result.stderr
    assert ("(its chat does, at the chat template's end of turn)" in result.stderr) == (template is not None), result.stderr
    assert f"add [{end}] to {END_OF_GENERATION_KEY} in {run / 'tokenizer_config.json'}" in result.stderr, result.stderr
    llm = llama_cpp.Llama(model_path=str(tmp_path / "out.gguf"), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    assert llama_cpp.llama_vocab_is_eog(vocab, end) and not llama_cpp.llama_vocab_is_eog(vocab, end + 1)
    assert end not in Vocabulary.of(TextTokenizer.load(run), tokenizer.vocab_size).end_ids
    roles = json.loads((run / "tokenizer_config.json").read_text())
    (run / "tokenizer_config.json").write_text(json.dumps({**roles, END_OF_GENERATION_KEY: [end]}))
    assert end in Vocabulary.of(TextTokenizer.load(run), tokenizer.vocab_size).end_ids
    again = cli("export", run, "--to", "gguf", "-o", tmp_path / "again.gguf")
    assert again.code == 0 and "llama.cpp ends a text at" not in again.stderr, again.stderr
