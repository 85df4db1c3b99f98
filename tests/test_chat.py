"""Chat fine-tuning and chatting: templates (transformers' ids), assistant-only loss, the context rule,
`generate --chat`, exact resume, and bad input."""

from __future__ import annotations

import io
import json
import shutil
import signal
import sys
import warnings
from pathlib import Path

import pytest

from tests.helpers import require
from tests.training import records, spawn, wait_for_step, weights
from tfcli.errors import TfcliError
from tfcli.tokenizer.chat_template import DEFAULT_TEMPLATE, ChatTemplate, Message, chat_tokenizer_files
from tfcli.tokenizer.core import TextTokenizer

ANSWERS = {"fox": "red ball", "dog": "the rain", "cat": "a park"}
MULTI_TURN = [
    Message("system", "Answer in two words."),
    Message("user", "What did the fox find?"),
    Message("assistant", "red ball"),
    Message("user", "And the dog?"),
    Message("assistant", "the rain"),
]


@pytest.fixture(scope="module")
def parent(tmp_path_factory, trained_tokenizer) -> Path:
    """A tiny untrained decoder run over the session's tokenizer (untied output layer)."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer

    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=96, n_layers=1, n_heads=2, d_model=32, d_ff=64, tie_embeddings=False)
    run = tmp_path_factory.mktemp("parent") / "run"
    save_checkpoint(run, Transformer(config), tokenizer)
    return run


def write_chats(path: Path, n: int = 90) -> Path:
    lines = []
    for i in range(n):
        animal = list(ANSWERS)[i % 3]
        messages = [{"role": "system", "content": "Answer in two words."}] if i % 2 else []
        messages += [{"role": "user", "content": f"What about the {animal}?"}, {"role": "assistant", "content": ANSWERS[animal]}]
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    return write_chats(tmp_path_factory.mktemp("chats") / "chats.jsonl")


def finetune_args(parent: Path, data: Path, out: Path, *extra: str) -> list:
    return ["train", "finetune", "--init-from", parent, "--task", "chat", "--data", data, "-o", out, "--batch-size", "8", "--lr", "1e-2", *extra]


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, parent, chats) -> Path:
    """The parent fine-tuned on the chats until it answers them."""
    from tfcli.cli.app import main

    run = tmp_path_factory.mktemp("chat") / "run"
    with pytest.raises(SystemExit) as stopped:
        main([str(a) for a in finetune_args(parent, chats, run, "--max-steps", "36", "--eval-every", "18", "--log-every", "18")])
    assert stopped.value.code in (0, None)
    return run


def template_over(tokenizer_dir: Path, tmp_path: Path, source: str = DEFAULT_TEMPLATE) -> ChatTemplate:
    tokenizer = TextTokenizer.load(tokenizer_dir)
    text, config, _ = chat_tokenizer_files(tokenizer, {"eos_token": "<|endoftext|>"}, source)
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    template = ChatTemplate.for_tokenizer(TextTokenizer.load(tmp_path), config, "a test")
    assert template is not None
    return template


def trained_text(template: ChatTemplate, messages) -> str:
    encoded = template.encode(messages)
    return template.tokenizer.decode([i for i, t in zip(encoded.ids, encoded.trained) if t])


def test_only_the_assistants_replies_and_their_end_of_turn_tokens_are_trained(trained_tokenizer, tmp_path):
    template = template_over(trained_tokenizer, tmp_path)
    assert trained_text(template, MULTI_TURN) == "red ball<|im_end|>the rain<|im_end|>"
    assert template.end_of_turn_texts == ("<|im_end|>",)
    # a template with its own layout: the assistant's text follows "A: " and ends with the end-of-text token
    plain = "{% for m in messages %}{{ m['role'][0] | upper }}: {{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
    (tmp_path / "plain").mkdir()
    other = template_over(trained_tokenizer, tmp_path / "plain", plain)
    assert trained_text(other, MULTI_TURN).replace(" ", "") == "redball<|endoftext|>therain<|endoftext|>"


def test_the_trained_tokens_match_transformers_assistant_mask(trained_tokenizer, tmp_path):
    transformers = require("transformers")
    marked = DEFAULT_TEMPLATE.replace(
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}",
        "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
        "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endif %}",
    )
    template = template_over(trained_tokenizer, tmp_path, marked)
    ours = template.encode(MULTI_TURN)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(
        [m.to_json() for m in MULTI_TURN], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert list(theirs["input_ids"]) == ours.ids
    assert [bool(m) for m in theirs["assistant_masks"]] == ours.trained


def test_a_chat_run_keeps_its_template_and_transformers_gives_the_same_ids(chat_run, parent):
    transformers = require("transformers")
    config = json.loads((chat_run / "tokenizer_config.json").read_text())
    assert config["chat_template"] == DEFAULT_TEMPLATE and config["split_special_tokens"] is False
    tokenizer = TextTokenizer.load(chat_run)
    template = ChatTemplate.for_tokenizer(tokenizer, config, "run")
    hf = transformers.AutoTokenizer.from_pretrained(chat_run)
    for prompt in (False, True):
        ids = hf.apply_chat_template([m.to_json() for m in MULTI_TURN], tokenize=True, add_generation_prompt=prompt, return_dict=True)["input_ids"]
        assert list(ids) == (template.prompt_ids(MULTI_TURN) if prompt else template.encode(MULTI_TURN).ids)
    # the two markers were added, and the embedding and the untied output layer grew by two rows
    parent_vocab = TextTokenizer.load(parent).vocab_size
    assert tokenizer.vocab_size == parent_vocab + 2
    tensors = weights(chat_run)
    assert tensors["tok_emb.weight"].shape[0] == tensors["lm_head.weight"].shape[0] == parent_vocab + 2


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-grown-vocabulary"])
def test_masked_positions_get_exactly_zero_gradient(trained_tokenizer, tmp_path, lora):
    import torch
    import torch.nn.functional as F

    from tfcli.data.labeled import LabeledSet
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.train.chat import ChatSource
    from tfcli.train.data import IGNORE, Slot
    from tfcli.train.objectives import loss_sum

    template = template_over(trained_tokenizer, tmp_path)
    encoded = [template.encode(MULTI_TURN), template.encode(MULTI_TURN[1:3])]
    data = LabeledSet([e.ids for e in encoded], [e.trained for e in encoded], "x")
    batch = ChatSource("chat", data, None, 2, 0, pad_id=0, eos_id=0, accum=1).batch(Slot(0, 0))
    ids, labels = batch.tensors["ids"], batch.tensors["labels"]
    assert batch.count == int((labels != IGNORE).sum()) == sum(sum(e.trained[1:]) for e in encoded)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=template.tokenizer.vocab_size, block_size=160, n_layers=1, n_heads=2, d_model=32, d_ff=64)
    model = Transformer(config)
    if lora:  # frozen but for the adapters and the embedding (the tied output layer), trained whole
        from tfcli.adapters import AdapterRecord
        from tfcli.adapters.lora import apply_lora, check_rank
        from tfcli.adapters.vocabulary import vocabulary_modules

        fields = dict(parent="p", parent_path="/p", parent_weights_bytes=0, parent_weights_sha256="")
        record = AdapterRecord(rank=2, alpha=4.0, targets=["qkv"], modules=check_rank(config, 2, ["qkv"]), modules_to_save=vocabulary_modules(config), **fields)
        apply_lora(model, record)
    logits = model(ids).logits
    logits.retain_grad()
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    assert loss.item() == pytest.approx(loss_sum(model, batch, "chat").item(), rel=1e-5)  # the training loss is this one
    loss.backward()
    masked = labels == IGNORE
    assert masked.any() and (~masked).any()
    assert bool((logits.grad[masked] == 0).all()) and bool((logits.grad[~masked].abs().sum(-1) > 0).all())
    if lora:
        trained = {name for name, p in model.named_parameters() if p.grad is not None}
        assert "tok_emb.weight" in trained and all(name == "tok_emb.weight" or ".lora_" in name for name in trained)


def test_the_context_rule_drops_whole_exchanges_and_counts_what_does_not_fit(trained_tokenizer, tmp_path):
    from tfcli.data.chat import fit_conversation, without_oldest_exchange

    template = template_over(trained_tokenizer, tmp_path)
    assert without_oldest_exchange(MULTI_TURN) == [MULTI_TURN[0], *MULTI_TURN[3:]]
    full = len(template.encode(MULTI_TURN).ids)
    last = len(template.encode([MULTI_TURN[0], *MULTI_TURN[3:]]).ids)
    encoded, cropped = fit_conversation(template, MULTI_TURN + [Message("user", "Thanks!")], full)
    assert encoded is not None and len(encoded.ids) == full and not cropped  # a trailing user message is left out
    encoded, cropped = fit_conversation(template, MULTI_TURN, full - 1)
    assert cropped and encoded is not None and len(encoded.ids) == last
    assert fit_conversation(template, MULTI_TURN, last - 1) == (None, True)


def test_chat_finetune_learns_and_generate_chat_answers(chat_run, cli):
    final = [r for r in records(chat_run) if "val_loss" in r][-1]
    assert final["val_accuracy"] == 1.0 and final["val_loss"] < 0.5
    result = cli("generate", chat_run, "--chat", "--prompt", "What about the dog?", "-n", "10")
    assert result.code == 0, result.stderr
    assert result.stdout == "the rain\n" and "stopped by eos" in result.stderr  # the end-of-turn token ends it
    result = cli("generate", chat_run, "--chat", "--system", "Answer in two words.", "--prompt", "What about the cat?", "-n", "10")
    assert result.stdout == "a park\n", result.stderr


def test_eval_scores_a_chat_run_on_conversations_as_validation_does(chat_run, cli, chats, tmp_path):
    result = cli("eval", chat_run, "--data", chats, "--json")
    assert result.code == 0, result.stderr
    right = json.loads(result.stdout)
    assert right["task"] == "chat" and right["examples"] == 90 and right["accuracy"] == 1.0 and right["loss"] < 0.5
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"messages": [{"role": "user", "content": "What about the fox?"}, {"role": "assistant", "content": "the rain"}]}) + "\n")
    scored = json.loads(cli("eval", chat_run, "--data", wrong, "--json").stdout)
    assert scored["examples"] == 1 and scored["accuracy"] == 0.0 and scored["loss"] > 2 * right["loss"]  # "the" was right
    table = cli("eval", chat_run, "--data", chats)
    assert "accuracy" in table.stdout and "1.0000" in table.stdout
    labeled = tmp_path / "labeled.jsonl"
    labeled.write_text(json.dumps({"text": "a fox", "label": "fox"}) + "\n")
    refused = cli("eval", chat_run, "--data", labeled)
    assert refused.code == 2 and "has no 'messages' field" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_an_exported_chat_run_ends_transformers_generate_at_the_end_of_turn(chat_run, cli, tmp_path):
    transformers = require("transformers")
    result = cli("export", chat_run, "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 0, result.stderr
    tokenizer = TextTokenizer.load(chat_run)
    ends = [tokenizer.hf.token_to_id("<|im_end|>"), tokenizer.special_ids["eos"]]
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == ends
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    messages = [{"role": "user", "content": "What about the dog?"}]
    prompt = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    out = model.generate(prompt, max_new_tokens=10, do_sample=False)
    assert hf_tokenizer.decode(out[0, prompt.shape[1] :]) == "the rain<|im_end|>"  # the end-of-turn token stopped it


def test_generate_chat_on_stdin_keeps_the_history_and_drops_the_oldest_turns(chat_run, cli, monkeypatch):
    lines = "".join(f"What about the {animal}?\n" for animal in ("fox", "dog", "cat", "fox", "dog")) + "/reset\nWhat about the cat?\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines.encode())))
    result = cli("generate", chat_run, "--chat", "-n", "6")
    assert result.code == 0, result.stderr
    replies = result.stdout.splitlines()
    assert len(replies) == 6 and replies[0] == "red ball" and replies[-1] == "a park"  # the model saw one exchange at a time in training
    assert "note: the conversation outgrew the context: its oldest" in result.stderr  # 96 tokens hold two exchanges or so
    assert "(conversation forgotten)" in result.stderr


def test_instruct_records_are_a_user_message_and_its_reply(cli, parent, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What about the {a}?", "response": r}) + "\n" for a, r in ANSWERS.items()) * 10)
    run = tmp_path / "run"
    args = finetune_args(parent, data, run, "--max-steps", "2")
    args[args.index("chat")] = "instruct"
    result = cli(*args)
    assert result.code == 0, result.stderr
    assert json.loads((run / "config.json").read_text())["training"]["task"] == "instruct"


def test_a_parents_template_is_kept_and_adds_no_tokens(cli, parent, chats, tmp_path):
    own = tmp_path / "parent"
    shutil.copytree(parent, own)
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    (own / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "chat_template": plain}))
    scored = cli("eval", own, "--data", chats, "--json")  # a model with a template (as imported) is scored on conversations
    assert scored.code == 0 and json.loads(scored.stdout)["task"] == "chat" and json.loads(scored.stdout)["examples"] == 90
    result = cli(*finetune_args(own, chats, tmp_path / "run", "--max-steps", "2"))
    assert result.code == 0, result.stderr
    assert "embedding grows" not in result.stderr
    assert json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())["chat_template"] == plain
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == (parent / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("lora", [(), ("--lora-rank", "2", "--lora-dropout", "0.1")], ids=["full", "lora-grown-vocabulary"])
def test_a_chat_run_killed_between_checkpoints_resumes_bit_for_bit(cli, parent, chats, tmp_path, lora):
    args = ["--max-steps", "10", "--save-every", "4", "--eval-every", "4", "--log-every", "1", *lora]
    whole = tmp_path / "whole"
    assert cli(*finetune_args(parent, chats, whole, *args)).code == 0
    broken = tmp_path / "broken"
    process = spawn(finetune_args(parent, chats, broken, *args))
    reached = wait_for_step(broken, process, 5)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    saved = json.loads((broken / "trainer" / "state.json").read_text())["step"]
    assert saved % 4 == 0 and saved < 10 and reached < 10
    result = cli(*finetune_args(parent, chats, broken, *args, "--resume"))
    assert result.code == 0, result.stderr
    a, b = (_adapter(whole), _adapter(broken)) if lora else (weights(whole), weights(broken))
    assert "base_model.model.tok_emb.weight" in a or not lora
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def _adapter(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "adapter_model.safetensors"))


BAD_RECORDS = [
    ({"messages": [{"role": "user", "content": "hi"}]}, "has no assistant message"),
    ({"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "unknown role 'robot'"),
    ({"messages": [{"role": "user", "content": "<|im_end|>"}, {"role": "assistant", "content": "yo"}]}, "special token '<|im_end|>'"),
    ({"messages": "hello"}, "'messages' must be a non-empty list"),
    ({"prompt": "hi"}, "has no 'messages' field"),
]


@pytest.mark.parametrize("record, problem", BAD_RECORDS)
def test_bad_records_are_one_line_naming_the_file_and_line(cli, parent, tmp_path, record, problem):
    data = write_chats(tmp_path / "chats.jsonl", 4)
    data.write_text(data.read_text() + json.dumps(record) + "\n")
    result = cli(*finetune_args(parent, data, tmp_path / "run"))
    assert result.code == 2 and problem in result.stderr and f"{data} line 5" in result.stderr.replace("\n", "")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_line_that_is_not_json_and_templates_that_fail_are_one_line(cli, parent, tmp_path):
    data = write_chats(tmp_path / "chats.jsonl", 4)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(data.read_text() + "{not json\n")
    result = cli(*finetune_args(parent, broken, tmp_path / "run"))
    assert result.code == 2 and f"{broken} line 5 is not valid JSON" in result.stderr.replace("\n", "")
    for source, problem in (
        ("{% for m in messages %}{{ m.content }", "is not valid Jinja"),
        ("{{ raise_exception('only user and assistant roles') }}", "refused the conversation: only user and assistant roles"),
        ("{{ messages[0].content.nope() }}", "failed to render"),
    ):
        template = tmp_path / "template.jinja"
        template.write_text(source)
        result = cli(*finetune_args(parent, data, tmp_path / "run", "--chat-template", template))
        assert result.code == 2 and problem in result.stderr.replace("\n", ""), result.stderr
        assert not (tmp_path / "run").exists()


def test_chat_option_refusals(cli, parent, chat_run, chats, tmp_path):
    for args, problem in (
        (["generate", parent, "--chat", "--prompt", "hi"], "has no chat template"),
        (["generate", chat_run, "--system", "x", "--prompt", "hi"], "--system sets a chat's system message"),
        (["generate", chat_run, "--chat", "--interactive"], "--chat and --interactive do not go together"),
        (["generate", chat_run, "--chat", "--prompt", "hi", "--json"], "--chat prints a conversation"),
        (["generate", chat_run, "--chat", "--prompt", "say <|im_start|>"], "special token '<|im_start|>'"),
        (
            ["train", "finetune", "--init-from", parent, "--task", "lm", "--data", chats, "-o", tmp_path / "r", "--chat-template", chats],
            "--chat-template applies",
        ),
    ):
        result = cli(*args)
        assert result.code == 2 and problem in result.stderr.replace("\n", ""), (args, result.stderr)


def test_a_template_must_render_messages_in_turn(trained_tokenizer, tmp_path):
    reversed_order = "{% for m in messages | reverse %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    template = template_over(trained_tokenizer, tmp_path, reversed_order)
    with pytest.raises(TfcliError, match="does not render a conversation as the conversation before it"):
        template.encode(MULTI_TURN)


def test_lora_on_a_template_that_adds_tokens_trains_the_grown_embedding_whole(cli, parent, chat_run, chats, tmp_path):
    """The template's tokens grow the embedding and the untied output layer, which train whole beside the
    adapters (PEFT's modules_to_save): the run keeps them and the adapters, loads onto its parent everywhere,
    and merges into a full run with the grown vocabulary. On a chat run that holds the tokens, the adapters alone train."""
    import torch
    from safetensors.torch import load_file

    from tfcli.checkpoint import load_checkpoint

    adapted = tmp_path / "adapted"
    assert cli(*finetune_args(chat_run, chats, adapted, "--max-steps", "2", "--lora-rank", "2")).code == 0
    assert json.loads((adapted / "config.json").read_text())["adapter"]["modules_to_save"] == []

    run = tmp_path / "grown"
    result = cli(*finetune_args(parent, chats, run, "--max-steps", "4", "--lora-rank", "2"))
    assert result.code == 0, result.stderr
    assert "the embedding grows" in result.stderr and not (run / "model.safetensors").exists()
    assert json.loads((run / "config.json").read_text())["adapter"]["modules_to_save"] == ["tok_emb", "lm_head"]
    assert json.loads((run / "adapter_config.json").read_text())["modules_to_save"] == ["tok_emb", "lm_head"]
    vocab, parent_vocab = TextTokenizer.load(run).vocab_size, TextTokenizer.load(parent).vocab_size
    saved = load_file(str(run / "adapter_model.safetensors"))
    assert saved["base_model.model.tok_emb.weight"].shape == saved["base_model.model.lm_head.weight"].shape == (vocab, 32)
    assert vocab == parent_vocab + 2

    before, loaded = load_checkpoint(parent).model, load_checkpoint(run).model
    assert loaded.config.vocab_size == vocab and torch.equal(loaded.tok_emb.weight, saved["base_model.model.tok_emb.weight"])
    assert not torch.equal(loaded.tok_emb.weight[:parent_vocab], before.tok_emb.weight)  # the old rows trained too
    for args in (
        ["generate", run, "--chat", "--prompt", "What about the dog?", "-n", "4"],
        ["eval", run, "--data", chats],
        ["inspect-attention", run, "--text", "What about the dog?", "--head", "0"],
    ):
        result = cli(*args)
        assert result.code == 0, (args, result.stderr)
    info = json.loads(cli("info", run, "--json").stdout)["adapter"]
    assert info["modules_to_save"] == ["tok_emb", "lm_head"] and info["parameters"] > 2 * vocab * 32  # the two matrices count

    merged = tmp_path / "merged"
    assert cli("export", run, "--merge", "-o", merged).code == 0
    assert weights(merged)["tok_emb.weight"].shape[0] == vocab and TextTokenizer.load(merged).vocab_size == vocab
    ids = torch.randint(0, vocab, (2, 12))
    with torch.no_grad():
        assert (load_checkpoint(merged).model(ids).logits - loaded(ids).logits).abs().max().item() < 1e-5


HF_SHAPES = {
    "gpt2": dict(activation="gelu_tanh"),
    "llama": dict(positions="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=1, bias=False, tie_embeddings=False),
    "llama-tied": dict(positions="rotary", norm="rmsnorm", activation="swiglu", n_kv_heads=1, bias=False, tie_embeddings=True),  # Llama 3.2 1B
}


@pytest.mark.parametrize("family", list(HF_SHAPES))
def test_peft_loads_an_exported_lora_chat_run_whose_vocabulary_grew(cli, trained_tokenizer, chats, tmp_path, family):
    """PEFT's layout for a resized embedding: the trained matrices in the adapter (a tied one also under
    lm_head, with ensure_weight_tying where PEFT knows the embedding by name), base/ already grown, so PeftModel.from_pretrained loads it as it is."""
    import torch

    from tfcli.checkpoint import load_checkpoint, save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer

    transformers = require("transformers")
    peft = require("peft")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=96, n_layers=1, n_heads=2, d_model=32, d_ff=64, **HF_SHAPES[family])
    save_checkpoint(tmp_path / "parent", Transformer(config), tokenizer)
    run = tmp_path / "run"
    result = cli(*finetune_args(tmp_path / "parent", chats, run, "--max-steps", "3", "--lora-rank", "2"))
    assert result.code == 0, result.stderr
    assert cli("export", run, "--to", "hf", "-o", tmp_path / "hf").code == 0
    adapter_config = json.loads((tmp_path / "hf" / "adapter" / "adapter_config.json").read_text())
    if family == "gpt2":
        assert adapter_config["modules_to_save"] == ["transformer.wte"] and "ensure_weight_tying" not in adapter_config  # PEFT knows no wte
    elif family == "llama-tied":  # PEFT ties the output layer to the embedding it knows by name
        assert adapter_config["modules_to_save"] == ["model.embed_tokens"] and adapter_config["ensure_weight_tying"] is True
    else:
        assert adapter_config["modules_to_save"] == ["model.embed_tokens", "lm_head"] and "ensure_weight_tying" not in adapter_config
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf" / "base")).eval()
    ids = torch.randint(0, tokenizer.vocab_size + 2, (2, 12))
    with torch.no_grad():
        ours = load_checkpoint(run).model(ids).logits
        assert (hf_base(input_ids=ids).logits - ours).abs().max().item() > 1e-3  # base/ is the parent, grown: the adapter matters
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            theirs = peft.PeftModel.from_pretrained(hf_base, str(tmp_path / "hf" / "adapter")).eval()(input_ids=ids).logits
    assert (theirs - ours).abs().max().item() < 1e-4
    assert not [w for w in warned if "weight_tying" in str(w.message) or "tie_word_embeddings" in str(w.message)]
    assert cli("export", run, "--merge", "--to", "hf", "-o", tmp_path / "merged").code == 0  # one folder, the vocabulary grown
    with torch.no_grad():
        merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()(input_ids=ids).logits
    assert (merged - ours).abs().max().item() < 1e-4


def test_generate_chat_and_the_serve_page_share_one_context_rule_found_in_few_renders(trained_tokenizer, tmp_path):
    from tfcli.data.chat import without_oldest_exchange
    from tfcli.generate.chat import fit_messages, reply_room

    assert reply_room(96, 10) == 86 and reply_room(96, 500) == 72  # the reply's room: at most a quarter of the context
    template = template_over(trained_tokenizer, tmp_path)
    asking = [*MULTI_TURN, Message("user", "And the cat?")]
    full = template.prompt_ids(asking)
    assert fit_messages(template.prompt_ids, asking, len(full)) == (full, asking, 0)
    shorter = [MULTI_TURN[0], *MULTI_TURN[3:], asking[-1]]
    assert fit_messages(template.prompt_ids, asking, len(full) - 1) == (template.prompt_ids(shorter), shorter, 1)
    alone = [MULTI_TURN[0], asking[-1]]  # the system message and the last exchange stay, fit or not
    assert fit_messages(template.prompt_ids, asking, 0) == (template.prompt_ids(alone), alone, 2)
    # a long conversation: the same messages as leaving out one exchange at a time, from a few renders
    long = [MULTI_TURN[0]] + [Message(role, f"{role} {i}") for i in range(100) for role in ("user", "assistant")] + [Message("user", "And?")]
    renders: list[int] = []

    def render(messages: list[Message]) -> list[int]:
        renders.append(len(messages))
        return template.prompt_ids(messages)

    for room in (40, 300, 1200):
        one_at_a_time, dropped = list(long), 0
        while len(template.prompt_ids(one_at_a_time)) > room and (fewer := without_oldest_exchange(one_at_a_time)) is not None:
            one_at_a_time, dropped = fewer, dropped + 1
        renders.clear()
        assert fit_messages(render, long, room) == (template.prompt_ids(one_at_a_time), one_at_a_time, dropped)
        assert len(renders) <= 9, renders  # one at a time took up to a hundred


def test_a_chat_runs_plain_completions_stop_at_its_end_of_turn_too(chat_run, cli):
    """A chat run records its template's end of turn as an end of generation: a plain completion of a rendered
    conversation stops there, as transformers' generate stops on its export (generation_config.json) and llama.cpp
    on its GGUF, instead of writing the next turn."""
    tokenizer = TextTokenizer.load(chat_run)
    turn_end = tokenizer.hf.token_to_id("<|im_end|>")
    assert turn_end in json.loads((chat_run / "tokenizer_config.json").read_text())["end_of_generation_ids"]
    template = ChatTemplate.for_tokenizer(tokenizer, json.loads((chat_run / "tokenizer_config.json").read_text()), "run")
    prompt = template.render([Message("user", "What about the dog?")], add_generation_prompt=True)
    result = cli("generate", chat_run, "--prompt", prompt, "-n", "10", "--json")
    assert result.code == 0, result.stderr
    completion = json.loads(result.stdout)["completions"][0]
    assert completion["finish_reason"] == "eos" and turn_end not in completion["tokens"], completion  # not "length" past it
