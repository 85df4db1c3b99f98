"""Llama-family, Gemma 3 and BERT interop: random models built locally with transformers (tiny configs, no network)
import with transformers' logits, export back to the same class with equal logits, and generate, fill
masks and classify as transformers does."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from tfcli.checkpoint import load_checkpoint
from tfcli.tokenizer.core import TextTokenizer

transformers = pytest.importorskip("transformers")

PROMPT = "Once upon a time"


def _perturb(model) -> None:
    """Non-zero biases and norms, so a wrong mapping cannot hide."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)


def _save(model, folder, tokenizer_dir) -> None:
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, folder / name)


PHI3_IDS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)  # Phi3Config's defaults are past a tiny vocabulary
GEMMA3 = dict(  # local layers 0, 1 and 3 (a window of 8, rotary base 10,000), a global one (base 1e6, scaled); heads 16 wide
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=24,
    sliding_window=8,
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    rope_scaling={"rope_type": "linear", "factor": 2.0},
)
LLAMAS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-tied-biased-llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            attention_bias=True,
            mlp_bias=False,
            rope_theta=5000.0,
            rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        ),
    ),
    "llama-linear-rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, mlp_bias=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=None, head_dim=8)),
    # Qwen3: q/k norms, and heads wider than hidden_size / heads (16, not 8)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)),
    "qwen3-biased": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=1, head_dim=8, attention_bias=True, tie_word_embeddings=False)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2, **PHI3_IDS)),
    "phi3-longrope": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            original_max_position_embeddings=32,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 2.5, 4.0], "long_factor": [2.0, 3.0, 5.0, 9.0]},
            **PHI3_IDS,
        ),
    ),
    # Phi-4-mini: partial rotary (the first 6 of each head's 8 features turn), its longrope's factors one per turned
    # pair, a tied head
    "phi4-mini": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            partial_rotary_factor=0.75,
            original_max_position_embeddings=32,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.3, 2.5], "long_factor": [2.0, 3.0, 5.0]},
            tie_word_embeddings=True,
            **PHI3_IDS,
        ),
    ),
    "phi3-partial-rotary": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5, num_key_value_heads=2, **PHI3_IDS)),
    # Gemma 3 (text): Llama's test with Gemma's options; a window of 8 in 12 tokens, so it matters
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3),
    "gemma3-biased-untied": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(GEMMA3, num_key_value_heads=1, head_dim=8, hidden_size=32, query_pre_attn_scalar=8, attention_bias=True, tie_word_embeddings=False),
    ),
    # Gemma 2's final soft cap, which transformers' Gemma 3 still applies: tfcli's logit_softcap, both ways (a cap
    # of 0.5 bends these logits; the test's greedy text and logits are transformers')
    "gemma3-softcapped": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(GEMMA3, final_logit_softcapping=0.5)),
}


def _llama(kind: str, vocab: int, folder, tokenizer_dir, **overrides):
    config_class, model_class, extra = LLAMAS[kind]
    extra = {**extra, **overrides}
    torch.manual_seed(0)
    shape = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5
    )
    config = getattr(transformers, config_class)(**{**shape, **extra})
    model = getattr(transformers, model_class)(config).eval()
    _perturb(model)
    _save(model, folder, tokenizer_dir)
    return model


def _decoder_logits_equal(hf, ours, vocab) -> None:
    ids = torch.randint(0, vocab, (2, 12))
    real = torch.ones(2, 12, dtype=torch.bool)
    real[1, 8:] = False  # right padding
    with torch.no_grad():
        theirs = hf(ids, attention_mask=real.long()).logits
        mine = ours(ids, real).logits
    assert (theirs[real] - mine[real]).abs().max().item() < 1e-4


def _greedy_ids_equal(cli, run, hf, tokenizer: TextTokenizer) -> None:
    result = cli("generate", run, "-p", PROMPT, "--max-new-tokens", "12", "--json")
    assert result.code == 0, result.stderr
    (completion,) = json.loads(result.stdout)["completions"]
    prompt = ([tokenizer.special_ids["bos"]] if tokenizer.adds_bos else []) + tokenizer.encode(PROMPT)  # Llama's <s> first
    assert completion["prompt_tokens"] == len(prompt)
    eos = tokenizer.special_ids.get("eos")
    suppressed = sorted({i for role, i in tokenizer.special_ids.items() if i != eos})  # tfcli never generates these
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=eos,
            pad_token_id=eos,
            suppress_tokens=suppressed or None,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
    assert completion["tokens"] == out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("kind", list(LLAMAS))
