"""The run directory: a pickle-free, atomic, fully validated checkpoint, and `tfcli info` over it."""

from __future__ import annotations

import json
import pickle
import stat
import subprocess
import sys

import pytest
import safetensors.torch
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import tfcli.info
from tests.conftest import snapshot
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.corpus.reader import resolve_corpus
from tfcli.errors import TfcliError
from tfcli.meta_device import on_meta_device
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import DecoderInput, Transformer
from tfcli.rundir import CONFIG_FILE, WEIGHTS_FILE
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig


@pytest.fixture
def tokenizer(trained_tokenizer):
    return TextTokenizer.load(trained_tokenizer)


def _model(tokenizer, **overrides) -> Transformer:
    torch.manual_seed(0)
    base = dict(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=2, n_heads=4, d_model=32, d_ff=64)
    return Transformer(ModelConfig(**{**base, **overrides})).eval()


@pytest.fixture
def run(tmp_path, tokenizer):
    save_checkpoint(tmp_path / "run", _model(tokenizer), tokenizer)
    return tmp_path / "run"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(arch="encoder", n_classes=3),
        dict(arch="encoder-decoder", n_kv_heads=1),
        dict(tie_embeddings=False, positions="rotary", activation="swiglu", norm="rmsnorm"),
        dict(positions="sinusoidal", norm_placement="post"),
    ],
)
def test_round_trip_gives_the_same_logits(tmp_path, tokenizer, overrides):
    model = _model(tokenizer, **overrides)
    save_checkpoint(tmp_path / "run", model, tokenizer, source="a test")
    loaded = load_checkpoint(tmp_path / "run")
    ids = torch.randint(0, tokenizer.vocab_size, (2, 9))
    kwargs = {"decoder": DecoderInput(ids[:, :4])} if model.config.arch == "encoder-decoder" else {}
    assert torch.equal(loaded.model(ids, **kwargs).logits, model(ids, **kwargs).logits)
    assert loaded.config.model == model.config and loaded.config.source == "a test"
    assert loaded.tokenizer.sha256 == tokenizer.sha256
    if model.config.tie_embeddings:
        assert loaded.model.lm_head.weight is loaded.model.tok_emb.weight
    assert not any(t.is_meta for t in [*loaded.model.parameters(), *loaded.model.buffers()])


def test_a_model_built_on_the_meta_device_has_the_shapes_and_no_data():

    config = ModelConfig(vocab_size=50, block_size=16, n_layers=2, n_heads=2, d_model=16, d_ff=32, positions="learned", n_classes=3)
    with on_meta_device():
        skeleton = Transformer(config)
    real = Transformer(config).state_dict()
    assert {k: v.shape for k, v in skeleton.state_dict().items()} == {k: v.shape for k, v in real.items()}
    assert all(p.is_meta for p in skeleton.parameters())
    assert not torch.empty(2).is_meta  # the device is the default again after the block


