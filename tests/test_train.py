"""`tfcli train pretrain / finetune`: objectives, the run directory, exact resume, signals, refusals."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import TINY_TEXT, snapshot
from tests.training import pretrain_args, records


def test_pretrain_decoder_makes_a_complete_run_directory(cli, shards, tmp_path):
    from tfcli.checkpoint import load_checkpoint

    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "40", "--eval-every", "20", "--json"))
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["step"] == 40 and summary["stopped_by"] == "steps"
    rows = records(run)
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0  # it learns
    assert {"val_loss", "val_ppl", "val_bpb"} <= set(rows[19]) and "val_loss" not in rows[18]
    assert "NaN" not in (run / "metrics.jsonl").read_text()
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "trainer" / "optimizer.safetensors").is_file()
    checkpoint = load_checkpoint(run)
    assert checkpoint.config.training["step"] == 40 and checkpoint.config.training["task"] == "lm"
    assert checkpoint.config.model.block_size == 32 and checkpoint.config.model.d_model == 32
    best = load_checkpoint(run / "best")
    assert best.config.training["step"] in (20, 40)
    assert summary["best_val_loss"] == min(r["val_loss"] for r in rows if "val_loss" in r)


def test_the_last_step_is_validated_when_it_is_not_an_evaluation_step(cli, shards, tmp_path):
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "30", "--eval-every", "20", "--json"))
    assert result.code == 0, result.stderr
    rows = records(run)
    assert [r["step"] for r in rows] == list(range(1, 31))  # one record per step: the evaluation joins step 30's
    assert [r["step"] for r in rows if "val_loss" in r] == [20, 30]
    assert "loss" in rows[-1] and "val_ppl" in rows[-1]
    summary = json.loads(result.stdout)
    assert summary["last"]["val_loss"] == rows[-1]["val_loss"]
    assert summary["best_val_loss"] == min(rows[19]["val_loss"], rows[29]["val_loss"])
    lines = [line for line in result.stderr.splitlines() if line.startswith("step") and line.split()[1] == "30"]
    assert len(lines) == 2 and "loss" in lines[0] and lines[1].split()[2] == "val"  # the second line adds only the validation


@pytest.mark.parametrize("arch", ["encoder", "encoder-decoder"])
def test_pretrain_encoder_and_encoder_decoder_objectives_learn(cli, shards, tmp_path, arch):
    run = tmp_path / arch
    result = cli(*pretrain_args(shards, run, "--arch", arch, "--max-steps", "40", "--eval-every", "40"))
    assert result.code == 0, result.stderr
    rows = records(run)
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first - 0.5
    assert "val_loss" in rows[-1]
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["arch"] == arch
    task = {"encoder": "mlm", "encoder-decoder": "denoise"}[arch]
    assert config["training"]["task"] == task
    # continued pretraining: the architecture's own objective, from where the run left off
    more = cli(
        "train", "finetune", "--init-from", run, "--task", task, "--data", shards, "-o", tmp_path / "more", "--max-steps", "3", "--batch-size", "4", "--json"
    )
    assert more.code == 0, more.stderr
    assert json.loads((tmp_path / "more" / "config.json").read_text())["training"]["task"] == task
    assert records(tmp_path / "more")[0]["loss"] < first  # it starts trained
    wrong = cli("train", "finetune", "--init-from", run, "--task", "lm", "--data", shards, "-o", tmp_path / "lm")
    assert wrong.code == 2 and f"is {'an encoder' if arch == 'encoder' else 'an encoder-decoder'}" in wrong.stderr
    assert f"continue its pretraining with --task {task}" in wrong.stderr


def test_bad_inputs_are_one_line_errors(cli, shards, tmp_path):
    from tfcli.data.shards import load_shard_meta

    meta = load_shard_meta(shards)
    assert meta.train_tokens > meta.val_tokens + 1
    toml = tmp_path / "encoder.toml"
    toml.write_text('[model]\narch = "encoder"\n')
    small = tmp_path / "small.toml"
    small.write_text('preset = "small"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nd_model = "abc"\n')
    cases = [
        (pretrain_args(shards, tmp_path / "a", "--block-size", "100000"), "the train split holds"),
        # longer than the validation split, not the train split: refused too, not trained without validation
        (pretrain_args(shards, tmp_path / "a2", "--block-size", str(meta.val_tokens)), "the validation split holds"),
        (pretrain_args(tmp_path, tmp_path / "b"), "too little to train on"),  # no meta.json: read as text
        (pretrain_args(shards, tmp_path / "c", "--arch", "lstm"), "--arch"),
        (pretrain_args(shards, tmp_path / "d", "--set", "warp=9"), "warp"),
        (pretrain_args(shards, tmp_path / "e", "--time-budget", "soon"), "duration"),
        (pretrain_args(shards, tmp_path / "e", "--time-budget", "5s", "--max-steps", "10"), "do not go together"),
        (pretrain_args(shards, tmp_path / "f", "--lr", "-1"), "lr"),
        (pretrain_args(shards, tmp_path / "g", "--device", "cuda"), "cuda"),
        # what --arch, the tokenizer and the objective decide is never silently overridden by a file or --set
        (pretrain_args(shards, tmp_path / "h", "--config", toml, "--arch", "decoder"), "sets arch = 'encoder', but --arch decides it here"),
        (pretrain_args(shards, tmp_path / "i", "--set", "task=mlm"), "but a decoder's pretraining objective decides it"),
        (pretrain_args(shards, tmp_path / "j", "--set", "vocab_size=99"), "but the tokenizer decides it"),
        (pretrain_args(shards, tmp_path / "k", "--set", "train.block_size=64"), "set the context with --block-size"),
        (pretrain_args(shards, tmp_path / "l", "--block-size", "1"), "model block_size must be at least 2"),
        (pretrain_args(shards, tmp_path / "m", "--config", small, "--preset", "tiny"), "asks for preset 'small' and --preset for 'tiny'"),
        # settings that would be silently untrained or ignored
        (pretrain_args(shards, tmp_path / "n", "--set", "n_classes=3"), "pretraining does not train a classification head"),
        (pretrain_args(shards, tmp_path / "o", "--set", "n_decoder_layers=3"), "a decoder's depth is n_layers"),
        (pretrain_args(shards, tmp_path / "p", "--set", "noise_density=0.5"), "noise_density is for the denoise task; this run trains lm"),
        (pretrain_args(shards, tmp_path / "q", "--set", "freeze=body"), "freeze is for fine-tuning"),
        # a value of the wrong type, named as it was typed
        (pretrain_args(shards, tmp_path / "r", "--set", "d_model=abc"), "error: --set d_model: expected an integer, got 'abc'\n"),
        (pretrain_args(shards, tmp_path / "s", "--set", "train.lr=fast"), "error: --set train.lr: expected a finite number, got 'fast'\n"),
        (pretrain_args(shards, tmp_path / "t", "--config", bad), f"error: {bad}: model.d_model: expected an integer, got 'abc'\n"),
    ]
    for args, needle in cases:
        result = cli(*args)
        assert result.code == 2, (args, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for name in (
        "a",
        "a2",
        "b",
        "c",
        "d",
        "e",
        "f",
        "g",
        "h",
        "i",
        "j",
        "k",
        "l",
        "m",
        "n",
        "o",
        "p",
        "q",
        "r",
        "s",
        "t",
    ):  # nothing written, not even the folder
        assert not (tmp_path / name).exists(), name
    (tmp_path / "mine").mkdir()  # a folder that was there before stays, empty or not
    assert cli(*pretrain_args(shards, tmp_path / "mine", "--block-size", "100000")).code == 2 and (tmp_path / "mine").is_dir()
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    result = cli(*pretrain_args(shards, afile, "--max-steps", "2"))
    assert result.code == 2 and afile.read_text() == "keep me"


def test_the_architecture_follows_the_settings_unless_arch_is_given(shards, tmp_path):
    from tfcli.train.job import pretrain_job

    toml = tmp_path / "s2s.toml"
    toml.write_text('[model]\narch = "encoder-decoder"\n')
    cases = [
        (dict(preset_name="bert-base"), "encoder", "mlm"),
        (dict(config_file=toml), "encoder-decoder", "denoise"),
        (dict(sets=["arch=encoder"]), "encoder", "mlm"),
        ({}, "decoder", "lm"),
        (dict(arch="decoder", preset_name="bert-base"), "decoder", "lm"),
    ]  # --arch wins: bert-base's shape as a decoder
    for i, (given, arch, task) in enumerate(cases):
        arguments = dict(
            data=shards, output=tmp_path / f"run{i}", arch=None, preset_name=None, config_file=None, sets=[], options={}, tokenizer_path=None, resume=False
        )
        job = pretrain_job(**{**arguments, **given})
        assert (job.model_config.arch, job.config.task) == (arch, task), given


def test_a_training_job_is_built_once_typed_and_frozen(shards, tmp_path):
    import dataclasses
    import typing

    from tfcli.train.job import ChatJob, LabeledJob, ShardJob, TrainingJob, pretrain_job
    from tfcli.train.word2vec import Word2VecJob

    for kind in (TrainingJob, ShardJob, LabeledJob, ChatJob, Word2VecJob):
        hints = typing.get_type_hints(kind)
        untyped = [f.name for f in dataclasses.fields(kind) if hints[f.name] is typing.Any]
        assert not untyped, (kind.__name__, untyped)
    job = pretrain_job(
        data=shards, output=tmp_path / "run", arch=None, preset_name=None, config_file=None, sets=[], options={}, tokenizer_path=None, resume=False
    )
    assert isinstance(job, ShardJob) and job.data_fingerprint
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.tokenizer = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.model_config = dataclasses.replace(job.model_config, vocab_size=1)


def test_the_output_folder_is_new_empty_or_a_failed_start_and_one_process_at_a_time(cli, shards, tmp_path, monkeypatch):
    from tfcli.fsutil import exclusive_lock

    mine = tmp_path / "mine"
    (mine / "trainer").mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    (mine / "trainer" / "keep.txt").write_text("keep")
    before = snapshot(mine)
    result = cli(*pretrain_args(shards, mine, "--max-steps", "2"))
    assert result.code == 2 and "holds files that are not a run's ('notes.txt')" in result.stderr
    assert snapshot(mine) == before
    result = cli(*pretrain_args(shards, shards.parent / "tokenizer", "--max-steps", "2"))
    assert result.code == 2 and "is a tokenizer folder; a run would write over it" in result.stderr
    leftovers = tmp_path / "failed"  # what a run that died before its first checkpoint leaves may be trained into
    leftovers.mkdir()
    (leftovers / "metrics.jsonl").write_text("")
    assert cli(*pretrain_args(shards, leftovers, "--max-steps", "2")).code == 0
    busy = tmp_path / "busy"
    busy.mkdir()
    with exclusive_lock(busy, "training into"):  # as if another process were training there
        result = cli(*pretrain_args(shards, busy, "--max-steps", "2"))
    assert result.code == 2 and "another process is training into" in result.stderr
    assert cli(*pretrain_args(shards, busy, "--max-steps", "2")).code == 0

    import tfcli.train.loop

    def interrupted(job):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(tfcli.train.loop, "train", interrupted)  # Ctrl-C before anything is written
    assert cli(*pretrain_args(shards, tmp_path / "never", "--max-steps", "2")).code == 130
    assert not (tmp_path / "never").exists()


def test_shards_with_ids_past_the_vocabulary_are_one_line(cli, shards, tmp_path):
    import shutil

    import numpy as np

    from tfcli.data.shards import load_shard_meta

    damaged = tmp_path / "data" / "shards"
    shutil.copytree(shards.parent, tmp_path / "data")
    ids = np.fromfile(damaged / "train.bin", dtype=load_shard_meta(damaged).dtype)
    ids[::7] = 60000
    ids.tofile(damaged / "train.bin")
    meta = json.loads((damaged / "meta.json").read_text())
    del meta["checks"]  # as older shards have it: no fingerprint of the ids to catch the edit before the step does
    (damaged / "meta.json").write_text(json.dumps(meta))
    result = cli(*pretrain_args(damaged, tmp_path / "run", "--max-steps", "2"))
    assert result.code == 2 and "holds the token id 60000, outside the model's vocabulary" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_empty_validation_split_is_said_out_loud(cli, trained_tokenizer, tmp_path):
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.tokenizer.core import TextTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TINY_TEXT * 30, encoding="utf-8")
    encode_corpus(resolve_corpus([corpus]), TextTokenizer.load(trained_tokenizer), tmp_path / "shards", val_fraction=0.0)
    result = cli(*pretrain_args(tmp_path / "shards", tmp_path / "run", "--max-steps", "3", "--tokenizer", trained_tokenizer))
    assert result.code == 0, result.stderr
    assert "the validation split is empty: nothing is validated and no best/ checkpoint is kept" in result.stdout + result.stderr
    assert not (tmp_path / "run" / "best").exists()
    result = cli("eval", tmp_path / "run", "--data", tmp_path / "shards")
    assert result.code == 2 and "the val split of" in result.stderr and "--split train" in result.stderr


def test_time_budget_ends_the_run_on_time(cli, shards, tmp_path):
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--time-budget", "2s", "--eval-every", "0", "--json"))
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["stopped_by"] == "budget" and 2.0 <= summary["elapsed_seconds"] < 6.0
    lrs = [r["lr"] for r in records(run)]
    assert max(lrs) > 2e-3 and lrs[-1] < 0.5 * max(lrs)  # warmed up, then decayed over the budget


def test_config_file_and_sets_resolve_in_order(cli, shards, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('preset = "tiny"\n[model]\nd_model = 48\nn_heads = 3\npositions = "rotary"\n[train]\nlr = 0.002\nseed = 7\n')
    run = tmp_path / "run"
    result = cli(
        "train",
        "pretrain",
        "--data",
        shards,
        "-o",
        run,
        "--config",
        config,
        "--set",
        "n_layers=1",
        "--set",
        "train.seed=8",
        "--block-size",
        "32",
        "--max-steps",
        "2",
        "--seed",
        "9",
        "--batch-size",
        "2",
    )
    assert result.code == 0, result.stderr
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["d_model"] == 48 and saved["model"]["positions"] == "rotary" and saved["model"]["n_layers"] == 1
    assert saved["training"]["config"]["lr"] == 0.002 and saved["training"]["config"]["seed"] == 9


def test_compile_falls_back_with_a_note_where_it_fails(cli, shards, tmp_path, monkeypatch):
    import torch

    def broken_compile(module, *args, **kwargs):
        def run(*a, **k):
            raise RuntimeError("no compiler here")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    run = tmp_path / "run"
    result = cli(*pretrain_args(shards, run, "--max-steps", "3", "--compile"))
    assert result.code == 0, result.stderr
    assert "torch.compile does not work here" in result.stderr
    assert json.loads((run / "config.json").read_text())["training"]["config"]["compile"] is True
    assert records(run)[-1]["step"] == 3


def test_the_speedrun_architecture_trains_generates_and_its_hf_export_names_what_it_cannot_express(cli, shards, tmp_path):
    import torch

    from tfcli.checkpoint import load_checkpoint

    run = tmp_path / "run"
    speedrun = ["--set", "activation=relu2", "--set", "logit_softcap=30", "--set", "zero_init_proj=true", "--set", "tie_embeddings=false"]
    result = cli(*pretrain_args(shards, run, *speedrun, "--set", "qk_norm=true", "--max-steps", "3", "--json"))
    assert result.code == 0, result.stderr
    rows = records(run)
    assert [r["step"] for r in rows] == [1, 2, 3] and all(0 < r["loss"] < 20 for r in rows)
    checkpoint = load_checkpoint(run)
    model = checkpoint.config.model
    assert (model.activation, model.logit_softcap, model.zero_init_proj, model.tie_embeddings, model.qk_norm) == ("relu2", 30.0, True, False, True)
    weights = checkpoint.model
    assert weights.lm_head.weight is not weights.tok_emb.weight
    assert weights.decoder.blocks[0].attn.out.weight.abs().sum() > 0  # started at zero, trained away from it
    with torch.no_grad():
        assert weights(torch.tensor([[1, 2, 3]])).logits.abs().max() <= 30.0
    result = cli("generate", run, "-p", "Once upon", "--max-new-tokens", "4", "--temperature", "0")
    assert result.code == 0, result.stderr
    result = cli("export", run, "--to", "hf", "-o", tmp_path / "hf")
    assert result.code == 2 and "GPT2LMHeadModel cannot express this model: logit_softcap 30" in result.stderr, result.stderr
    assert not (tmp_path / "hf").exists()


def test_the_first_line_says_what_mfu_is_measured_against(cli, shards, tmp_path):
    """MFU is a share of the fastest matmul timed on this machine (remembered beside tfcli.accel's choices):
    the run says so where it starts, so a low figure on a busy machine reads as what it is."""
    result = cli("train", "pretrain", "--data", shards, "-o", tmp_path / "run", "--max-steps", "2", "--batch-size", "2", "--block-size", "16")
    assert result.code == 0, result.stderr
    first = next(line for line in result.stderr.splitlines() if line.startswith("training "))
    assert first.endswith("; MFU against the fastest fp32 matmul timed on this machine") and "MFU" in result.stdout


def test_on_a_gpu_a_batch_is_held_to_the_gpus_memory_and_the_weights_to_this_machines(cli, shards, tmp_path, monkeypatch):
    """Training on a GPU (its properties mocked): the activations' check reads the card's memory, not the host's;
    the weights' check stays with the host's, where the model is built before it moves. The trainer passes its device."""
    from types import SimpleNamespace

    import torch

    from tfcli.errors import TfcliError
    from tfcli.model.config import preset
    from tfcli.train import setup, trainer

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(setup, "physical_memory", lambda: 1 << 40)  # a host of 1 TiB
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=8 << 30))  # a card of 8 GiB
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA L4")
    config = preset("tiny")
    fits_the_card = (8 << 30) // (16 * config.block_size * config.d_model * config.n_layers)
    setup.refuse_a_batch_memory_cannot_hold(config, fits_the_card, gpu)
    setup.refuse_a_batch_memory_cannot_hold(config, fits_the_card + 1, torch.device("cpu"))  # the host holds it
    with pytest.raises(TfcliError, match=r"for its activations; NVIDIA L4 has 8\.6 GB"):
        setup.refuse_a_batch_memory_cannot_hold(config, fits_the_card + 1, gpu)
    monkeypatch.setattr(setup, "physical_memory", lambda: 64 << 20)  # a small host: the weights' check is the host's, on a GPU too
    with pytest.raises(TfcliError, match="for their weights alone; this machine has 0.1 GB"):
        setup.refuse_what_memory_cannot_hold(preset("gpt2-small"))

    monkeypatch.setattr(setup, "physical_memory", lambda: 1 << 40)
    monkeypatch.setattr(trainer, "pick_device", lambda name, world: gpu)  # the run stops at the check, before anything moves
    per_row = 16 * 32 * 32 * 1  # the tiny model's block size, width and depth (tests.training.TINY_MODEL)
    batch = (8 << 30) // per_row + 1
    result = cli(*pretrain_args(shards, tmp_path / "run", "--max-steps", "1", "--precision", "fp32", "--batch-size", str(batch)))
    assert result.code == 2 and f"--batch-size {batch:,} of 32 tokens" in result.stderr and "NVIDIA L4 has 8.6 GB" in result.stderr


def test_one_process_reads_nothing_back_from_the_device_for_its_token_count(shards, tmp_path, monkeypatch):
    """A step's synchronizations with the device, counted on the CPU: the reads of a tensor's value the trainer
    makes in a step that is not logged. One process counts its targets on the host; the one read left is the
    gradient norm, checked before the update (a non-finite one must not reach the weights)."""
    import torch

    from tfcli.train.job import pretrain_job
    from tfcli.train.loop import train
    from tfcli.train.trainer import Trainer

    reads, counting = [], [False]
    for name in ("item", "tolist", "__int__", "__float__", "__bool__"):
        method = getattr(torch.Tensor, name)

        def counted(tensor, *args, _method=method, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if counting[0] and caller.endswith(("tfcli/train/trainer.py", "tfcli/train/distributed.py")):
                reads.append(_name)
            return _method(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    real_step = Trainer.step_once

    def step_counted(self):
        counting[0] = True
        try:
            yield from real_step(self)
        finally:
            counting[0] = False

    monkeypatch.setattr(Trainer, "step_once", step_counted)
    monkeypatch.setattr("tfcli.train.setup.peak_matmul_flops", lambda *args, **kwargs: 1e12)
    sets = ["d_model=32", "n_heads=2", "n_layers=1", "d_ff=64", "block_size=32"]
    options = {"max_steps": 4, "batch_size": 4, "log_every": 100, "eval_every": 0, "grad_accum": 2}
    job = pretrain_job(
        data=shards, output=tmp_path / "run", arch=None, preset_name=None, config_file=None, sets=sets, options=options, tokenizer_path=None, resume=False
    )
    events = list(train(job))
    assert events[-1].step == 4
    assert reads == ["__float__"] * 4  # before: an .item() on the token count too, every step