def test_llama_family_imports_exports_and_generates_as_transformers(cli, tmp_path, trained_tokenizer, kind):
    tokenizer = TextTokenizer.load(trained_tokenizer)
    vocab = tokenizer.vocab_size
    hf = _llama(kind, vocab, tmp_path / "hf", trained_tokenizer)
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert LLAMAS[kind][1] in result.stdout and f"{sum(p.numel() for p in hf.parameters()):,} parameters" in result.stdout
    ours = load_checkpoint(tmp_path / "run")
    assert ours.config.source_class == LLAMAS[kind][1]
    _decoder_logits_equal(hf, ours.model, vocab)
    _greedy_ids_equal(cli, tmp_path / "run", hf, ours.tokenizer)
    result = cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "back")
    assert result.code == 0, result.stderr
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == [LLAMAS[kind][1]]
    again = getattr(transformers, LLAMAS[kind][1]).from_pretrained(str(tmp_path / "back")).eval()
    _decoder_logits_equal(again, ours.model, vocab)
    assert sum(p.numel() for p in again.parameters()) == sum(p.numel() for p in hf.parameters())


BERT_WORDS = (
    "once upon a time little fox found red ball in the park was happy so it played with all day tom had three "
    "apples he gave one to mia because she hungry thank you said smiled at cafe dog did not like rain but cat "
    "liked watch fall sat on mat . , ! \" ' ? ##s ##ed ##ing"
).split()
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _bert_vocab(folder) -> list[str]:
    """BERT's tokenizer files as the hub often has them: vocab.txt alone (no tokenizer.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = BERT_SPECIALS + sorted(set(BERT_WORDS))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}))
    return vocab


def _bert(model_class: str, folder, **extra):
    vocab = _bert_vocab(folder)
    torch.manual_seed(2)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=40, **extra
    )
    model = getattr(transformers, model_class)(config).eval()
    _perturb(model)
    model.save_pretrained(str(folder), safe_serialization=True)
    return model


def _padded_batch(vocab: int):
    ids = torch.randint(5, vocab, (2, 10))
    real = torch.ones(2, 10, dtype=torch.bool)
    real[1, 7:] = False
    return ids, real


@pytest.mark.parametrize("model_class", ["BertForMaskedLM", "BertModel", "BertForSequenceClassification"])
def test_bert_imports_and_exports_with_transformers_outputs(cli, tmp_path, model_class):
    extra = dict(id2label={0: "neg", 1: "pos", 2: "meh"}, label2id={"neg": 0, "pos": 1, "meh": 2}) if "Sequence" in model_class else {}
    hf = _bert(model_class, tmp_path / "hf", **extra)
    vocab = hf.config.vocab_size
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert f"{model_class}, {sum(p.numel() for p in hf.parameters()):,} parameters" in " ".join(result.stdout.split())  # as wrapped at any width
    ours = load_checkpoint(tmp_path / "run")
    ids, real = _padded_batch(vocab)

    def same_outputs(reference) -> None:
        with torch.no_grad():
            theirs = reference(ids, attention_mask=real.long())
            mine = ours.model(ids, real)
        if model_class == "BertForMaskedLM":
            assert (theirs.logits[real] - mine.logits[real]).abs().max().item() < 1e-4
        elif model_class == "BertModel":
            assert (theirs.last_hidden_state[real] - mine.hidden[real]).abs().max().item() < 1e-4
            assert (theirs.pooler_output - torch.tanh(ours.model.pooler(mine.hidden[:, 0]))).abs().max().item() < 1e-4
        else:
            assert (theirs.logits - mine.class_logits).abs().max().item() < 1e-4

    same_outputs(hf)
    result = cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "back")
    assert result.code == 0, result.stderr
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["architectures"] == [model_class]
    again = getattr(transformers, model_class).from_pretrained(str(tmp_path / "back")).eval()
    same_outputs(again)
    assert sum(p.numel() for p in again.parameters()) == sum(p.numel() for p in hf.parameters())
    if "Sequence" in model_class:
        assert back["id2label"] == {"0": "neg", "1": "pos", "2": "meh"}


def test_bert_fill_mask_and_classify_agree_with_transformers(cli, tmp_path):
    hf = _bert("BertForMaskedLM", tmp_path / "mlm")
    assert cli("import", tmp_path / "mlm", "-o", tmp_path / "mlm-run").code == 0
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "mlm"))  # from vocab.txt, as tfcli imports it
    text = "The fox [MASK] in the park."
    encoded = auto(text, return_tensors="pt")
    ours = TextTokenizer.load(tmp_path / "mlm-run")
    assert ours.special_ids["mask"] == auto.mask_token_id and ours.special_ids["sep"] == auto.sep_token_id
    with torch.no_grad():
        logits = hf(**encoded).logits[0, encoded["input_ids"][0].tolist().index(auto.mask_token_id)]
    logits[[auto.convert_tokens_to_ids(t) for t in BERT_SPECIALS]] = float("-inf")  # fill-mask proposes text only
    result = cli("generate", tmp_path / "mlm-run", "--fill-mask", text, "--json", "--top-k", "60")
    assert result.code == 0, result.stderr
    (mask,) = json.loads(result.stdout)["masks"]
    assert mask["fillers"][0]["token_id"] == int(logits.argmax())
    continuation = next(f for f in mask["fillers"] if f["token"] == "##ed")  # a WordPiece suffix ends the word before
    assert continuation["text"] == "The foxed in the park."
    assert ours.encode(text.replace("[MASK]", "happy")) == auto(text.replace("[MASK]", "happy"), add_special_tokens=False)["input_ids"]

    hf = _bert("BertForSequenceClassification", tmp_path / "cls", id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    assert cli("import", tmp_path / "cls", "-o", tmp_path / "cls-run").code == 0
    for text in ("the fox was happy", "the dog did not like the rain!"):
        with torch.no_grad():  # BERT reads [CLS] text [SEP], and so does tfcli with BERT's tokenizer
            probs = torch.softmax(hf(**auto(text, return_tensors="pt")).logits[0], dim=-1)
        result = cli("generate", tmp_path / "cls-run", "--classify", text, "--json")
        assert result.code == 0, result.stderr
        top = json.loads(result.stdout)["labels"][0]
        assert top["label"] == hf.config.id2label[int(probs.argmax())]
        assert abs(top["probability"] - float(probs.max())) < 1e-4


def test_imported_models_finetune_and_show_their_attention(cli, tmp_path, trained_tokenizer, tiny_corpus):
    _llama("qwen2", TextTokenizer.load(trained_tokenizer).vocab_size, tmp_path / "qwen2", trained_tokenizer)
    assert cli("import", tmp_path / "qwen2", "-o", tmp_path / "llm").code == 0
    shards = cli("tokenize", "encode", tiny_corpus, "--tokenizer", tmp_path / "llm" / "tokenizer.json", "-o", tmp_path / "shards")
    assert shards.code == 0, shards.stderr
    result = cli(
        "train",
        "finetune",
        "--init-from",
        tmp_path / "llm",
        "--task",
        "lm",
        "--data",
        tmp_path / "shards",
        "-o",
        tmp_path / "llm2",
        "--max-steps",
        "2",
        "--batch-size",
        "2",
        "--set",
        "block_size=16",
    )
    assert result.code == 0, result.stderr
    assert load_checkpoint(tmp_path / "llm2").config.model.qkv_bias is True

    _bert("BertForMaskedLM", tmp_path / "bert")
    assert cli("import", tmp_path / "bert", "-o", tmp_path / "mlm").code == 0
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text(
        "".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in [("the fox was happy", "pos"), ("the dog did not like the rain", "neg")] * 8)
    )
    result = cli(
        "train",
        "finetune",
        "--init-from",
        tmp_path / "mlm",
        "--task",
        "classify",
        "--data",
        reviews,
        "-o",
        tmp_path / "cls",
        "--max-steps",
        "2",
        "--batch-size",
        "4",
    )
    assert result.code == 0, result.stderr
    classifier = load_checkpoint(tmp_path / "cls")
    assert classifier.config.model.pooler and classifier.config.model.n_classes == 2  # BERT's classifier reads a pooler
    assert cli("export", tmp_path / "cls", "-o", tmp_path / "cls-hf").code == 0
    again = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "cls-hf")).eval()
    ids, real = _padded_batch(again.config.vocab_size)
    with torch.no_grad():
        assert (again(ids, attention_mask=real.long()).logits - classifier.model(ids, real).class_logits).abs().max().item() < 1e-4
    for run in ("llm", "mlm", "cls"):
        result = cli("inspect-attention", tmp_path / run, "--text", "the fox was happy", "--format", "json")
        assert result.code == 0, result.stderr
        assert json.loads(result.stdout)


def _unigram_tokenizer(folder, specials: list[str]) -> None:
    """A SentencePiece-style Unigram tokenizer.json (Metaspace), as Llama-family folders ship them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = [(s, 0.0) for s in specials] + [(c, -3.0) for c in "abcdefghijklmnopqrstuvwxyzOT .,!\u2581"]
    pieces += [(f"\u2581{w}", -2.0) for w in "once upon a time the fox was happy".split()]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=specials.index("<unk>") if "<unk>" in specials else None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    if specials:
        tokenizer.add_special_tokens(specials)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def test_a_unigram_tokenizer_takes_its_roles_from_special_tokens_map(cli, tmp_path):
    _unigram_tokenizer(tmp_path / "tok", ["<unk>", "<s>", "</s>"])
    vocab = TextTokenizer.load(tmp_path / "tok").vocab_size
    hf = _llama("llama", vocab, tmp_path / "hf", tmp_path / "tok")
    (tmp_path / "hf" / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": False}, "unk_token": "<unk>", "pad_token": "<pad>"})
    )
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "tokenizer_class": "LlamaTokenizer"}))
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert "pad_token '<pad>' is not in the vocabulary" in result.stderr  # said, and the import goes on
    ours = TextTokenizer.load(tmp_path / "run")
    assert ours.special_ids == {"bos": 1, "eos": 2, "unk": 0, "cls": 1}  # <s> is also a well-known [cls] name
    assert ours.adds_bos  # prompts start with <s>, as transformers' Llama tokenizer starts them
    _greedy_ids_equal(cli, tmp_path / "run", hf, ours)
    info = cli("info", tmp_path / "run", "--json")
    data = json.loads(info.stdout)
    assert data["source_class"] == "LlamaForCausalLM" and data["source_parameters"] == sum(p.numel() for p in hf.parameters())
    assert data["tokenizer"]["special_tokens"]["eos"] == "</s>"


