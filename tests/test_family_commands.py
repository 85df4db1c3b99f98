"""Qwen3, Gemma 3 and Phi-3 through every command (issue 44): a tiny random model of each from transformers' own
config class, with its family's special tokens and chat template (condensed: no tools, no images), imported once
per family, then: generate --chat (greedy, the reply transformers gives for apply_chat_template's prompt),
serve (one chat request through the official openai client: the same reply), eval (the loss transformers
computes), inspect-attention (Gemma 3's local layer sees only its window), and finetune with and without
--lora-rank (the adapter loads in PEFT with tfcli's logits)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import missing_tool
from tests.serving import running_server
from tfcli.checkpoint import load_checkpoint

QWEN3_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + '<|end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=96, rms_norm_eps=1e-5)
# family: (config class, model class, config extras, special tokens, tokenizer_config roles, template, end of turn)
FAMILIES = {
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
        ["<|im_start|>", "<|im_end|>"],
        dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
        QWEN3_TEMPLATE,
        "<|im_end|>",
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
        ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
        dict(bos_token="<bos>", eos_token="<eos>", pad_token="<|pad|>", add_bos_token=False),
        GEMMA3_TEMPLATE,
        "<end_of_turn>",
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(num_key_value_heads=2),
        ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        dict(eos_token="<|endoftext|>", pad_token="<|pad|>"),
        PHI3_TEMPLATE,
        "<|end|>",
    ),
}
QUESTION, SYSTEM = "What about the fox?", "Answer in two words."
CHATS = [
    {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}, {"role": "assistant", "content": "a red ball"}]},
    {"messages": [{"role": "user", "content": "And the dog?"}, {"role": "assistant", "content": "the rain"}]},
] * 4


def _transformers():
    try:
        import transformers
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("transformers is not installed; CI installs it with .[test]")
        missing_tool("transformers is not installed")
    return transformers


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, trained_tokenizer):
    """(kind, the transformers model, its folder, the tfcli run imported from it)."""
    from tokenizers import AddedToken, Tokenizer

    from tfcli.cli.app import main

    transformers = _transformers()
    kind = request.param
    config_class, model_class, extra, specials, roles, template, _ = FAMILIES[kind]
    root = tmp_path_factory.mktemp(f"family-{kind}")
    folder = root / "hf"
    folder.mkdir()
    tokenizer = Tokenizer.from_file(str(trained_tokenizer / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = json.loads((trained_tokenizer / "tokenizer_config.json").read_text())
    config.update(roles, chat_template=template)
    config.pop("split_special_tokens")  # as the families' own files: special-token text in a template is the token
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ids = {name: tokenizer.token_to_id(config[name]) for name in ("bos_token", "eos_token", "pad_token") if name in config}
    torch.manual_seed(0)
    hf_config = getattr(transformers, config_class)(
        vocab_size=tokenizer.get_vocab_size(), bos_token_id=ids.get("bos_token"), eos_token_id=ids["eos_token"], pad_token_id=ids["pad_token"], **SHAPE, **extra
    )
    model = getattr(transformers, model_class)(hf_config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    try:
        main(["import", str(folder), "-o", str(root / "run")])
    except SystemExit as exc:
        assert not exc.code
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps(chat) + "\n" for chat in CHATS), encoding="utf-8")
    return kind, model, folder, root / "run", chats


def _transformers_reply(kind: str, model, folder: Path, n: int) -> str:
    """transformers' greedy reply to SYSTEM + QUESTION: apply_chat_template's prompt, up to the end of turn (the
    special tokens tfcli never generates held out, as tfcli holds them)."""
    transformers = _transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    end = tokenizer.convert_tokens_to_ids(FAMILIES[kind][6])
    stops = sorted({end, tokenizer.eos_token_id})
    suppressed = sorted(set(tokenizer.all_special_ids) - set(stops))
    with torch.no_grad():
        out = model.generate(prompt, do_sample=False, max_new_tokens=n, eos_token_id=stops, pad_token_id=stops[0], suppress_tokens=suppressed)
    reply = [i for i in out[0, prompt.shape[1] :].tolist() if i not in stops]
    return tokenizer.decode(reply)


def test_generate_chat_answers_as_transformers_with_the_familys_template(cli, family):
    kind, model, folder, run, _ = family
    result = cli("generate", run, "--chat", "--system", SYSTEM, "--prompt", QUESTION, "-n", "8")
    assert result.code == 0, result.stderr
    assert result.stdout == _transformers_reply(kind, model, folder, 8) + "\n"


def test_serve_answers_one_chat_request_through_openai_as_generate_does(cli, family):
    openai = pytest.importorskip("openai")
    kind, model, folder, run, _ = family
    with running_server(run) as server:
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        reply = client.chat.completions.create(model=run.name, messages=messages, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == _transformers_reply(kind, model, folder, 8)


def test_eval_scores_the_chats_as_transformers_does(cli, family):
    kind, model, folder, run, chats = family
    result = cli("eval", run, "--data", chats, "--json")
    assert result.code == 0, result.stderr
    scored = json.loads(result.stdout)
    transformers = _transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    total, count = 0.0, 0
    for chat in CHATS[:2]:  # the loss on the assistant's tokens, end of turn included, as training counts them
        messages = chat["messages"]
        full = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        end = full.index(tokenizer.convert_tokens_to_ids(FAMILIES[kind][6]), len(prompt)) + 1
        with torch.no_grad():
            logits = model(torch.tensor([full[: end - 1]])).logits[0, len(prompt) - 1 :]
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(full[len(prompt) : end]), reduction="sum").item()
        count += end - len(prompt)
    assert scored["loss"] == pytest.approx(total / count, abs=1e-4), scored


def test_inspect_attention_reads_the_familys_attention(cli, family):
    kind, model, folder, run, _ = family
    text = "the fox was happy and the dog was sad"
    result = cli("inspect-attention", run, "--text", text, "--format", "json")
    assert result.code == 0, result.stderr
    (capture,) = json.loads(result.stdout)["captures"]
    weights = torch.tensor(capture["weights"])  # [layer, head, query, key]
    assert weights.shape[:2] == (2, 4)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), rtol=0, atol=1e-4)
    if kind == "gemma3":  # layer 0 is local: a query sees its own key and the 3 before it, no further
        query, key = torch.meshgrid(torch.arange(weights.shape[2]), torch.arange(weights.shape[3]), indexing="ij")
        assert float(weights[0][:, query - key >= 4].abs().max()) == 0.0
        assert float(weights[1][:, query - key >= 4].abs().max()) > 0.0  # layer 1 is global


def test_finetune_with_and_without_lora_and_peft_loads_the_adapter(cli, family, tmp_path):
    peft = pytest.importorskip("peft")
    transformers = _transformers()
    kind, model, folder, run, chats = family
    common = ("--task", "chat", "--data", chats, "--max-steps", "2", "--batch-size", "4", "--block-size", "64", "--log-every", "1")
    result = cli("train", "finetune", "--init-from", run, *common, "-o", tmp_path / "full")
    assert result.code == 0, result.stderr
    result = cli("train", "finetune", "--init-from", run, *common, "--lora-rank", "4", "-o", tmp_path / "lora")
    assert result.code == 0, result.stderr
    result = cli("export", tmp_path / "lora", "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 0, result.stderr
    # the class the options need: a Phi-3 without longrope or partial rotary is a Llama, and a fine-tune goes out as one
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "hf" / "adapter")).eval()
    ids = torch.randint(10, 300, (1, 12))
    with torch.no_grad():
        ours = load_checkpoint(tmp_path / "lora").model.eval()(ids).logits
        assert (adapted(input_ids=ids).logits - ours).abs().max().item() < 1e-4
        changed = (ours - load_checkpoint(run).model.eval()(ids).logits).abs().max().item()
    assert changed > 1e-6  # the adapter learned something in its two steps
    shutil.rmtree(tmp_path / "hf")
