"""The one loader (`tfcli.loader`): every command that loads a run gets the same model for the same purpose,
and nothing outside the loader attaches tfcli.accel or reads a checkpoint itself."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from tests.training import pretrain_args
from tfcli import loader
from tfcli.checkpoint import save_checkpoint
from tfcli.model.config import preset
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer

TFCLI = Path(loader.__file__).parent
TEXT = "The fox was happy, so it played with the ball."


class Loaded(Exception):
    """Stops a benchmark's worker once its run is loaded: what it does next is timing, not loading."""


@pytest.fixture(scope="module")
def run(tmp_path_factory, trained_tokenizer) -> Path:
    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, block_size=64, n_layers=2, n_heads=4, d_model=32, d_ff=64, activation="gelu_tanh")
    folder = tmp_path_factory.mktemp("loader") / "run"
    save_checkpoint(folder, Transformer(config), tokenizer)
    return folder


@pytest.fixture
def loads(monkeypatch):
    """Every model the loader makes ready, as (purpose, what it decided), in order."""
    made: list[tuple[str, dict]] = []
    stop_after: list[str] = []  # not empty: raise Loaded once the model is ready
    prepare = loader.prepare

    def recording(model, purpose, device=None, threads=0):
        prepare(model, purpose, device, threads)
        made.append((purpose, loader.describe(model)))
        if stop_after:
            raise Loaded()
        return model

    monkeypatch.delenv("TFCLI_ACCEL", raising=False)
    import tfcli.bench.model
    import tfcli.train.trainer

    # every module that took `prepare` by name (`from tfcli.loader import prepare`), imported by now or not
    for module in {id(m): m for m in [loader, tfcli.bench.model, tfcli.train.trainer, *list(sys.modules.values())]}.values():
        if getattr(module, "__dict__", {}).get("prepare") is prepare:
            monkeypatch.setattr(module, "prepare", recording)
    return made, stop_after


def _one_load(made: list, before: int, what: str) -> tuple[str, dict]:
    assert len(made) == before + 1, (what, made[before:])
    return made[-1]


def test_every_command_of_a_purpose_gets_the_same_model(cli, run, loads, tmp_path, tiny_corpus, shards):
    from tfcli.bench.generate import _decode_job
    from tfcli.bench.model import _step_job
    from tfcli.harness.model import TfcliLM
    from tfcli.inspect import notebook
    from tfcli.serve.server import load_served

    made, stop_after = loads
    seen: dict[str, tuple[str, dict]] = {}
    commands = {
        "generate": ("generate", run, "--prompt", "The fox", "-n", "2"),
        "eval": ("eval", run, "--data", tiny_corpus, "--max-batches", "1"),
        "inspect-attention": ("inspect-attention", run, "--text", TEXT, "--json"),
        "inspect-logits": ("inspect-logits", run, "--text", TEXT, "--json"),
        "inspect-ablate": ("inspect-ablate", run, "--text", TEXT, "--heads", "1.2", "--json"),
        "inspect-patch": ("inspect-patch", run, "--clean", "The fox was happy", "--corrupt", "The ball was happy", "--answer", " it", "--json"),
        "inspect-embeddings": ("inspect-embeddings", run, "--neighbours", "fox", "-k", "3", "--json"),
        "export --to hf": ("export", run, "--to", "hf", "-o", tmp_path / "hf"),
        "export --to gguf": ("export", run, "--to", "gguf", "-o", tmp_path / "run.gguf"),
        "train pretrain": pretrain_args(shards, tmp_path / "trained", "--max-steps", "1", "--eval-every", "1"),
    }
    for name, args in commands.items():
        before = len(made)
        result = cli(*args)
        assert result.code == 0, (name, result.stderr)
        seen[name] = _one_load(made, before, name)
    before = len(made)
    load_served(run, device="cpu").engine.stop()
    seen["serve"] = _one_load(made, before, "serve")
    before = len(made)
    TfcliLM(run, device="cpu")
    seen["the lm-eval harness"] = _one_load(made, before, "harness")
    before = len(made)
    notebook.logit_lens(run, TEXT)
    seen["notebook.logit_lens"] = _one_load(made, before, "notebook")

    stop_after.append("stop")
    for name, job in (
        ("bench generate", lambda: _decode_job("tfcli", run, run, 4, 2, 0, "cpu", 0)),
        ("bench model", lambda: _step_job("tfcli", "tiny", 1, 8, 1, 0)),
    ):
        before = len(made)
        with pytest.raises(Loaded):
            job()
        seen[name] = _one_load(made, before, name)

    by_purpose: dict[str, dict[str, dict]] = {}
    for name, (purpose, decided) in seen.items():
        by_purpose.setdefault(purpose, {})[name] = decided
    assert {purpose: sorted(names) for purpose, names in by_purpose.items()} == {
        "decode": ["bench generate", "generate", "serve", "the lm-eval harness"],
        "evaluate": ["eval"],
        "inspect": ["inspect-ablate", "inspect-attention", "inspect-embeddings", "inspect-logits", "inspect-patch", "notebook.logit_lens"],
        "export": ["export --to hf"],
        "export-gguf": ["export --to gguf"],  # the same model; only the note on a quantized run's blocks differs
        "train": ["bench model", "train pretrain"],
    }
    for purpose, decisions in by_purpose.items():
        first = next(iter(decisions.values()))
        assert all(decided == first for decided in decisions.values()), (purpose, decisions)

    plain = {"device": "cpu", "dtype": "float32", "threads": 1, "training": False, "accel": []}
    accelerated = {**plain, "accel": ["decode_step", "fused_loss", "products"]}
    assert by_purpose["decode"]["generate"] == by_purpose["evaluate"]["eval"] == by_purpose["inspect"]["inspect-logits"] == accelerated
    assert by_purpose["export"]["export --to hf"] == by_purpose["export-gguf"]["export --to gguf"] == plain
    assert by_purpose["train"]["train pretrain"] == {**accelerated, "training": True}