def test_a_folder_without_special_tokens_imports_and_says_what_is_missing_where_needed(cli, tmp_path, tiny_corpus):
    _unigram_tokenizer(tmp_path / "tok", [])
    vocab = TextTokenizer.load(tmp_path / "tok").vocab_size
    _llama("mistral", vocab, tmp_path / "hf", tmp_path / "tok")
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    assert TextTokenizer.load(tmp_path / "run").special_ids == {}
    result = cli("generate", tmp_path / "run", "-p", "once upon a time", "--max-new-tokens", "5", "--json")
    assert result.code == 0, result.stderr  # no end-of-text token: it runs to --max-new-tokens
    (completion,) = json.loads(result.stdout)["completions"]
    assert completion["finish_reason"] == "length"
    assert cli("info", tmp_path / "run").code == 0
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text("".join(json.dumps({"text": t, "label": t[:3]}) + "\n" for t in ["the fox", "was happy"] * 4))
    result = cli("train", "finetune", "--init-from", tmp_path / "run", "--task", "classify", "--data", reviews, "-o", tmp_path / "cls")
    assert result.code == 2 and "has no" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_sharded_weights_import_and_pickle_is_refused_unopened(cli, tmp_path, trained_tokenizer, monkeypatch):
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    hf = _llama("qwen2", vocab, tmp_path / "hf", trained_tokenizer)
    hf.save_pretrained(str(tmp_path / "sharded"), safe_serialization=True, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "hf" / name, tmp_path / "sharded" / name)
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert cli("import", tmp_path / "sharded", "-o", tmp_path / "run").code == 0
    _decoder_logits_equal(hf, load_checkpoint(tmp_path / "run").model, vocab)

    (tmp_path / "sharded" / shards[-1]).unlink()
    result = cli("import", tmp_path / "sharded", "-o", tmp_path / "run2")
    assert result.code == 2 and f"lacks {shards[-1]}" in result.stderr and not (tmp_path / "run2").exists()

    import pickle

    def never(*args, **kwargs):
        raise AssertionError("a pickle was opened")

    monkeypatch.setattr(torch, "load", never)
    monkeypatch.setattr(pickle, "load", never)
    monkeypatch.setattr(pickle, "Unpickler", never)
    (tmp_path / "pickled").mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(tmp_path / "hf" / name, tmp_path / "pickled" / name)
    torch.save({"x": torch.zeros(1)}, tmp_path / "pickled" / "pytorch_model.bin")
    result = cli("import", tmp_path / "pickled", "-o", tmp_path / "run3")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "pytorch_model.bin, a pickle file" in result.stderr and "convert it to safetensors" in result.stderr
    assert not (tmp_path / "run3").exists()


