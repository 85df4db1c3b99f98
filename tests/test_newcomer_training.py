"""A newcomer's training mistakes and loose ends: a finished run extended, bad fine-tuning data, recipes and
Muon where they meet resume, LoRA and frozen bodies. Each is one line (exit 2, nothing left half-made) or works
and says what it does."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import pytest

from tests.training import pretrain_args, records
from tfcli.checkpoint import save_checkpoint
from tfcli.data.chat import read_conversations
from tfcli.data.labeled import read_labeled
from tfcli.errors import TfcliError
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.train.job import _schedule_note
from tfcli.train.optim import lr_factor
from tfcli.training_config import TrainConfig

SCHEDULE = ["--eval-every", "0", "--save-every", "0", "--set", "warmup_steps=2", "--batch-size", "2"]


@pytest.fixture(scope="module")
def parents(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """Untrained tiny runs to fine-tune: a decoder and an encoder-decoder (their data is refused before any step)."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    folder = tmp_path_factory.mktemp("parents")
    runs = {}
    for arch in ("decoder", "encoder-decoder"):
        config = ModelConfig(arch=arch, vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=32, d_ff=64)
        save_checkpoint(folder / arch, Transformer(config), tokenizer)
        runs[arch] = folder / arch
    return runs


def _rates(run: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in records(run) if "lr" in r}


def test_a_finished_run_extended_says_it_trains_at_the_floor_and_stretch_lays_the_schedule_over_the_new_length(cli, shards, tmp_path):
    """`--max-steps 8`, then `--resume --max-steps 16`: the run was at the floor, and its extra steps stayed there
    without a word. Now a note says so and names resume_schedule=stretch, which gives the rates of a run that was
    16 steps long from the start."""
    whole = tmp_path / "whole"
    assert cli(*pretrain_args(shards, whole, *SCHEDULE, "--max-steps", "16")).code == 0
    floor = _rates(whole)[16]

    kept, stretched = tmp_path / "kept", tmp_path / "stretched"
    assert cli(*pretrain_args(shards, kept, *SCHEDULE, "--max-steps", "8")).code == 0
    shutil.copytree(kept, stretched)
    result = cli(*pretrain_args(shards, kept, *SCHEDULE, "--max-steps", "16", "--resume"))
    assert result.code == 0, result.stderr
    assert "note: the run finished its learning-rate schedule at step 8, so its 8 more steps train at the floor rate, 3.00e-04" in result.stderr
    assert "--set resume_schedule=stretch lays the schedule over all 16 steps instead" in result.stderr
    assert [_rates(kept)[step] for step in range(9, 17)] == pytest.approx([floor] * 8)

    result = cli(*pretrain_args(shards, stretched, *SCHEDULE, "--max-steps", "16", "--resume", "--set", "resume_schedule=stretch"))
    assert result.code == 0, result.stderr
    assert "note: resume_schedule stretch: the schedule is laid over all 16 steps" in result.stderr
    rates, uninterrupted = _rates(stretched), _rates(whole)
    assert [rates[step] for step in range(9, 17)] == pytest.approx([uninterrupted[step] for step in range(9, 17)])
    assert rates[9] > 2 * rates[8]  # back up, as the brief's user asked

    result = cli(*pretrain_args(shards, stretched, *SCHEDULE, "--max-steps", "16", "--resume"))  # the same length: nothing to say
    assert result.code == 0 and "schedule" not in result.stderr, result.stderr
    result = cli(*pretrain_args(shards, stretched, *SCHEDULE, "--max-steps", "16", "--resume", "--set", "resume_schedule=later"))
    assert result.code == 2 and "resume_schedule must be one of continue, stretch" in result.stderr


