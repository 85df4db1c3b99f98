"""An SAE in use: `tfcli eval --sae` (its metrics on held-out data), `tfcli inspect-features` (one feature,
the most active ones, the features of a text; terminal, JSON, a page Chromium opens, the notebook view) and
`tfcli generate --steer` (a feature's direction added while decoding, through the hook point, gone after)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import snapshot
from tests.helpers import browse
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.model.config import preset
from tfcli.model.hook_point import any_hooked
from tfcli.model.transformer import Transformer
from tfcli.sae.files import load_sae, sae_config, save_sae
from tfcli.sae.model import SparseAutoencoder
from tfcli.sae.points import editing
from tfcli.tokenizer.core import TextTokenizer

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, trained_tokenizer, shards) -> dict[str, Path]:
    """A tiny decoder run and a topk SAE trained on it by the command (32 steps)."""
    from tfcli.cli.app import main

    tokenizer = TextTokenizer.load(trained_tokenizer)
    root = tmp_path_factory.mktemp("sae-views")
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, block_size=64, n_layers=2, n_heads=4, d_model=32, d_ff=64, init_std=0.2)
    save_checkpoint(root / "run", Transformer(config), tokenizer)
    args = ["train", "sae", str(root / "run"), "--hook", HOOK, "--data", str(shards), "-o", str(root / "sae"), "--max-tokens", "4096"]
    with pytest.raises(SystemExit) as exit:
        main([*args, "--batch-size", "128", "--buffer", "2048", "--context", "32", "--k", "4", "--width", "64", "--save-every", "0", "--lr", "1e-2"])
    assert exit.value.code in (0, None)
    return {"run": root / "run", "sae": root / "sae", "shards": shards}


def test_eval_sae_reports_the_metrics_on_held_out_data(cli, setup):
    result = cli("eval", setup["run"], "--sae", setup["sae"], "--data", setup["shards"], "--json")
    assert result.code == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert metrics["hook"] == HOOK and metrics["d_sae"] == 64 and metrics["l0"] == pytest.approx(4.0)
    assert 0 < metrics["explained_variance"] < 1 and 0 <= metrics["dead_fraction"] < 1
    recovered = (metrics["ce_loss_zero"] - metrics["ce_loss_spliced"]) / (metrics["ce_loss_zero"] - metrics["ce_loss_clean"])
    assert metrics["ce_loss_recovered"] == pytest.approx(recovered)
    table = cli("eval", setup["run"], "--sae", setup["sae"], "--data", setup["shards"])
    assert table.code == 0 and "CE loss recovered" in table.stdout and "explained variance" in table.stdout
    alone = cli("eval", setup["run"], "--sae", setup["sae"])
    assert alone.code == 2 and "pass --data" in alone.stderr


def test_one_feature_top_features_and_a_text(cli, setup):
    base = ["inspect-features", setup["run"], "--sae", setup["sae"]]
    top = json.loads(cli(*base, "--data", setup["shards"], "--top", "5", "--json").stdout)
    assert 1 <= len(top["rows"]) <= 5 and top["hook"] == HOOK
    densities = [r["density"] for r in top["rows"]]
    feature = top["rows"][0]["feature"]
    report = json.loads(cli(*base, "--data", setup["shards"], "--feature", feature, "--top", "4", "--json").stdout)
    assert report["feature"] == feature and report["density"] == pytest.approx(densities[0])
    assert 1 <= len(report["contexts"]) <= 4 and sum(c for _, _, c in report["histogram"]) == round(report["density"] * report["tokens_read"])
    values = [c["value"] for c in report["contexts"]]
    assert values == sorted(values, reverse=True) and values[0] == pytest.approx(report["max_value"])
    assert all(c["values"][c["at"]] == pytest.approx(c["value"], abs=1e-3) for c in report["contexts"])
    assert len(report["promotes"]) == 4 and report["promotes"][0][1] >= report["promotes"][-1][1] > report["suppresses"][0][1]
    words = json.loads(cli(*base, "--text", "The quick brown fox", "--json").stdout)
    assert len(words["tokens"]) == len(words["features"]) and all(0 < len(f) <= 5 for f in words["features"])
    assert all(a[1] >= b[1] for f in words["features"] for a, b in zip(f, f[1:]))  # strongest first
    terminal = cli(*base, "--data", setup["shards"], "--feature", feature)
    assert terminal.code == 0 and f"feature {feature} of 64" in terminal.stdout and "promotes:" in terminal.stdout


def test_the_page_opens_and_the_notebook_view_shows_it(cli, setup, tmp_path):
    from tfcli import inspect

    page = tmp_path / "feature.html"
    result = cli("inspect-features", setup["run"], "--sae", setup["sae"], "--data", setup["shards"], "--feature", "0", "-o", page)
    assert result.code == 0 and page.is_file()
    _, found = browse(page, "return [document.querySelectorAll('table').length, document.querySelector('h1').textContent]")
    assert found[0] >= 2 and found[1].startswith("feature 0 of 64")
    view = inspect.features(setup["run"], setup["sae"], text="The fox <script>alert(1)</script>")
    html = view._repr_html_()
    assert "<script>alert" not in html and "&lt;script&gt;" in html and view.to_json()["hook"] == HOOK


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--feature", "64"], "--feature 64 is out of range: the SAE has 64 features"),
        (["--feature", "-1"], "--feature -1 is out of range"),
        (["--text", "x", "--feature", "1"], "--text shows the features on each token of one text"),
        (["-o", "x.png"], "inspect-features writes terminal, json and html"),
    ],
)
def test_bad_input_is_one_line(cli, setup, extra, message):
    data = [] if "--text" in extra else ["--data", str(setup["shards"])]
    result = cli("inspect-features", setup["run"], "--sae", setup["sae"], *data, *extra)
    assert result.code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_sae_of_another_run_or_with_nan_is_refused_by_every_command(cli, setup, tmp_path):
    sae = SparseAutoencoder(48, 64, "topk", k=4)
    save_sae(tmp_path / "wide", sae, sae_config(sae, HOOK))
    with torch.no_grad():
        sae.W_enc[0, 0] = float("nan")
    save_sae(tmp_path / "nan", sae, sae_config(sae, "blocks.9.hook_resid_post"))
    for folder, message in ((tmp_path / "wide", "reads vectors of width 48"), (tmp_path / "nan", "tensor W_enc holds non-finite values")):
        before = snapshot(folder)
        for args in (
            ["inspect-features", setup["run"], "--sae", folder, "--text", "fox"],
            ["eval", setup["run"], "--sae", folder, "--data", setup["shards"]],
            ["generate", setup["run"], "-p", "fox", "-n", "2", "--steer", f"{folder}:1:2"],
        ):
            result = cli(*args)
            assert result.code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert snapshot(folder) == before


def test_steering_adds_the_direction_through_the_hook_and_is_gone_after(cli, setup):
    base = ["generate", setup["run"], "-p", "The quick brown", "-n", "6", "--json"]
    plain = json.loads(cli(*base).stdout)["completions"][0]["tokens"]
    zero = json.loads(cli(*base, "--steer", f"{setup['sae']}:3:0").stdout)["completions"][0]["tokens"]
    steered = json.loads(cli(*base, "--steer", f"{setup['sae']}:3:60").stdout)["completions"][0]["tokens"]
    assert zero == plain and steered != plain
    assert not any_hooked()
    # the first new token is what the model gives with the direction added at the hook point, by hand
    model = load_checkpoint(setup["run"]).model
    sae, _ = load_sae(setup["sae"])
    tokenizer = TextTokenizer.load(setup["run"] / "tokenizer.json")
    ids = torch.tensor([tokenizer.encode("The quick brown")])
    with torch.no_grad(), editing(model, HOOK, lambda x: x + 60 * sae.W_dec[3]):
        first = int(model(ids).logits[0, -1].argmax())
    assert steered[0] == first
    bad = cli(*base, "--steer", f"{setup['sae']}:64:1")
    assert bad.code == 2 and "feature 64 is out of range" in bad.stderr
    masked = cli("generate", setup["run"], "--classify", "x", "--steer", f"{setup['sae']}:1:1")
    assert masked.code == 2


@pytest.mark.parametrize("text", ["a\x00b", "line\u2028break \u202eevil", "<|endoftext|> fox", "\x1b]0;title\x07", "é" * 70, " "])
def test_hostile_text_is_data_or_one_line(cli, setup, text):
    for extra in (["--json"], []):
        result = cli("inspect-features", setup["run"], "--sae", setup["sae"], "--text", text, *extra)
        assert result.code in (0, 2), result.stderr
        if result.code == 2:
            assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        elif extra:  # JSON: the text is data, given back as it came
            document = json.loads(result.stdout)
            assert document["text"] == text and len(document["tokens"]) >= 1
        else:  # the terminal: no control or bidirectional character reaches it raw
            assert "\x1b]" not in result.stdout and "\x00" not in result.stdout and "\u202e" not in result.stdout