def _edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(hidden_size=None), "lacks the key 'hidden_size'"),
        (dict(num_key_value_heads="2"), 'has num_key_value_heads "2", which is not a whole number'),
        (dict(architectures=["T5ForConditionalGeneration"]), "describes 'T5ForConditionalGeneration', which tfcli cannot import"),
        (dict(architectures=None, model_type="gpt_neox"), "describes model_type 'gpt_neox'"),
        (dict(intermediate_size=48), "has shape [32, 64] but config.json implies [32, 48]"),
        (dict(vocab_size=100), "has shape"),
        (dict(num_key_value_heads=3), "n_kv_heads (3) must divide n_heads (4)"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}, rope_parameters=None), "rope scaling 'yarn'"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
        (dict(partial_rotary_factor=0.5), "rotates only part of each head"),
        (
            dict(
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 1e4,
                    "short_factor": [1, 2],
                    "long_factor": [1, 2],
                    "original_max_position_embeddings": 16,
                }
            ),
            "needs 4 positive short_factor values",
        ),
        (dict(rope_parameters={"rope_type": "longrope", "short_factor": "1 2 3 4", "original_max_position_embeddings": 16}), "not a list of numbers"),
    ],
)
def test_bad_llama_folders_are_one_line_and_leave_nothing(cli, tmp_path, trained_tokenizer, changes, message):
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    _llama("llama", vocab, tmp_path / "hf", trained_tokenizer)
    _edit_config(tmp_path / "hf", **changes)
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_larger_than_the_embedding_is_refused(cli, tmp_path, trained_tokenizer):
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    _llama("llama", vocab - 10, tmp_path / "hf", trained_tokenizer)
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 2 and f"has {vocab:,} tokens but the model only {vocab - 10:,}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_hub_style_bert_checkpoint_imports(cli, tmp_path):
    """bert-base-uncased's file: LayerNorm gamma/beta names from TensorFlow, plus tensors BertForMaskedLM does
    not use (the pooler, the next-sentence head, integer position ids), all read as transformers reads them."""
    from safetensors.torch import load_file, save_file

    hf = _bert("BertForMaskedLM", tmp_path / "hub")
    tensors = load_file(str(tmp_path / "hub" / "model.safetensors"))
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in tensors.items()}
    renamed.update(
        {
            "bert.pooler.dense.weight": torch.zeros(32, 32),
            "cls.seq_relationship.weight": torch.zeros(2, 32),
            "bert.embeddings.position_ids": torch.arange(40)[None],
        }
    )
    save_file(renamed, str(tmp_path / "hub" / "model.safetensors"), metadata={"format": "pt"})
    assert cli("import", tmp_path / "hub", "-o", tmp_path / "run").code == 0
    ids, real = _padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        assert (hf(ids, attention_mask=real.long()).logits[real] - load_checkpoint(tmp_path / "run").model(ids, real).logits[real]).abs().max() < 1e-4


