"""The pieces of training: settings, the schedule, data slots, masks, the optimizer state, macro-F1."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tfcli.errors import TfcliError
from tfcli.train.command_line import parse_duration, parse_value, resolve_configs
from tfcli.train.optim import lr_factor
from tfcli.training_config import TrainConfig


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("3m", 180), ("1h30m", 5400), ("45", 45), ("1.5m", 90)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "3x", "m", "", "0s"])
def test_parse_duration_refuses(text):
    with pytest.raises(TfcliError):
        parse_duration(text)


def test_run_options_give_only_what_was_given_with_the_budget_in_seconds():
    from tfcli.train.command_line import RunOptions

    assert RunOptions().settings() == {}
    assert RunOptions(lr=0.5, time_budget="2m", compile=True, seed=0).settings({"model.block_size": None, "freeze": "body"}) == {
        "time_budget": 120,
        "lr": 0.5,
        "seed": 0,
        "compile": True,
        "freeze": "body",
    }
    with pytest.raises(TfcliError, match="do not go together"):
        RunOptions(max_steps=3, time_budget="1m").settings()


def test_set_values_read_as_toml():
    assert parse_value("3") == 3 and parse_value("0.5") == 0.5 and parse_value("true") is True and parse_value("rotary") == "rotary"


def test_settings_resolve_and_refuse_unknown_keys():
    model, train = resolve_configs(
        preset_name="tiny", config_file=None, sets=["d_model=32", "train.lr=0.01", "n_heads=2"], options={"lr": 0.02, "model.block_size": 64}
    )
    assert model.d_model == 32 and model.block_size == 64 and train.lr == 0.02
    with pytest.raises(TfcliError, match="warp"):
        resolve_configs(preset_name="tiny", config_file=None, sets=["warp=1"], options={})
    with pytest.raises(TfcliError, match="lr"):
        TrainConfig(lr=-1)
    _, budgeted = resolve_configs(preset_name="tiny", config_file=None, sets=["time_budget=1m30s"], options={})
    assert budgeted.time_budget == 90.0  # written as the --time-budget option takes it
    _, fixed = resolve_configs(preset_name="tiny", config_file=None, sets=["task=lm"], options={}, train_fixed={"task": "lm"})
    assert fixed.task == "lm"  # the same value is no conflict
    with pytest.raises(TfcliError, match="--set sets task = 'mlm', but --task decides it here"):
        resolve_configs(preset_name="tiny", config_file=None, sets=["task=mlm"], options={}, train_fixed={"task": "lm"}, fixed_by={"task": "--task"})


def test_schedule_warms_up_then_decays():
    cfg = TrainConfig(max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(cfg, 0) == pytest.approx(1 / 11)
    assert lr_factor(cfg, 10) == pytest.approx(1.0)
    assert lr_factor(cfg, 99) == pytest.approx(0.1)
    factors = [lr_factor(cfg, s) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(factors, factors[1:]))
    linear = TrainConfig(max_steps=100, warmup_steps=0, schedule="linear", min_lr_ratio=0.0)
    assert lr_factor(linear, 0) == 1.0 and lr_factor(linear, 50) == pytest.approx(1 - 50 / 99)
    assert lr_factor(TrainConfig(schedule="constant", warmup_steps=0), 500) == 1.0
    budget = TrainConfig(schedule="cosine", min_lr_ratio=0.0)
    assert lr_factor(budget, 0, 0.025) == pytest.approx(0.5) and lr_factor(budget, 9, 1.0) == pytest.approx(0.0)


def test_wsd_warms_up_holds_the_peak_then_decays_over_the_last_fraction():
    cfg = TrainConfig(max_steps=100, warmup_steps=10, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.1)
    factors = [lr_factor(cfg, s) for s in range(100)]
    assert factors[0] == pytest.approx(1 / 11) and factors[9] == pytest.approx(10 / 11)
    assert factors[10:80] == [1.0] * 70  # stable: the peak until the decay's 20% of the run
    assert factors[80] == pytest.approx(1 - 0.9 * (80 / 99 - 0.8) / 0.2) and factors[99] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(factors[79:], factors[80:]))  # then a straight line down, 20 steps
    assert factors[89] - factors[90] == pytest.approx(factors[95] - factors[96])
    assert lr_factor(TrainConfig(max_steps=100, warmup_steps=0, schedule="wsd", decay_fraction=0.0), 99) == 1.0  # no decay asked: none


def test_wsd_over_a_time_budget_ends_its_decay_at_the_budget():
    cfg = TrainConfig(time_budget=60, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.0)
    assert lr_factor(cfg, 0, 0.025) == pytest.approx(0.5)  # the warm-up: the first 5% of the budget
    assert lr_factor(cfg, 500, 0.5) == 1.0 and lr_factor(cfg, 800, 0.8) == 1.0
    assert lr_factor(cfg, 900, 0.9) == pytest.approx(0.5) and lr_factor(cfg, 999, 1.0) == pytest.approx(0.0)
    assert lr_factor(cfg, 999, 1.3) == pytest.approx(0.0)  # past the budget (the last step's clock): the floor
    steps = TrainConfig(time_budget=60, schedule="wsd", warmup_steps=3, decay_fraction=0.5, min_lr_ratio=0.0)
    assert lr_factor(steps, 2, 0.9) == pytest.approx(3 / 4) and lr_factor(steps, 3, 0.75) == pytest.approx(0.5)


def test_wsd_resumed_with_more_steps_holds_its_rate_until_the_new_decay_window():
    """decay_restart [step, factor]: a run still at its peak when extended goes on as a wsd run of the new length
    would; one that was already decaying holds its rate until the new window (or decays from where it is, if
    it is inside it)."""
    fresh = TrainConfig(max_steps=200, warmup_steps=10, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.1)
    extended = TrainConfig(max_steps=200, warmup_steps=10, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.1, decay_restart=[100, 1.0])
    assert [lr_factor(extended, s) for s in range(100, 200)] == pytest.approx([lr_factor(fresh, s) for s in range(100, 200)])
    decaying = TrainConfig(max_steps=200, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.1, decay_restart=[100, 0.6])
    rates = [lr_factor(decaying, s) for s in range(100, 200)]
    assert rates[:60] == [0.6] * 60 and rates[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(rates, rates[1:]))
    late = TrainConfig(max_steps=200, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.1, decay_restart=[180, 0.6])
    assert lr_factor(late, 180) == pytest.approx(0.6) and lr_factor(late, 199) == pytest.approx(0.1)
    assert lr_factor(late, 190) == pytest.approx(0.6 - 0.5 * (190 - 180) / 19)


def test_early_stopping_is_on_by_default_only_with_a_time_budget():
    from tfcli.training_config import EARLY_STOP_DEFAULT

    assert TrainConfig().patience == 0 and TrainConfig(time_budget=60).patience == EARLY_STOP_DEFAULT > 0
    assert TrainConfig(time_budget=60, early_stop=0).patience == 0 and TrainConfig(early_stop=5).patience == 5
    with pytest.raises(TfcliError, match="early_stop"):
        TrainConfig(early_stop=-1)
    with pytest.raises(TfcliError, match="decay_fraction"):
        TrainConfig(decay_fraction=1.5)


def test_rank_slices_tile_the_single_process_batch():
    from tfcli.train.data import LMSource, Slot

    tokens = np.arange(1000, dtype=np.uint16)
    single = LMSource(tokens, tokens, 16, 8, seed=3).batch(Slot(5, 1))
    halves = [LMSource(tokens, tokens, 16, 4, seed=3).batch(Slot(5, 1, rank, 2)) for rank in (0, 1)]
    assert torch.equal(torch.cat([h.tensors["ids"] for h in halves]), single.tensors["ids"])
    assert torch.equal(single.tensors["labels"][:, :-1], single.tensors["ids"][:, 1:])  # next-token targets


def test_labeled_batches_visit_every_example_once_per_epoch():
    from tfcli.data.labeled import LabeledSet
    from tfcli.train.data import LabeledSource, Slot

    data = LabeledSet([[i + 10] for i in range(12)], [i % 2 for i in range(12)], "x")
    source = LabeledSource("classify", data, None, 3, seed=1, pad_id=0, eos_id=0, accum=2)
    seen = [int(x) for step in range(2) for micro in range(2) for x in source.batch(Slot(step, micro)).tensors["ids"][:, 0]]
    assert sorted(seen) == list(range(10, 22))


def test_bert_masking_recipe():
    from tfcli.train.data import IGNORE, mask_tokens

    ids = torch.randint(10, 100, (64, 128))
    protected = torch.zeros_like(ids, dtype=torch.bool)
    protected[:, 0] = True
    inputs, labels = mask_tokens(ids, torch.Generator().manual_seed(0), prob=0.15, mask_id=3, vocab=100, protected=protected)
    picked = labels != IGNORE
    assert abs(picked.float().mean().item() - 0.15) < 0.01 and not picked[:, 0].any()
    assert torch.equal(labels[picked], ids[picked])
    masked = (inputs[picked] == 3).float().mean().item()
    kept = (inputs[picked] == ids[picked]).float().mean().item()
    assert abs(masked - 0.8) < 0.03 and 0.07 < kept < 0.14
    assert torch.equal(inputs[~picked], ids[~picked])


def test_span_corruption_collapses_spans_into_single_masks():
    from tfcli.train.data import span_corrupt

    ids = list(range(10, 110))
    out = span_corrupt(ids, torch.Generator().manual_seed(0), density=0.3, mean_span=3.0, mask_id=1)
    assert 1 in out and len(out) < len(ids)
    kept = [t for t in out if t != 1]
    assert kept == sorted(kept) and set(kept) <= set(ids)


def test_optimizer_state_round_trips_through_named_tensors():
    from tfcli.model.config import preset
    from tfcli.model.transformer import Transformer
    from tfcli.train.optim import load_optimizer_tensors, make_optimizer, optimizer_tensors

    model = Transformer(preset("tiny", vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, block_size=8))
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    model(torch.randint(0, 50, (2, 8))).logits.sum().backward()
    optimizer.step()
    tensors = optimizer_tensors(optimizer, names)
    assert "tok_emb.weight/exp_avg" in tensors and "lm_head.weight/exp_avg" not in tensors  # tied: saved once
    fresh = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    load_optimizer_tensors(fresh, tensors, names)
    for key, value in optimizer_tensors(fresh, names).items():
        assert torch.equal(value, tensors[key])
    with pytest.raises(TfcliError, match="not a trainable parameter"):
        load_optimizer_tensors(fresh, {**tensors, "ghost.weight/exp_avg": torch.zeros(1)}, names)


def test_macro_f1_matches_the_hand_computed_value():
    from tfcli.train.objectives import macro_f1

    assert macro_f1([0, 0, 1], [0, 1, 1]) == pytest.approx(2 / 3)
    assert macro_f1([1, 1, 1], [1, 1, 1]) == 1.0


def test_flops_estimate_matches_the_6n_rule():
    from tfcli.model.config import preset
    from tfcli.train.flops import training_flops_per_token

    config = preset("gpt2-small")
    flops = training_flops_per_token(config, 1024)
    non_embedding = 124_439_808 - 50257 * 768 - 1024 * 768
    expected = 6 * (non_embedding + 50257 * 768) + 12 * 12 * 768 * 1024
    assert math.isclose(flops, expected, rel_tol=0.01)


def test_metrics_writer_amends_its_last_record_and_writes_strict_json(tmp_path):
    from tfcli.train.state import MetricsWriter

    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.write({"step": 1, "loss": 2.0})
    writer.write({"step": 2, "loss": float("nan")})
    amended = writer.amend({"val_loss": float("inf"), "val_ppl": 3.0})
    writer.write({"step": 3, "loss": 1.0})
    writer.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "loss": 2.0},
        {"step": 2, "loss": None, "val_loss": None, "val_ppl": 3.0},
        {"step": 3, "loss": 1.0},
    ]
    assert amended == {"step": 2, "loss": None, "val_loss": None, "val_ppl": 3.0}
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()


def test_an_unknown_label_is_named_by_its_line(tmp_path, trained_tokenizer):
    from tfcli.data.labeled import load_labeled
    from tfcli.tokenizer.core import TextTokenizer

    path = tmp_path / "val.jsonl"
    path.write_text('{"text": "a", "label": "pos"}\n\n\n{"text": "b", "label": "meh"}\n', encoding="utf-8")
    with pytest.raises(TfcliError, match="val.jsonl line 4 has the label 'meh', which the model does not know"):
        load_labeled(path, "classify", TextTokenizer.load(trained_tokenizer), "decoder", 16, labels=["neg", "pos"])


@pytest.mark.parametrize("setting", ["eps=inf", "grad_clip=inf", "time_budget=inf", "lr=nan", "norm_eps=inf", "rope_base=-inf"])
def test_non_finite_settings_are_refused(setting):
    with pytest.raises(TfcliError, match=r"--set \w+: expected a finite number, got (inf|nan|-inf)$"):
        resolve_configs(preset_name="tiny", config_file=None, sets=[setting], options={})