def test_loading_a_run_does_not_import_torch_dynamo(run):
    """On the meta device nn.init.normal_ would import torch._dynamo, 1.5 s of every command's start."""

    code = "import sys; from tfcli.checkpoint import load_checkpoint; load_checkpoint(sys.argv[1]); print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_files_and_format(run):
    assert sorted(p.name for p in run.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json"]
    with safe_open(str(run / WEIGHTS_FILE), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
        assert "lm_head.weight" not in handle.keys() and "tok_emb.weight" in handle.keys()  # tied: saved once
    assert stat.S_IMODE((run / WEIGHTS_FILE).stat().st_mode) & 0o044  # readable by others, like any file


def test_a_save_that_fails_half_way_keeps_the_previous_checkpoint(run, tokenizer, monkeypatch):

    before = snapshot(run)

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError):
        save_checkpoint(run, _model(tokenizer, d_ff=128), tokenizer)
    assert snapshot(run) == before
    assert not [p for p in run.iterdir() if p.name.startswith(".")]
    load_checkpoint(run)


def test_non_finite_weights_are_never_saved(tmp_path, tokenizer):
    model = _model(tokenizer)
    with torch.no_grad():
        model.decoder.blocks[1].mlp.fc.weight[0, 0] = float("nan")
    with pytest.raises(TfcliError, match="decoder.blocks.1.mlp.fc.weight"):
        save_checkpoint(tmp_path / "run", model, tokenizer)
    assert not (tmp_path / "run" / WEIGHTS_FILE).exists()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickle_is_never_loaded(tmp_path, run):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    (tmp_path / "model.bin").write_bytes(payload)
    with pytest.raises(TfcliError, match="pickle"):
        load_checkpoint(tmp_path / "model.bin")
    only_pickle = tmp_path / "hf"
    only_pickle.mkdir()
    (only_pickle / "pytorch_model.bin").write_bytes(payload)
    with pytest.raises(TfcliError, match="never loads pickle"):
        load_checkpoint(only_pickle)
    (run / WEIGHTS_FILE).write_bytes(payload)  # a pickle under the safetensors name
    config = json.loads((run / CONFIG_FILE).read_text())
    config["weights_bytes"] = len(payload)
    (run / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(TfcliError, match="not a valid safetensors file"):
        load_checkpoint(run)
    assert not marker.exists()


def _set_weights_bytes(run, size):
    config = json.loads((run / CONFIG_FILE).read_text())
    config["weights_bytes"] = size
    (run / CONFIG_FILE).write_text(json.dumps(config))


def test_truncated_and_corrupted_weights(run):
    data = (run / WEIGHTS_FILE).read_bytes()
    (run / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(TfcliError, match="truncated"):
        load_checkpoint(run)
    _set_weights_bytes(run, len(data) // 2)
    with pytest.raises(TfcliError, match="not a valid safetensors file"):
        load_checkpoint(run)
    (run / WEIGHTS_FILE).write_bytes(data[:8] + b"{garbage" + data[16:])
    _set_weights_bytes(run, len(data))
    with pytest.raises(TfcliError, match="not a valid safetensors file"):
        load_checkpoint(run)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["model"].update(hidden=3), "unknown key 'hidden'"),
        (lambda c: c["model"].update(n_layers="two"), "config.json.model.n_layers must be an integer"),
        (lambda c: c.update(surprise=True), "unknown key 'surprise'"),
        (lambda c: c["model"].update(d_ff=128), r"tensor decoder.blocks.0.mlp.fc.bias has shape \[64\] but the config implies \[128\]"),
        (lambda c: c["model"].update(n_layers=3), "lacks the tensor decoder.blocks.2"),
        (lambda c: c["model"].update(d_model=1 << 20, n_heads=1), "absurd"),
        (lambda c: c["model"].update(n_layers=1000, d_model=16384, n_heads=16, d_ff=65536), "parameters"),
        (lambda c: c.update(format_version=99), "checkpoint format 99"),
        (lambda c: c.update(training={"labels": ["good", "bad"]}), "has training.labels but no classifier"),
        (lambda c: c.update(training={"config": {"max_steps": "abc"}}), r"config.json: training.config.max_steps must be an integer"),
        (lambda c: c.update(training={"config": {"foo": 1}}), r"config.json: training.config has unknown key 'foo'"),
        (lambda c: c.update(training={"config": {"mask_prob": 2.0}}), "training setting mask_prob must be in"),
        (lambda c: c.update(training={"step": "x"}), r"training.step must be an integer"),
        (lambda c: c.update(training={"steps": 3}), r"training has unknown key 'steps'"),
        (lambda c: c.update(training=[1, 2]), "must be"),
    ],
)
def test_bad_configs_are_refused_by_name(run, edit, message):
    config = json.loads((run / CONFIG_FILE).read_text())
    edit(config)
    (run / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(TfcliError, match=message):
        load_checkpoint(run)


def test_a_training_section_written_by_hand_may_hold_part_of_the_record(run):
    config = json.loads((run / CONFIG_FILE).read_text())
    config["training"] = {"task": "lm", "data": "somewhere", "step": 5}
    (run / CONFIG_FILE).write_text(json.dumps(config))
    assert load_checkpoint(run).config.training["step"] == 5


@pytest.mark.parametrize("labels", [[1, 2], ["good"], "ab", ["good", "good"], ["good", "bad", "ugly"]])
def test_class_names_must_name_each_class_once(tmp_path, tokenizer, labels):
    save_checkpoint(tmp_path / "run", _model(tokenizer, n_classes=2), tokenizer, training={"task": "classify", "labels": ["good", "bad"]})
    load_checkpoint(tmp_path / "run")
    config = json.loads((tmp_path / "run" / CONFIG_FILE).read_text())
    config["training"]["labels"] = labels
    (tmp_path / "run" / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(TfcliError, match="which is not a list of the 2 distinct class names"):
        load_checkpoint(tmp_path / "run")


def test_a_hugging_face_folder_is_named_as_one(run):
    (run / CONFIG_FILE).write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "activation_function": "gelu_new"}))
    with pytest.raises(TfcliError, match="is a Hugging Face model folder, not a tfcli run directory") as caught:
        load_checkpoint(run)
    assert "tfcli import" in caught.value.hint