def test_a_run_extended_halfway_is_told_where_its_rate_goes():
    before = TrainConfig(max_steps=40, warmup_steps=2, lr=1e-3)
    at = lr_factor(before, 20)
    now = TrainConfig(max_steps=80, warmup_steps=2, lr=1e-3, decay_restart=[20, at])
    note = _schedule_note(before, now, 20, at)
    assert note.startswith(f"--max-steps 80 (was 40): the learning rate goes on from {1e-3 * at:.2e} at step 20 down to 1.00e-04 at step 80")
    stretched = lr_factor(TrainConfig(max_steps=80, warmup_steps=2), 20)
    assert note.endswith(f"--set resume_schedule=stretch lays the schedule over all 80 steps instead ({1e-3 * stretched:.2e} at step 20)")
    assert stretched > at  # what the note offers is the other choice, not the same rate


def _lines(rows: list) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


CLASSIFY = [{"text": f"the fox {i}", "label": "fox" if i % 2 else "other"} for i in range(12)]
SEQ2SEQ = [{"source": f"{i} june 1998", "target": f"1998-06-{i + 1:02d}"} for i in range(12)]
CHAT = [{"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": f"{i}"}]} for i in range(12)]


def _with(rows: list, line: int, row) -> list:
    """`rows` with line `line` (1-based) replaced by `row`."""
    return [*rows[: line - 1], row, *rows[line:]]


BAD_DATA = {
    "classify, a bad line in the middle": ("classify", _with(CLASSIFY, 7, '{"text": "the fox", "label": '), "line 7 is not valid JSON"),
    "classify, no label": ("classify", _with(CLASSIFY, 5, {"text": "the fox"}), "line 5 has no 'label' field (it has 'text')"),
    "classify, the label a list": ("classify", _with(CLASSIFY, 4, {"text": "a", "label": ["fox"]}), "line 4: 'label' must be a string or an integer"),
    "classify, the text a number": ("classify", _with(CLASSIFY, 3, {"text": 12, "label": "fox"}), "line 3: 'text' is a number, not a string"),
    "classify, a line not an object": ("classify", _with(CLASSIFY, 9, '["the fox", "fox"]'), "line 9 is not a JSON object"),
    "classify, a word among numbers": (
        "classify",
        _with([{"text": f"r{i}", "label": i % 2} for i in range(8)], 6, {"text": "r", "label": "positive"}),
        "line 6 has the label 'positive', a word, but line 1 has the number 0",
    ),
    "classify, one label only": ("classify", [{"text": "a", "label": "fox"}] * 4, "has only one label ('fox')"),
    "classify, an empty file": ("classify", [], "holds no labeled examples"),
    "classify, blank lines only": ("classify", ["", "  "], "holds no labeled examples"),
    "classify, CSV in a .jsonl file": ("classify", ["text,label", "the fox,fox", "a cat,other"], "line 1 is not valid JSON, so the file is not JSON lines"),
    "seq2seq, a bad line in the middle": ("seq2seq", _with(SEQ2SEQ, 6, '{"source": "1 june"'), "line 6 is not valid JSON"),
    "seq2seq, no target": ("seq2seq", _with(SEQ2SEQ, 2, {"source": "1 june"}), "line 2 has no 'target' field (it has 'source')"),
    "seq2seq, a number as the target": ("seq2seq", _with(SEQ2SEQ, 8, {"source": "1 june", "target": 1998}), "line 8: 'target' is a number, not a string"),
    "seq2seq, classify's fields": ("seq2seq", CLASSIFY, "line 1 has no 'source' field (it has 'text', 'label')"),
    "chat, a bad line in the middle": ("chat", _with(CHAT, 10, '{"messages": [{"role": "user"'), "line 10 is not valid JSON"),
    "chat, no assistant turn": ("chat", _with(CHAT, 4, {"messages": [{"role": "user", "content": "hi"}]}), "line 4: the conversation has no assistant message"),
    "chat, messages a string": ("chat", _with(CHAT, 2, {"messages": "hello"}), "line 2: 'messages' must be a non-empty list"),
    "chat, a number as content": (
        "chat",
        _with(CHAT, 3, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 4}]}),
        "line 3: message 2: 'content' is a number, not a string",
    ),
    "chat, an unknown role": ("chat", _with(CHAT, 5, {"messages": [{"role": "bot", "content": "hi"}]}), "line 5: message 1 has the unknown role 'bot'"),
    "chat, an empty file": ("chat", [], "holds no conversations"),
    "instruct, no response": ("instruct", [{"prompt": "hi", "response": "yo"}, {"prompt": "hi"}], "line 2 has no 'response' field (it has 'prompt')"),
}