@pytest.mark.parametrize(
    "kind, window, local_layers",
    [
        ("mistral", dict(sliding_window=6), (0, 1)),
        ("phi3", dict(sliding_window=6), (0, 1)),  # Phi-3-mini-4k's window is 2,047 of its 4,096
        ("qwen2", dict(use_sliding_window=True, sliding_window=6, max_window_layers=1), (1,)),  # the layers from max_window_layers on
    ],
)
def test_a_sliding_window_shorter_than_the_context_is_kept_on_its_layers(cli, tmp_path, trained_tokenizer, kind, window, local_layers):
    """Import once cut the context to the window (the same attention within it), so generating past the window
    went another way than transformers; the window is now the local layers' (Gemma 3's), both ways."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    hf = _llama(kind, tokenizer.vocab_size, tmp_path / "hf", trained_tokenizer, **window)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    ours = load_checkpoint(tmp_path / "run")
    model = ours.config.model
    assert (model.block_size, model.sliding_window, model.local_layers) == (64, 6, local_layers)
    ids = torch.randint(5, tokenizer.vocab_size, (1, 20))  # three windows
    with torch.no_grad():
        theirs = hf(ids).logits
        assert (theirs - ours.model(ids).logits).abs().max() < 1e-4
    _greedy_ids_equal(cli, tmp_path / "run", hf, tokenizer)  # 12 tokens past a prompt: past the window
    assert cli("export", tmp_path / "run", "--to", "hf", "-o", tmp_path / "back").code == 0
    back = getattr(transformers, LLAMAS[kind][1]).from_pretrained(str(tmp_path / "back")).eval()
    assert back.config.sliding_window == 6
    with torch.no_grad():
        assert (back(ids).logits - theirs).abs().max() < 1e-4


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(position_embedding_type="relative_key"), "position_embedding_type 'relative_key'"),
        (dict(hidden_act="gelu_new"), "hidden_act 'gelu_new'"),
        (dict(architectures=["BertForPreTraining"]), "'BertForPreTraining', which tfcli cannot import"),
        (dict(max_position_embeddings=30), "has shape [40, 32] but config.json implies [30, 32]"),
    ],
)
def test_bad_bert_folders_are_one_line(cli, tmp_path, changes, message):
    _bert("BertForMaskedLM", tmp_path / "hf")
    _edit_config(tmp_path / "hf", **changes)
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_long_context_holds_a_cache_only_as_long_as_the_request(cli, tmp_path, trained_tokenizer, monkeypatch):
    import tfcli.generate.window as window

    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    hf = _llama("llama", vocab, tmp_path / "hf", trained_tokenizer, max_position_embeddings=4096)
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "run").code == 0
    capacities = []
    real_cache = window.KVCache

    def recording(config, batch, capacity, *args, **kwargs):
        capacities.append(capacity)
        return real_cache(config, batch, capacity, *args, **kwargs)

    monkeypatch.setattr(window, "KVCache", recording)
    _greedy_ids_equal(cli, tmp_path / "run", hf, load_checkpoint(tmp_path / "run").tokenizer)
    assert capacities == [len(TextTokenizer.load(trained_tokenizer).encode(PROMPT)) + 12]  # not 4,096 positions


def test_longrope_is_transformers_up_to_its_original_context_as_the_hub_writes_it(cli, tmp_path, trained_tokenizer):
    """Phi-3-mini-128k's config.json: the older rope_scaling (type longrope) and original_max_position_embeddings
    beside it. Up to that context transformers turns q and k by the short factors, scaled by the attention
    factor it computes; tfcli's tables are the same, and its context stops there."""
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    hf = _llama("phi3-longrope", vocab, tmp_path / "hf", trained_tokenizer)
    scaling = {"type": "longrope", "short_factor": [1.0, 1.3, 2.5, 4.0], "long_factor": [2.0, 3.0, 5.0, 9.0]}
    _edit_config(tmp_path / "hf", rope_parameters=None, rope_scaling=scaling, rope_theta=10000.0)
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0 and "context 32 (longrope's original context" in result.stderr, result.stderr
    ours = load_checkpoint(tmp_path / "run")
    assert ours.config.model.block_size == 32 and ours.config.model.rope_scaling.short_factor == (1.0, 1.3, 2.5, 4.0)
    positions = torch.arange(32)[None]
    with torch.no_grad():
        cos, sin = hf.model.rotary_emb(torch.zeros(1, 32, 8), positions)  # (1, 32, hs), attention factor included
    torch.testing.assert_close(ours.model.rotary.cos, cos[0])
    torch.testing.assert_close(ours.model.rotary.sin, sin[0])
    assert ours.model.rotary.cos[0, 0] == pytest.approx((1 + math.log(2) / math.log(32)) ** 0.5)  # factor 64 / 32
    _decoder_logits_equal(hf, ours.model, vocab)


