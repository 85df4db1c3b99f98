"""The config files in examples/: one per preset, each read by `--config` as the same model the preset builds."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tfcli.model.config import PRESETS, preset
from tfcli.train.command_line import resolve_configs
from tfcli.training_config import TrainConfig

EXAMPLES = sorted((REPO / "examples").glob("*.toml"))


def test_every_preset_has_an_example():
    assert sorted(path.stem for path in EXAMPLES) == sorted(PRESETS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_example_builds_its_preset(path):
    model, train = resolve_configs(preset_name="tiny", config_file=path, sets=[], options={})
    assert model == preset(path.stem)
    assert isinstance(train, TrainConfig) and train != TrainConfig()  # its [train] table was read