@pytest.mark.parametrize("case", BAD_DATA, ids=list(BAD_DATA))
def test_bad_finetuning_data_is_one_line_naming_the_file_and_line_and_leaves_no_run(cli, parents, tmp_path, case):
    task, rows, said = BAD_DATA[case]
    data = tmp_path / "data.jsonl"
    data.write_text(_lines(rows), encoding="utf-8")
    parent = parents["encoder-decoder" if task == "seq2seq" else "decoder"]
    out = tmp_path / "run"
    result = cli("train", "finetune", "--init-from", parent, "--task", task, "--data", data, "-o", out, "--max-steps", "1")
    assert result.code == 2, result.stderr
    assert result.stderr.startswith(f"error: {data}") and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("task", ["chat", "instruct"])
def test_a_csv_given_for_conversations_says_which_formats_they_come_in(cli, parents, tmp_path, task):
    """It was read as JSON lines and refused as 'line 1 is not valid JSON', which left a CSV's owner guessing."""
    data = tmp_path / "chats.csv"
    data.write_text("prompt,response\nhi,hello\n", encoding="utf-8")
    out = tmp_path / "run"
    result = cli("train", "finetune", "--init-from", parents["decoder"], "--task", task, "--data", data, "-o", out)
    assert result.code == 2 and f"error: {data} is CSV; --task {task} reads JSON lines or Parquet" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_labels_never_seen_in_training_are_named_in_validation_and_in_eval(cli, parents, tmp_path):
    train, unseen = tmp_path / "train.jsonl", tmp_path / "unseen.jsonl"
    train.write_text(_lines(CLASSIFY), encoding="utf-8")
    unseen.write_text(_lines([{"text": "a fox", "label": "fox"}, {"text": "a dog", "label": "dog"}]), encoding="utf-8")
    run = tmp_path / "run"
    args = ["train", "finetune", "--init-from", parents["decoder"], "--task", "classify", "--data", train, "-o", run, "--max-steps", "1"]
    result = cli(*args, "--val-data", unseen)
    assert result.code == 2 and f"{unseen} line 2 has the label 'dog', which the model does not know; labels: fox, other" in result.stderr
    assert not run.exists()
    assert cli(*args, "--eval-every", "0").code == 0
    result = cli("eval", run, "--data", unseen)
    assert result.code == 2 and f"{unseen} line 2 has the label 'dog', which the model does not know" in result.stderr, result.stderr


