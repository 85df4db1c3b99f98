"""Llama-family and BERT interop: random models built locally with transformers (tiny configs, no network)
import with transformers' logits, export back to the same class with equal logits, and generate, fill
masks and classify as transformers does."""

from __future__ import annotations

import json
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


LLAMAS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-tied-biased-llama3-rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True, mlp_bias=False, rope_theta=5000.0,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})),
    "llama-linear-rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, mlp_bias=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=None, head_dim=8)),
}


def _llama(kind: str, vocab: int, folder, tokenizer_dir):
    config_class, model_class, extra = LLAMAS[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, rms_norm_eps=1e-5, **extra)
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
    prompt = tokenizer.encode(PROMPT)
    eos = tokenizer.special_ids.get("eos")
    suppressed = sorted({i for role, i in tokenizer.special_ids.items() if i != eos})  # tfcli never generates these
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos,
                          suppress_tokens=suppressed or None, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    assert completion["tokens"] == out[0, len(prompt):].tolist()


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


BERT_WORDS = ("once upon a time little fox found red ball in the park was happy so it played with all day tom had three "
              "apples he gave one to mia because she hungry thank you said smiled at cafe dog did not like rain but cat "
              "liked watch fall sat on mat . , ! \" ' ? ##s ##ed ##ing").split()
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
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40, **extra)
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
    assert f"{model_class}, {sum(p.numel() for p in hf.parameters()):,} parameters" in result.stdout
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
    result = cli("generate", tmp_path / "mlm-run", "--fill-mask", text, "--json")
    assert result.code == 0, result.stderr
    (mask,) = json.loads(result.stdout)["masks"]
    assert mask["fillers"][0]["token_id"] == int(logits.argmax())
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
    result = cli("train", "finetune", "--init-from", tmp_path / "llm", "--task", "lm", "--data", tmp_path / "shards",
                 "-o", tmp_path / "llm2", "--max-steps", "2", "--batch-size", "2", "--set", "block_size=16")
    assert result.code == 0, result.stderr
    assert load_checkpoint(tmp_path / "llm2").config.model.qkv_bias is True

    _bert("BertForMaskedLM", tmp_path / "bert")
    assert cli("import", tmp_path / "bert", "-o", tmp_path / "mlm").code == 0
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text("".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in
                               [("the fox was happy", "pos"), ("the dog did not like the rain", "neg")] * 8))
    result = cli("train", "finetune", "--init-from", tmp_path / "mlm", "--task", "classify", "--data", reviews,
                 "-o", tmp_path / "cls", "--max-steps", "2", "--batch-size", "4")
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
