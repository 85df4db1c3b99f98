"""--recipe classic|modern: a named set of settings under the config file, --set and the options; and what
`tfcli bench recipe` makes of its runs (the runs themselves are measured on docs/benchmarks.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from training import pretrain_args

from tfcli.bench.recipe import RecipeRun, Variant, _command, summarize, variants
from tfcli.errors import TfcliError
from tfcli.train.command_line import resolve_configs
from tfcli.train.recipes import MODERN_TRICKS, OTHER_TRICKS, recipe_settings

MODERN_MODEL = {"positions": "rotary", "norm": "rmsnorm", "bias": False, "activation": "swiglu", "qk_norm": True, "zero_init_proj": True}
MODERN_MODEL |= {"tie_embeddings": False}


def run_config(run: Path) -> tuple[dict, dict]:
    config = json.loads((run / "config.json").read_text())
    return config["model"], config["training"]["config"]


def test_modern_turns_every_trick_on_and_the_command_line_still_wins(cli, shards, tmp_path):
    result = cli(*pretrain_args(shards, tmp_path / "modern", "--recipe", "modern", "--max-steps", "2", "--set", "activation=gelu"))
    assert result.code == 0, result.stderr
    model, train = run_config(tmp_path / "modern")
    assert {key: model[key] for key in MODERN_MODEL if key != "activation"} == {k: v for k, v in MODERN_MODEL.items() if k != "activation"}
    assert model["activation"] == "gelu"  # --set is above the recipe
    assert (train["optimizer"], train["schedule"]) == ("muon", "wsd")
    assert model["logit_softcap"] is None  # measured and left off


def test_a_config_file_is_above_the_recipe_and_classic_is_the_settings_as_they_were(cli, shards, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[train]\nschedule = "cosine"\n', encoding="utf-8")
    assert cli(*pretrain_args(shards, tmp_path / "filed", "--recipe", "modern", "--config", config, "--max-steps", "1")).code == 0
    assert run_config(tmp_path / "filed")[1]["schedule"] == "cosine"
    assert cli(*pretrain_args(shards, tmp_path / "classic", "--recipe", "classic", "--max-steps", "1")).code == 0
    assert cli(*pretrain_args(shards, tmp_path / "plain", "--max-steps", "1")).code == 0
    assert run_config(tmp_path / "classic")[0] == run_config(tmp_path / "plain")[0]


def test_an_unknown_recipe_is_one_line(cli, shards, tmp_path):
    result = cli(*pretrain_args(shards, tmp_path / "bad", "--recipe", "postmodern"))
    assert result.code == 2 and "--recipe must be one of classic, modern" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "bad").exists()
    with pytest.raises(TfcliError, match="unknown trick 'muonn'"):
        recipe_settings("modern", without=("muonn",))
    with pytest.raises(TfcliError, match="unknown trick 'muon'"):
        recipe_settings("modern", adding=("muon",))  # already in: adding takes the tricks left off


@pytest.mark.parametrize("trick", list(MODERN_TRICKS))
def test_an_ablated_variant_is_modern_with_that_trick_back_at_classic(trick, tmp_path):
    command = _command(tmp_path / "shards", tmp_path / "run", Variant(f"modern - {trick}", "modern", without=(trick,)), 0, 60)
    config = Path(command[command.index("--config") + 1])
    model, train = resolve_configs(preset_name="tiny", config_file=config, sets=[], options={})
    full_model, full_train = resolve_configs(preset_name="tiny", config_file=None, sets=[], options={}, recipe=recipe_settings("modern"))
    classic_model, classic_train = resolve_configs(preset_name="tiny", config_file=None, sets=[], options={})
    for key in MODERN_TRICKS[trick]:
        section, name = key.split(".")
        ablated, modern, classic = (model, full_model, classic_model) if section == "model" else (train, full_train, classic_train)
        assert getattr(ablated, name) == getattr(classic, name) != getattr(modern, name)
    others = {key.split(".")[1] for other, settings in MODERN_TRICKS.items() if other != trick for key in settings if key.startswith("model.")}
    assert all(getattr(model, name) == getattr(full_model, name) for name in others)


@pytest.mark.parametrize("trick", list(OTHER_TRICKS))
def test_an_added_trick_is_modern_with_its_settings(trick, tmp_path):
    command = _command(tmp_path / "shards", tmp_path / "run", Variant(f"modern + {trick}", "modern", adding=(trick,)), 0, 60)
    model, _ = resolve_configs(preset_name="tiny", config_file=Path(command[command.index("--config") + 1]), sets=[], options={})
    for key, value in OTHER_TRICKS[trick].items():
        assert getattr(model, key.split(".")[1]) == value
    assert model.positions == "rotary" and not model.tie_embeddings


def test_the_summary_compares_best_checkpoints_and_equal_steps():
    def run(variant, seed, best, evaluations):
        return RecipeRun("stories.txt", variant, seed, max(s for s, _ in evaluations), 60.0, best, evaluations, False)

    runs = [
        run("classic", 0, 1.00, [(100, 1.5), (200, 1.2), (300, 1.0), (312, 1.0)]),
        run("modern", 0, 0.80, [(100, 1.0), (200, 0.8), (230, 0.8)]),
        run("classic", 1, 1.10, [(100, 1.6), (200, 1.3), (300, 1.1), (305, 1.1)]),
        run("modern", 1, 0.90, [(100, 1.1), (200, 0.9), (244, 0.9)]),
    ]
    classic, modern = summarize(runs)
    assert (classic.variant, modern.variant) == ("classic", "modern")
    assert classic.best_bpb == pytest.approx(1.05) and classic.spread == pytest.approx(0.10)
    assert modern.versus_classic == pytest.approx(0.85 / 1.05 - 1)
    assert modern.equal_steps == classic.equal_steps == 200  # the last evaluation every run reached
    assert (classic.bpb_at_equal_steps, modern.bpb_at_equal_steps) == (pytest.approx(1.25), pytest.approx(0.85))
    lone = summarize([run("classic", 0, 1.0, [(57, 1.0)]), run("modern", 0, 0.9, [(43, 0.9)])])
    assert lone[0].equal_steps == 0 and math.isnan(lone[1].bpb_at_equal_steps)


def test_ablation_runs_every_trick_once():
    names = [v.name for v in variants(ablate=True)]
    assert names[:2] == ["classic", "modern"] and len(names) == 2 + len(MODERN_TRICKS) + len(OTHER_TRICKS) and len(set(names)) == len(names)
    assert [v.name for v in variants(ablate=False)] == ["classic", "modern"]