def test_gemma3_is_transformers_past_its_window_and_reads_the_hubs_older_keys(cli, tmp_path, trained_tokenizer):
    """Gemma 3's config.json as the hub first wrote it: rope_theta, rope_scaling and rope_local_base_freq
    instead of rope_parameters, and sliding_window_pattern (every 2nd layer global) instead of layer_types.
    Its RMSNorm weights are offsets from 1 (tfcli holds 1 + theirs), its embeddings are scaled by sqrt(64),
    and 40 tokens are five windows: logits equal transformers' on a padded batch."""
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    hf = _llama("gemma3", vocab, tmp_path / "hf", trained_tokenizer, layer_types=None, sliding_window_pattern=2, rope_local_base_freq=500.0)
    assert hf.config.layer_types == ["sliding_attention", "full_attention"] * 2
    _edit_config(
        tmp_path / "hf",
        rope_parameters=None,
        layer_types=None,
        sliding_window_pattern=2,
        rope_theta=1e6,
        rope_local_base_freq=500.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 0, result.stderr
    ours = load_checkpoint(tmp_path / "run")
    model = ours.config.model
    assert (model.local_layers, model.sliding_window, model.rope_local_base, model.rope_base) == ((0, 2), 8, 500.0, 1e6)
    assert model.attn_scale == 24**-0.5 and model.post_norms and model.scale_embeddings and model.activation == "geglu"
    norm = hf.model.layers[0].post_feedforward_layernorm.weight
    torch.testing.assert_close(ours.model.decoder.blocks[0].mlp_out_norm.weight, 1 + norm, rtol=0, atol=0)
    ids = torch.randint(0, vocab, (2, 40))
    real = torch.ones(2, 40, dtype=torch.bool)
    real[1, 29:] = False
    with torch.no_grad():
        theirs, mine = hf(ids, attention_mask=real.long()).logits, ours.model(ids, real).logits
    assert (theirs[real] - mine[real]).abs().max().item() < 1e-4
    info = cli("info", tmp_path / "run")
    said = " ".join(info.stdout.split())  # the table wraps its cells to the terminal's width
    assert "geglu" in said and "window 8 on 2 of 4 layers (rope base 500)" in said and "sublayer output norms" in said


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(final_logit_softcapping=0.0), "has final_logit_softcapping 0, which is not positive"),
        (dict(attn_logit_softcapping=50.0), "has attn_logit_softcapping 50.0; tfcli does not soft-cap attention scores"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention true"),
        (dict(hidden_activation="gelu"), "hidden_activation 'gelu'"),
        (dict(layer_types=["sliding_attention"] * 3), "layer_types that are not 4 of"),
        (
            dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
            "scales the local layers' rotary frequencies",
        ),
    ],
)
def test_bad_gemma3_folders_are_one_line(cli, tmp_path, trained_tokenizer, changes, message):
    vocab = TextTokenizer.load(trained_tokenizer).vocab_size
    _llama("gemma3", vocab, tmp_path / "hf", trained_tokenizer)
    _edit_config(tmp_path / "hf", **changes)
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert result.code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