def test_a_finetune_and_a_resume_load_plain_weights_that_the_trainer_then_prepares(run, monkeypatch):
    monkeypatch.delenv("TFCLI_ACCEL", raising=False)
    parent = loader.load_run(run, "parent")
    assert loader.describe(parent.model)["accel"] == [] and not parent.model.training
    resumed = loader.load_run(run, "resume")
    assert loader.describe(resumed.model)["accel"] == []
    trained = loader.prepare(resumed.model, "train", "cpu")
    assert trained is resumed.model and loader.describe(trained)["training"] is True
    assert loader.describe(trained)["accel"] == ["decode_step", "fused_loss", "products"]


def test_a_small_decoding_model_gets_one_thread_unless_told(run):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert loader.describe(loader.load_run(run, "decode", "cpu").model)["threads"] == 1
        torch.set_num_threads(2)
        assert loader.describe(loader.load_run(run, "inspect", "cpu").model)["threads"] == 2  # only decoding chooses
        assert loader.describe(loader.load_run(run, "decode", "cpu", threads=2).model)["threads"] == 2
    finally:
        torch.set_num_threads(before)


def _modules_calling(pattern: str) -> list[str]:
    found = []
    for path in sorted(TFCLI.rglob("*.py")):
        if re.search(pattern, path.read_text(encoding="utf-8")):
            found.append(path.relative_to(TFCLI).as_posix())
    return found


def test_only_the_loader_attaches_the_accelerated_paths():
    assert [m for m in _modules_calling(r"\baccelerate\(") if not m.startswith("accel/")] == ["loader.py"]


def test_only_the_loader_reads_a_checkpoint():
    # checkpoint.py itself: an adapter run's parent, and `export --merge` (save_merged), which writes the weights back
    assert _modules_calling(r"\bload_checkpoint\(") == ["checkpoint.py", "loader.py"]


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return []


def test_a_decoding_models_weights_move_to_huge_pages_tied_and_unchanged(monkeypatch):
    from tfcli.accel import memory
    from tfcli.model.config import ModelConfig

    if not memory.huge_pages_lent():
        pytest.skip("this kernel lends no transparent huge pages (not Linux, or transparent_hugepage is never)")
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=16384, block_size=32, n_layers=1, n_heads=2, d_model=128)  # the tied embedding: 8 MB
    models = {name: Transformer(config).eval() for name in ("decode", "inspect", "off")}
    for model in models.values():
        model.load_state_dict(models["decode"].state_dict())
    values = {k: v.clone() for k, v in models["decode"].state_dict().items()}
    before = {name: m.tok_emb.weight.data_ptr() for name, m in models.items()}
    loader.prepare(models["decode"], "decode", "cpu", 1)
    loader.prepare(models["inspect"], "inspect", "cpu", 1)
    monkeypatch.setenv("TFCLI_ACCEL", "0")
    loader.prepare(models["off"], "decode", "cpu", 1)
    moved = models["decode"]
    assert moved.lm_head.weight is moved.tok_emb.weight and moved.tok_emb.weight.data_ptr() != before["decode"]
    assert "hg" in _vm_flags(moved.tok_emb.weight.data_ptr() + memory.HUGE_PAGE)  # advised (MADV_HUGEPAGE)
    assert all(torch.equal(values[k], v) for k, v in moved.state_dict().items())
    assert models["inspect"].tok_emb.weight.data_ptr() == before["inspect"] and models["off"].tok_emb.weight.data_ptr() == before["off"]