def test_a_tokenizer_that_does_not_match(run, tmp_path, tiny_corpus):

    for size, message in [(350, "has 350 tokens but the model's vocabulary only 320"), (290, "not the tokenizer this model was saved with")]:
        train_tokenizer(resolve_corpus([tiny_corpus]), tmp_path / f"other-{size}", TokenizerTrainingConfig(vocab_size=size, min_frequency=1))
        (run / "tokenizer.json").write_bytes((tmp_path / f"other-{size}" / "tokenizer.json").read_bytes())
        with pytest.raises(TfcliError, match=message):
            load_checkpoint(run)


def test_non_finite_weights_are_named(run):
    with safe_open(str(run / WEIGHTS_FILE), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    tensors["decoder.blocks.0.attn.qkv.bias"][3] = float("inf")
    save_file(tensors, str(run / WEIGHTS_FILE), metadata={"format": "pt"})
    _set_weights_bytes(run, (run / WEIGHTS_FILE).stat().st_size)
    with pytest.raises(TfcliError, match="tensor decoder.blocks.0.attn.qkv.bias holds non-finite values"):
        load_checkpoint(run)


def test_info_cli(cli, run):
    result = cli("info", run, "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["parameters"]["total"] == load_checkpoint(run).model.parameter_count()
    assert data["kv_cache_bytes_per_token"]["fp32"] == 2 * 2 * 4 * 8 * 4
    assert data["tokenizer"]["special_tokens"]["eos"] == "<|endoftext|>"
    assert data["history"] is None
    (run / "metrics.jsonl").write_text('{"step": 10, "loss": 3.5}\n{"step": 20, "loss": 2.123456789, "val_loss": 2.7}\n')
    table = cli("info", run)
    assert table.code == 0 and "parameters" in table.stdout and "KV cache" in table.stdout and "steps 10..20" in table.stdout
    assert "last loss 2.1235, best val loss 2.7000" in table.stdout
    assert json.loads(cli("info", run, "--json").stdout)["problems"] == []
    # lines that are not records, or hold non-finite losses, are passed over; the JSON stays strict
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('[1, 2]\n"text"\n{"step": 30, "loss": NaN, "val_loss": Infinity}\n')
    data = json.loads(cli("info", run, "--json").stdout)
    assert data["history"]["last_step"] == 30 and data["history"]["last_loss"] == 2.123456789 and data["history"]["best_val_loss"] == 2.7


def test_info_names_a_truncated_weights_file_and_a_foreign_tokenizer(cli, run, tmp_path, tiny_corpus):
    with open(run / WEIGHTS_FILE, "r+b") as handle:
        handle.truncate(1000)
    assert cli("tokenize", "train", tiny_corpus, "-o", tmp_path / "other", "--vocab-size", "300", "--min-frequency", "3").code == 0
    (run / "tokenizer.json").write_bytes((tmp_path / "other" / "tokenizer.json").read_bytes())
    result = cli("info", run, "--json")
    assert result.code == 1
    problems = json.loads(result.stdout)["problems"]
    assert len(problems) == 2 and "holds 1,000 bytes but config.json expects" in problems[0], problems
    assert "is not the tokenizer this model was saved with" in problems[1] or "tokens but the model's vocabulary" in problems[1]
    assert "problem" in cli("info", run).stdout


def _truncate(path):
    with open(path, "r+b") as handle:
        handle.truncate(1000)


def _replace_with_a_pickle(path):
    path.write_bytes(pickle.dumps({"tok_emb.weight": [0.0] * 64}))


@pytest.mark.parametrize(
    "damage, message",
    [
        (_truncate, "holds 1,000 bytes but config.json expects"),
        (_replace_with_a_pickle, "but config.json expects"),
        (lambda path: path.unlink(), f"has no {WEIGHTS_FILE}"),
    ],
)
def test_info_exits_1_on_a_broken_run_and_still_shows_it(cli, run, damage, message):
    for args in ((), ("--json",)):
        assert cli("info", run, *args).code == 0
    damage(run / WEIGHTS_FILE)
    table = cli("info", run)
    assert table.code == 1 and "parameters" in table.stdout and "tokenizer" in table.stdout
    assert "problem" in table.stdout and message in " ".join(table.stdout.split())
    result = cli("info", run, "--json")
    assert result.code == 1
    data = json.loads(result.stdout)
    assert data["parameters"]["total"] > 0 and len(data["problems"]) == 1 and message in data["problems"][0]


def test_info_help_tells_the_exit_codes(cli):
    shown = " ".join(cli("info", "--help").stdout.split())
    assert "Exit code 1 when it finds such a problem" in shown


def test_info_kv_cache_shrinks_with_grouped_query_attention(cli, tmp_path, tokenizer):
    sizes = {}
    for kv in (4, 2, 1):
        save_checkpoint(tmp_path / f"kv{kv}", _model(tokenizer, n_kv_heads=kv), tokenizer)
        sizes[kv] = json.loads(cli("info", tmp_path / f"kv{kv}", "--json").stdout)["kv_cache_bytes_per_token"]["bf16"]
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]
    assert json.loads(cli("info", tmp_path / "kv4", "--json").stdout)["kv_cache_bytes_per_token"]["cross_attention_per_source_token_bf16"] == 0


def test_info_counts_an_encoder_decoders_cross_attention_cache(cli, tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the line about the cache stays whole whatever the temporary path
    save_checkpoint(tmp_path / "seq2seq", _model(tokenizer, arch="encoder-decoder", positions="sinusoidal"), tokenizer)
    kv = json.loads(cli("info", tmp_path / "seq2seq", "--json").stdout)["kv_cache_bytes_per_token"]
    assert kv["cross_attention_per_source_token_bf16"] == kv["bf16"] > 0  # every decoder layer keeps the source's keys and values
    assert "per source token for cross-attention" in cli("info", tmp_path / "seq2seq").stdout


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "not a tfcli run directory"),
        (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "is a file"),
        (
            lambda p: (p / "s").mkdir() or (p / "s" / "meta.json").write_text("{}") and (p / "s" / "train.bin").write_bytes(b"\0\0") and p / "s",
            "s is a token-shard folder, not a run directory",
        ),  # not "a pickle file" for its .bin
    ],
)
def test_info_bad_run_dirs(cli, tmp_path, make, message):
    result = cli("info", make(tmp_path))
    assert result.code == 2 and message in result.stderr


def test_info_reads_only_the_ends_of_a_huge_metrics_file(cli, run, monkeypatch):

    monkeypatch.setattr(tfcli.info, "TAIL_BYTES", 4096)  # a "huge" file of a few hundred kilobytes, read at its ends
    lines = ['{"step": 1, "loss": 9.0, "val_loss": 1.0}'] + [f'{{"step": {s}, "loss": {10 - s / 10000}}}' for s in range(2, 20000)]
    lines.append('{"step": 20000, "loss": 2.5, "val_loss": 3.25}')
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    history = json.loads(cli("info", run, "--json").stdout)["history"]
    assert history["tail_only"] and history["first_step"] == 1 and history["last_step"] == 20000 and history["last_loss"] == 2.5
    assert 50 < history["records"] < 200  # the first record and the last 4 KB, not 20,000 records
    assert history["best_val_loss"] == 1.0  # the first record's counts too
    shown = cli("info", run)
    assert "read from the first line and the end of a" in " ".join(shown.stdout.split())