ROTARY = dict(positions="rotary", norm="rmsnorm", activation="swiglu", bias=False)
GEMMA3_SHAPED = dict(ROTARY, activation="geglu", post_norms=True, qk_norm=True, scale_embeddings=True)
BERT_SHAPED = dict(arch="encoder", norm_placement="post", embedding_norm=True, type_vocab_size=2)
LONGROPE = {"kind": "longrope", "factor": 2.0, "original_context": 32, "short_factor": [1.0, 1.5, 2.0, 3.0]}


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(qk_norm=True), "GPT2LMHeadModel cannot express this model: qk_norm"),
        (dict(d_head=16), "GPT2LMHeadModel cannot express this model: d_head 16"),
        (dict(ROTARY, qk_norm=True, qkv_bias=True), "Qwen3ForCausalLM cannot express this model: biases on q, k and v but not on the attention output"),
        (dict(ROTARY, bias=True, rope_scaling=LONGROPE), r"Phi3ForCausalLM cannot express this model: biases \(Phi3ForCausalLM has none\)"),
        (dict(ROTARY, post_norms=True), "Gemma3ForCausalLM cannot express this model: activation 'swiglu'"),
        (dict(ROTARY, activation="geglu", post_norms=True, scale_embeddings=True), "Gemma3ForCausalLM cannot express this model: no qk_norm"),
        (dict(ROTARY, activation="geglu", post_norms=True, qk_norm=True, scale_embeddings=True, attn_scale=0.3), r"attn_scale 0.3 \(Gemma3ForCausalLM's"),
        (dict(arch="encoder", norm_placement="post", scale_embeddings=True), r"scale_embeddings \(only Gemma3ForCausalLM has it\)"),
        # the speedrun's: ReLU² and the logits' soft cap, named for every class that cannot express them
        (dict(activation="relu2"), r"GPT2LMHeadModel cannot express this model: activation 'relu2' \(GPT-2 has gelu"),
        (dict(ROTARY, activation="relu2"), "LlamaForCausalLM cannot express this model: activation 'relu2'"),
        (dict(GEMMA3_SHAPED, activation="relu2"), "Gemma3ForCausalLM cannot express this model: activation 'relu2'"),
        (dict(BERT_SHAPED, activation="relu2"), "BertForMaskedLM cannot express this model: activation 'relu2'"),
        (dict(logit_softcap=30.0), r"GPT2LMHeadModel cannot express this model: logit_softcap 30 \(GPT2LMHeadModel does not soft-cap"),
        (
            dict(ROTARY, logit_softcap=30.0),
            "LlamaForCausalLM cannot express this model: logit_softcap 30.*GPT2LMHeadModel cannot express this model: logit_softcap",
        ),
        (dict(ROTARY, qk_norm=True, logit_softcap=30.0), "Qwen3ForCausalLM cannot express this model: logit_softcap 30"),
        (dict(BERT_SHAPED, logit_softcap=30.0), "BertForMaskedLM cannot express this model: logit_softcap 30"),
        (dict(arch="encoder-decoder", logit_softcap=30.0), "logit_softcap 30"),
    ],
)
def test_export_names_what_the_new_options_rule_out(options, message):
    from tfcli.errors import TfcliError
    from tfcli.hf.convert import export_class
    from tfcli.model.config import ModelConfig

    config = ModelConfig.from_json(dict(vocab_size=50, block_size=32, n_layers=1, n_heads=4, d_model=32, **options))
    with pytest.raises(TfcliError, match=message):
        export_class(config, None)


