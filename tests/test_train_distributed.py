"""Training on several processes under torchrun: gloo DDP ranks, FSDP, and a rank that dies."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.training import children, pretrain_args, records, torchrun, wait_for_step, weights
from tfcli.train.state import find_trainer_state

pytestmark = pytest.mark.slow  # torchrun starts ranks of their own: the slow tier


def test_two_gloo_ranks_match_one_process_with_the_whole_batch(cli, shards, tmp_path):
    common = ["--max-steps", "6", "--eval-every", "3", "--set", "bias=false", "--grad-accum", "2"]
    single, double = tmp_path / "single", tmp_path / "double"
    # the ranks run while the reference, one process with the whole batch, runs here (on one thread, as each rank)
    process = torchrun(pretrain_args(shards, double, *common, "--batch-size", "4"))
    reference = cli(*pretrain_args(shards, single, *common, "--batch-size", "8"))
    assert reference.code == 0, reference.stderr
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    assert out.count("done:") == 1  # rank 0 alone speaks
    assert "FutureWarning" not in err
    one, two = records(single), records(double)
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 7))
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5
        assert a["tokens"] == b["tokens"]
    assert abs(one[-1]["val_loss"] - two[-1]["val_loss"]) < 1e-5
    wa, wb = weights(single), weights(double)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6
    state = json.loads((double / "trainer" / "state.json").read_text())
    assert state["world_size"] == 2
    result = cli(*pretrain_args(shards, double, *common, "--batch-size", "4", "--resume", "--max-steps", "8"))
    assert result.code == 2 and "world size was 2, now 1" in result.stderr
    assert "resume on 2 processes in all (torchrun --nproc-per-node 2" in result.stderr  # how to continue it


def test_fsdp_ranks_train_like_one_process_and_resume_sharded(cli, shards, tmp_path):
    # a constant learning rate, so stopping at step 4 and resuming to 6 follows the same schedule as 6 at once
    common = [
        "--eval-every",
        "2",
        "--save-every",
        "2",
        "--set",
        "bias=false",
        "--grad-accum",
        "2",
        "--batch-size",
        "4",
        "--set",
        "schedule=constant",
        "--set",
        "warmup_steps=0",
    ]
    single, fsdp = tmp_path / "single", tmp_path / "fsdp"
    # the FSDP ranks run while the reference, one process with both ranks' batch, runs here (as the gloo
    # test above shows DDP ranks train like it)
    process = torchrun(pretrain_args(shards, fsdp, *common, "--max-steps", "4", "--fsdp"))
    reference = cli(*pretrain_args(shards, single, *common, "--max-steps", "6", "--batch-size", "8"))
    assert reference.code == 0, reference.stderr
    _, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    assert (fsdp / "best" / "model.safetensors").is_file()
    # the optimizer state was gathered whole on save and is sharded again on resume
    process = torchrun(pretrain_args(shards, fsdp, *common, "--max-steps", "6", "--fsdp", "--resume"))
    _, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    one, two = records(single), records(fsdp)
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 7))
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5
    assert abs(one[-1]["val_loss"] - two[-1]["val_loss"]) < 1e-5
    wa, wb = weights(single), weights(fsdp)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6


def test_fsdp_needstorchrun(cli, shards, tmp_path):
    result = cli(*pretrain_args(shards, tmp_path / "run", "--max-steps", "2", "--fsdp"))
    assert result.code == 2 and "torchrun" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the worker processes through /proc")
@pytest.mark.parametrize("victim, survivor", [(1, 0), (0, 1)])
def test_a_rank_that_dies_ends_the_whole_run_with_an_error(shards, tmp_path, victim, survivor):
    run = tmp_path / "run"
    process = torchrun(pretrain_args(shards, run, "--max-steps", "100000", "--batch-size", "4", "--eval-every", "0", "--save-every", "2"))
    wait_for_step(run, process, 3)
    victims = [c for c in children(process.pid) if f"RANK={victim}\x00".encode() in Path(f"/proc/{c}/environ").read_bytes()]
    assert victims, f"no rank-{victim} worker found"
    os.kill(victims[0], signal.SIGKILL)
    _, err = process.communicate(timeout=120)
    assert process.returncode != 0
    # the rank left ends with one line that says why (torchrun's SIGTERM to it does not cut it short), not a traceback
    assert err.count("error:") == 1 and f"rank {survivor} of 2: another process of the torchrun job stopped" in err, err
    assert f"[rank{survivor}]" not in err
    if survivor != 0:  # rank 0 wrote, and may have died in a save: the survivor does not claim a step
        assert "the last checkpoint rank 0 finished writing" in err
    _, state = find_trainer_state(run)  # the checkpoint is whole: its trainer state belongs to its weights
    assert state.step >= 2 and state.step % 2 == 0


def test_two_gloo_ranks_with_muon_match_one_process(cli, shards, tmp_path):
    """DDP averages the gradients before the step, so every rank's Muon orthogonalizes the same matrices: two
    ranks train as one process with the whole batch, as AdamW does (the test above). With --early-stop on, every
    rank joins the agreement on whether to stop after each evaluation (only rank 0 evaluates)."""
    common = ["--max-steps", "6", "--eval-every", "3", "--set", "bias=false", "--grad-accum", "2", "--optimizer", "muon", "--early-stop", "1"]
    single, double = tmp_path / "single", tmp_path / "double"
    process = torchrun(pretrain_args(shards, double, *common, "--batch-size", "4"))
    reference = cli(*pretrain_args(shards, single, *common, "--batch-size", "8"))
    assert reference.code == 0, reference.stderr
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    one, two = records(single), records(double)
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 7))
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5
    assert abs(one[-1]["val_loss"] - two[-1]["val_loss"]) < 1e-5
    wa, wb = weights(single), weights(double)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6