@pytest.mark.parametrize("read", [lambda path: read_labeled(path, "classify"), lambda path: read_conversations(path, "instruct")], ids=["labeled", "chat"])
def test_one_gigantic_line_is_refused_at_the_cap_without_being_read_whole(tmp_path, monkeypatch, read):
    monkeypatch.setenv("TFCLI_MAX_RECORD_CHARS", "64K")
    data = tmp_path / "data.jsonl"
    huge = 32 << 20
    with data.open("w", encoding="utf-8") as file:
        file.write(_lines([{"text": "a", "label": "x", "prompt": "a", "response": "b"}] * 5))
        file.write('{"text": "' + "y" * huge + '", "label": "x"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(TfcliError, match="line 6 is longer than 65,536 characters"):
            read(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < huge / 4, peak  # what it held at most: a few blocks of the file, not the line


def test_a_recipe_is_recorded_and_a_resume_goes_on_with_it(cli, shards, tmp_path):
    """A `--recipe modern` run resumed without --recipe was refused as 'the model's positions was rotary, now
    learned', which never named the option that set it."""
    run = tmp_path / "run"
    assert cli(*pretrain_args(shards, run, "--recipe", "modern", "--max-steps", "2", "--eval-every", "0")).code == 0
    assert json.loads((run / "config.json").read_text())["training"]["recipe"] == "modern"
    result = cli(*pretrain_args(shards, run, "--max-steps", "2", "--eval-every", "0", "--resume", "--recipe", "classic"))
    assert result.code == 2 and "cannot resume: the run was trained with --recipe modern, not classic; leave --recipe out" in result.stderr, result.stderr
    result = cli(*pretrain_args(shards, run, "--max-steps", "3", "--eval-every", "0", "--resume"))
    assert result.code == 0, result.stderr
    assert [r["step"] for r in records(run)] == [1, 2, 3]


def test_an_encoder_resumed_without_its_arch_is_told_the_option(cli, shards, tmp_path):
    run = tmp_path / "mlm"
    assert cli(*pretrain_args(shards, run, "--arch", "encoder", "--optimizer", "muon", "--max-steps", "1", "--eval-every", "0")).code == 0
    result = cli(*pretrain_args(shards, run, "--optimizer", "muon", "--max-steps", "2", "--resume"))
    assert result.code == 2 and "the model's arch was 'encoder', now 'decoder'; pass --arch encoder" in result.stderr, result.stderr


def test_muon_with_a_frozen_body_says_adamw_trains_the_head(cli, parents, reviews, tmp_path):
    """Muon trains the blocks' matrices; with --freeze body there are none, and the run used AdamW alone, silently."""
    args = ["train", "finetune", "--init-from", parents["decoder"], "--task", "classify", "--data", reviews, "--max-steps", "1", "--eval-every", "0"]
    result = cli(*args, "-o", tmp_path / "head", "--optimizer", "muon", "--freeze", "body")
    assert result.code == 0, result.stderr
    assert "note: --optimizer muon trains the weight matrices inside the blocks, which --freeze body freezes" in result.stderr
    result = cli(*args, "-o", tmp_path / "lora", "--optimizer", "muon", "--lora-rank", "2")
    assert result.code == 2 and "--optimizer muon does not go with LoRA" in result.stderr and not (tmp_path / "lora").exists()


def test_muon_and_the_modern_recipe_train_an_encoder_decoder_and_resume_after_an_early_stop(cli, shards, tmp_path):
    run = tmp_path / "s2s"
    common = ["--arch", "encoder-decoder", "--recipe", "modern", "--eval-every", "1", "--set", "eval_batches=1", "--lr", "0.5"]
    result = cli(*pretrain_args(shards, run, *common, "--early-stop", "1", "--max-steps", "40", "--json"))
    assert result.code == 0, result.stderr
    stopped = json.loads(result.stdout)
    assert stopped["stopped_by"] == "early_stop" and stopped["step"] < 40
    result = cli(*pretrain_args(shards, run, *common, "--early-stop", "1", "--max-steps", "40", "--resume"))
    assert result.code == 0 and "pass a larger --early-stop, or 0, to train further" in result.stderr
    result = cli(*pretrain_args(shards, run, *common, "--early-stop", "0", "--max-steps", str(stopped["step"] + 2), "--resume"))
    assert result.code == 0, result.stderr
    assert records(run)[-1]["step"] == stopped["step"] + 2


def test_early_stopping_without_a_validation_split_says_it_will_not_stop(cli, parents, reviews, tmp_path):
    args = ["train", "finetune", "--init-from", parents["decoder"], "--task", "classify", "--data", reviews, "--max-steps", "1", "--set", "val_fraction=0"]
    result = cli(*args, "-o", tmp_path / "run", "--early-stop", "2")
    assert result.code == 0, result.stderr
    assert "no best/ checkpoint is kept, and --early-stop has no validation loss to watch: the run will not stop early" in result.stderr