def test_the_speedrun_init_and_head_export_and_a_gemma3_shaped_soft_cap_is_final_logit_softcapping():
    """zero_init_proj is an initialisation and an untied head a tensor of its own: every class takes them. A
    Gemma 3-shaped run's soft cap is its final_logit_softcapping."""
    from tfcli.hf import gemma3
    from tfcli.hf.convert import export_class
    from tfcli.model.config import ModelConfig

    shape = dict(vocab_size=50, block_size=32, n_layers=1, n_heads=4, d_model=32, zero_init_proj=True, tie_embeddings=False)
    assert export_class(ModelConfig.from_json(shape), None) == "GPT2LMHeadModel"
    assert export_class(ModelConfig.from_json(dict(shape, **ROTARY)), None) == "LlamaForCausalLM"
    config = ModelConfig.from_json(dict(shape, **GEMMA3_SHAPED, logit_softcap=30.0))
    assert export_class(config, None) == gemma3.CLASS
    hf = gemma3.hf_config(config, gemma3.CLASS, {})
    assert hf["final_logit_softcapping"] == 30.0 and hf["attn_logit_softcapping"] is None and hf["tie_word_embeddings"] is False
    assert gemma3.hf_config(config.with_overrides(logit_softcap=None), gemma3.CLASS, {})["final_logit_softcapping"] is None


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(rope_fraction=0.0), r"rope_fraction must be in \(0, 1\]"),
        (dict(rope_fraction=0.5), "below 1 only with positions=rotary"),  # learned positions
        (dict(positions="rotary", rope_fraction=0.7), r"an even rotary width \(head size 8 times rope_fraction 0.7\), not 5"),
        (dict(positions="rotary", rope_fraction=0.2), "an even rotary width .* not 1"),
    ],
)
def test_a_partial_rotary_tfcli_cannot_build_is_one_clear_error(options, message):
    from tfcli.errors import TfcliError
    from tfcli.model.config import ModelConfig

    with pytest.raises(TfcliError, match=message):
        ModelConfig.from_json(dict(vocab_size=50, block_size=32, n_layers=1, n_heads=4, d_model=32, **options))


def test_partial_rotary_turns_the_first_features_and_passes_the_rest():
    """Phi-4-mini's rotary on 6 of 8 features: the last 2 of each head leave unturned, the first 6 as a 6-wide rotary turns them."""
    from tfcli.model.layers import RotaryEmbedding

    torch.manual_seed(0)
    x = torch.randn(1, 5, 2, 8)  # (B, T, heads, hs)
    turned = RotaryEmbedding(6, 16, 10000.0)(x, offset=3)
    torch.testing.assert_close(turned[..., 6:], x[..., 6:], rtol=0, atol=0)
    torch.testing.assert_close(turned[..., :6], RotaryEmbedding(6, 16, 10000.0)(x[..., :6].contiguous(), offset=3))
    assert not torch.allclose(turned[..., :6], x[..., :6])
