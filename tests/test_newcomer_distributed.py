"""What a newcomer meets under torchrun: a command that runs in one process is refused, a mistake every rank
makes is said once (by rank 0), a lost peer is one line on each rank left, and torchrun's echo of a Ctrl-C is no second one."""

from __future__ import annotations

import signal

import pytest

from tests.training import pretrain_args, torchrun
from tfcli.train.distributed import World, lost_a_peer, peer_lost
from tfcli.train.loop import _SignalFlag


def as_torchrun_rank(monkeypatch, rank: int) -> None:
    """The environment torchrun gives rank RANK of 2."""
    for name, value in {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    "args, named",
    [
        (["generate", "runs/x", "--prompt", "hi"], "`tfcli generate`"),
        (["tokenize", "encode", "corpus.txt", "-o", "shards"], "`tfcli tokenize encode`"),
        (["--debug", "bench", "tokenize"], "`tfcli bench tokenize`"),
    ],
)
def test_a_one_process_command_is_refused_under_torchrun(cli, monkeypatch, tmp_path, args, named):
    monkeypatch.chdir(tmp_path)
    as_torchrun_rank(monkeypatch, 0)
    result = cli(*args)
    assert result.code == 2
    assert result.stderr.count("error:") == 1 and named in result.stderr and "without torchrun" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_ranks_other_than_0_stay_silent_on_an_error_every_rank_meets(cli, monkeypatch, tmp_path):
    as_torchrun_rank(monkeypatch, 1)
    refused = cli("generate", tmp_path, "--prompt", "hi")
    usage = cli("train", "pretrain", "--no-such-option")
    assert (refused.code, refused.stderr) == (2, "")
    assert (usage.code, usage.stderr) == (2, "")
    assert cli("train", "pretrain", "--help").code == 0  # help is shown under torchrun too


@pytest.mark.parametrize("kept", [{}, {"WORLD_SIZE": "2", "RANK": "1"}])
def test_help_and_one_process_runs_are_left_alone(cli, monkeypatch, tmp_path, kept):
    """Outside torchrun, a WORLD_SIZE a shell kept from a job included: the command runs and speaks."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in kept.items():
        monkeypatch.setenv(name, value)
    result = cli("generate", tmp_path / "missing", "--prompt", "hi")
    assert result.code == 2 and "torchrun" not in result.stderr and result.stderr.startswith("error:")


def test_text_as_data_is_refused_under_torchrun(cli, monkeypatch, tmp_path, tiny_corpus):
    # every rank would make its own tokenizer and shards into RUN/data/ at the same time
    as_torchrun_rank(monkeypatch, 0)
    result = cli("train", "pretrain", "--data", tiny_corpus, "-o", tmp_path / "run", "--max-steps", "2")
    assert result.code == 2 and result.stderr.count("error:") == 1
    assert "--data takes a shard folder" in result.stderr and "tfcli tokenize encode" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # starts torchrun
def test_a_mistake_every_rank_makes_is_said_once(shards, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    process = torchrun(pretrain_args(shards, run, "--max-steps", "2", "--resume"))
    out, err = process.communicate(timeout=120)
    assert process.returncode != 0  # torchrun's own code for a failed worker
    assert err.count("error:") == 1 and "holds no run to resume" in err
    assert "[rank" not in err  # no rank's traceback


def test_a_ctrl_c_that_torchrun_forwards_is_not_a_second_one():
    ranked = _SignalFlag(World(0, 2, 0))
    ranked._handle(signal.SIGINT, None)  # the terminal's
    ranked._handle(signal.SIGINT, None)  # torchrun's echo of it: the run still stops after the step, saved
    assert ranked.received == signal.SIGINT
    alone = _SignalFlag(World())
    alone._handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):  # one process: a second Ctrl-C stops at once
        alone._handle(signal.SIGINT, None)


def test_a_lost_peer_is_told_apart_from_other_errors():
    world = World(1, 2, 1)
    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:9137. This is typically caused by a remote worker crashing."
    )
    assert lost_a_peer(world, gloo) and not lost_a_peer(World(), gloo)
    assert not lost_a_peer(world, RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    error = peer_lost(world, gloo, "no checkpoint was saved yet")
    assert str(error).startswith("rank 1 of 2: another process of the torchrun job stopped (Connection closed by peer [127.0.0.1]:9137); no checkpoint")
    assert error.rank_specific
