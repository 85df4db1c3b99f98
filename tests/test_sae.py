"""Sparse autoencoders: SAELens's own loader reads tfcli's SAEs and tfcli reads SAEs SAELens made (encode and
decode equal within 1e-5, every architecture), `tfcli train sae` writes SAELens's layout with metrics and an
exact resume (also after kill -9), and every user mistake is one line with exit code 2."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import REPO, snapshot
from tests.helpers import missing_tool
from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.errors import TfcliError
from tfcli.model.config import preset
from tfcli.model.transformer import Transformer
from tfcli.sae.files import load_sae, load_sae_for, sae_config, save_sae
from tfcli.sae.model import SparseAutoencoder
from tfcli.sae.points import editing, hook_widths
from tfcli.tokenizer.core import TextTokenizer

HOOK = "blocks.1.hook_resid_post"
SMALL = ["--batch-size", "128", "--buffer", "2048", "--context", "32", "--log-every", "8", "--save-every", "16", "--k", "4", "--width", "128"]


def _save_run(folder: Path, tokenizer: TextTokenizer, **overrides) -> Path:
    torch.manual_seed(0)
    config = preset(
        "tiny", vocab_size=tokenizer.vocab_size, **{"block_size": 64, "n_layers": 2, "n_heads": 4, "d_model": 32, "d_ff": 64, "init_std": 0.2, **overrides}
    )
    save_checkpoint(folder, Transformer(config), tokenizer)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    tokenizer = TextTokenizer.load(trained_tokenizer)
    root = tmp_path_factory.mktemp("sae-runs")
    return {"run": _save_run(root / "run", tokenizer), "wide": _save_run(root / "wide", tokenizer, d_model=48, n_heads=4)}


@pytest.fixture(scope="module")
def trained(runs, shards, tmp_path_factory) -> Path:
    """A topk SAE trained by the command on the tiny run (64 steps, checkpoints every 16)."""
    from tfcli.cli.app import main

    out = tmp_path_factory.mktemp("sae") / "topk"
    with pytest.raises(SystemExit) as exit:
        main(["train", "sae", str(runs["run"]), "--hook", HOOK, "--data", str(shards), "-o", str(out), "--max-tokens", "8192", *SMALL])
    assert exit.value.code in (0, None)
    return out


def _random_sae(arch: str, d_in: int = 32, d_sae: int = 64, seed: int = 0) -> SparseAutoencoder:
    torch.manual_seed(seed)
    sae = SparseAutoencoder(d_in, d_sae, arch, k=5 if arch == "topk" else None)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in sae.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return sae


# SAELens runs in a process of its own: it imports TransformerLens, whose sentencepiece OpenMP runtime would
# keep this process from loading tfcli's C code in the tests after these (as tests/test_hook_points.py does).
SAE_LENS_RUN = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from sae_lens import SAE, JumpReLUSAEConfig, StandardSAEConfig, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata

work = Path(sys.argv[1])
x = load_file(str(work / "x.safetensors"))["x"]
out = {}
for folder in json.loads(sys.argv[2]):  # tfcli's SAEs, read by SAELens's own loader
    sae = SAE.load_from_disk(folder)
    features = sae.encode(x.unflatten(-1, (4, 8)) if folder.endswith("hook_z") else x)  # SAELens takes hook_z as (..., heads, d_head)
    out[Path(folder).name + "/features"] = features.contiguous()
    out[Path(folder).name + "/decoded"] = sae.decode(features).flatten(2).contiguous()
    out[Path(folder).name + "/class"] = torch.tensor([len(type(sae).__name__)])
torch.manual_seed(1)
made = {"topk": TopKSAEConfig(d_in=32, d_sae=64, k=6), "standard": StandardSAEConfig(d_in=32, d_sae=64), "jumprelu": JumpReLUSAEConfig(d_in=32, d_sae=64)}
for arch, cfg in made.items():  # SAEs SAELens makes and saves itself
    cfg.metadata = SAEMetadata(hook_name="blocks.1.hook_resid_post", model_name="tiny")
    sae = SAE.get_sae_class_for_architecture(arch)(cfg)
    with torch.no_grad():
        for p in sae.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        if arch == "jumprelu":
            sae.threshold.uniform_(0.0, 0.5)
    sae.save_model(work / ("saelens-" + arch))
    out["saelens-" + arch + "/features"] = sae.encode(x).contiguous()
save_file(out, str(work / "out.safetensors"))
"""


def _sae_lens(work: Path, folders: list[Path], x: torch.Tensor) -> dict[str, torch.Tensor]:
    if importlib.util.find_spec("sae_lens") is None:
        missing_tool("could not import sae_lens, the reference SAE library")
    save_file({"x": x.contiguous()}, str(work / "x.safetensors"))
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SAE_LENS_RUN, str(work), json.dumps([str(f) for f in folders])], env=offline, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return load_file(str(work / "out.safetensors"))


def test_sae_lens_reads_tfcli_saes_and_tfcli_reads_sae_lens_saes(runs, trained, tmp_path):
    model = load_checkpoint(runs["run"]).model
    folders = [trained]
    for arch in ("standard", "jumprelu"):
        sae = _random_sae(arch)
        save_sae(tmp_path / f"tfcli-{arch}", sae, sae_config(sae, HOOK))
        folders.append(tmp_path / f"tfcli-{arch}")
    sae = _random_sae("standard", seed=2)  # 4 heads x 8: the heads side by side, as SAELens's hook_z reshaping has them
    save_sae(tmp_path / "tfcli-hook_z", sae, sae_config(sae, "blocks.0.attn.hook_z"))
    folders.append(tmp_path / "tfcli-hook_z")
    assert json.loads((tmp_path / "tfcli-hook_z" / "cfg.json").read_text())["reshape_activations"] == "hook_z"
    torch.manual_seed(0)
    x = torch.randn(3, 7, 32) * 2
    theirs = _sae_lens(tmp_path, folders, x)
    for folder in folders:
        ours, config = load_sae(folder)
        features = ours.encode(x)
        assert (features > 0).any() and (features == 0).any()
        torch.testing.assert_close(theirs[f"{folder.name}/features"], features, atol=1e-5, rtol=0)
        torch.testing.assert_close(theirs[f"{folder.name}/decoded"], ours.decode(features), atol=1e-5, rtol=0)
    assert json.loads((trained / "cfg.json").read_text())["metadata"]["hook_name"] == HOOK
    for arch in ("topk", "standard", "jumprelu"):  # SAELens's own files, in tfcli, checked against the run
        ours, config = load_sae_for(tmp_path / f"saelens-{arch}", model)
        assert config.architecture == arch and config.hook_name == HOOK
        features = ours.encode(x)
        assert (features > 0).any()
        torch.testing.assert_close(features, theirs[f"saelens-{arch}/features"], atol=1e-5, rtol=0)


def test_train_sae_writes_saelens_layout_metrics_and_a_working_splice(runs, trained):
    assert {p.name for p in trained.iterdir()} >= {"cfg.json", "sae_weights.safetensors", "sae_training.json", "metrics.jsonl", "trainer"}
    assert json.loads((trained / "cfg.json").read_text())["metadata"]["tfcli_run"] == str(runs["run"].resolve())  # compared resolved when used
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [8, 16, 24, 32, 40, 48, 56, 64]
    assert {"l0", "explained_variance", "mse", "dead_fraction", "dense_fraction"} <= set(records[0])
    assert all(r["l0"] == pytest.approx(4.0) for r in records)  # topk, k=4: exactly k features per vector
    assert records[-1]["explained_variance"] > records[0]["explained_variance"]
    assert 0 < records[-1]["ce_loss_recovered"] <= 1.5 and "ce_loss_recovered" in records[1]  # at every save
    model = load_checkpoint(runs["run"]).model
    sae, config = load_sae_for(trained, model)
    norms = sae.W_dec.norm(dim=1)
    torch.testing.assert_close(norms, torch.full_like(norms, float(norms[0])))  # unit norm in the scaled space: all equal once folded
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        plain = model(ids).logits
        with editing(model, HOOK, sae.forward):
            spliced = model(ids).logits
        with editing(model, HOOK, lambda x: x):
            same = model(ids).logits
    assert torch.equal(same, plain) and not torch.allclose(spliced, plain)
    assert torch.equal(model(ids).logits, plain)  # the edit is gone with its block


def test_resume_is_exact_after_a_stop_and_after_kill_9(runs, shards, trained, tmp_path, cli):
    args = ["train", "sae", str(runs["run"]), "--hook", HOOK, "--data", str(shards), *SMALL]
    assert cli(*args, "-o", tmp_path / "a", "--max-tokens", "2600").code == 0  # stops at step 21, not at a log step
    done = cli(*args, "-o", tmp_path / "a", "--max-tokens", "8192", "--resume")
    assert done.code == 0 and "resuming at step 21" in done.stdout
    straight = load_file(str(trained / "sae_weights.safetensors"))
    assert all(torch.equal(straight[k], v) for k, v in load_file(str(tmp_path / "a" / "sae_weights.safetensors")).items())
    drop = lambda path: [{k: v for k, v in json.loads(line).items() if k != "elapsed_seconds"} for line in path.read_text().splitlines()]  # noqa: E731
    assert drop(tmp_path / "a" / "metrics.jsonl") == drop(trained / "metrics.jsonl")

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "tfcli", *args, "-o", str(out), "--max-tokens", "400000", "--save-every", "2"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (out / "trainer" / "state.json").is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # into the saves that follow
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read()[-2000:]
    resumed = cli(*args, "-o", out, "--max-tokens", "8192", "--resume")
    assert resumed.code == 0, resumed.stderr
    assert all(torch.equal(straight[k], v) for k, v in load_file(str(out / "sae_weights.safetensors")).items())


def test_the_hook_name_is_checked_with_a_did_you_mean(runs, shards, cli, tmp_path):
    result = cli("train", "sae", runs["run"], "--hook", "blocks.1.hook_resid_pots", "--data", shards, "-o", tmp_path / "x")
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "did you mean blocks.1.hook_resid_post?" in result.stderr and "blocks.0.attn.hook_z" in result.stderr
    assert not (tmp_path / "x").exists()
    widths = hook_widths(load_checkpoint(runs["run"]).model)
    assert widths["blocks.0.attn.hook_z"] == 32 and widths["blocks.0.mlp.hook_post"] == 64 and "blocks.0.attn.hook_pattern" not in widths


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--k", "500"], "--k must be between 1 and the width (128)"),
        (["--arch", "gated"], "--arch must be topk, relu or jumprelu"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
    ],
)
def test_bad_settings_are_one_line(runs, shards, cli, tmp_path, extra, message):
    result = cli("train", "sae", runs["run"], "--hook", HOOK, "--data", shards, "-o", tmp_path / "x", "--width", "128", *extra)
    assert result.code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_resume_without_a_run_is_one_line(runs, shards, cli, tmp_path):
    result = cli("train", "sae", runs["run"], "--hook", HOOK, "--data", shards, "-o", tmp_path / "none", "--resume")
    assert result.code == 2 and "holds no SAE run to resume" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_existing_sae_is_never_overwritten(runs, shards, trained, cli):
    before = snapshot(trained)
    result = cli("train", "sae", runs["run"], "--hook", HOOK, "--data", shards, "-o", trained)
    assert result.code == 2 and "already holds an SAE" in result.stderr
    assert snapshot(trained) == before


def test_an_sae_that_does_not_fit_the_run_or_holds_nan_is_refused(runs, trained, tmp_path):
    wide = load_checkpoint(runs["wide"]).model
    with pytest.raises(TfcliError, match="reads vectors of width 32 at blocks.1.hook_resid_post, but .* gives 48"):
        load_sae_for(trained, wide, runs["wide"])
    sae = _random_sae("topk")
    save_sae(tmp_path / "elsewhere", sae, sae_config(sae, "blocks.7.hook_resid_post"))
    with pytest.raises(TfcliError, match="reads blocks.7.hook_resid_post, which .* does not have"):
        load_sae_for(tmp_path / "elsewhere", wide)
    with torch.no_grad():
        sae.W_dec[3, 2] = float("nan")
    save_sae(tmp_path / "nan", sae, sae_config(sae, HOOK))
    with pytest.raises(TfcliError, match="tensor W_dec holds non-finite values"):
        load_sae(tmp_path / "nan")
    config = json.loads((trained / "cfg.json").read_text())
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "cfg.json").write_text(json.dumps({**config, "surprise": 1}))
    with pytest.raises(TfcliError, match="unknown key 'surprise'"):
        load_sae(tmp_path / "odd")


@pytest.mark.slow
def test_bench_sae_trains_both_on_the_same_activations(runs, shards, cli):
    if importlib.util.find_spec("sae_lens") is None:
        missing_tool("could not import sae_lens, the reference SAE library")
    args = ["bench", "sae", runs["run"], "--hook", HOOK, "--data", shards, "--max-tokens", "4096", "--batch-size", "128", "--width", "64", "--k", "4"]
    result = cli(*args, "--json")
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    tfcli, theirs = report["rows"]
    assert (tfcli["trainer"], theirs["trainer"]) == ("tfcli", "SAELens") and tfcli["tokens"] == theirs["tokens"] == 4096
    assert tfcli["l0"] == pytest.approx(4.0) and theirs["l0"] == pytest.approx(4.0)  # SAELens's topk SAE, read back by tfcli
    assert set(report["ratios_tfcli_over_sae_lens"]) == {"tokens_per_cpu_second", "l0", "explained_variance", "ce_loss_recovered"}
    assert all(-1 < row["explained_variance"] <= 1 and row["cpu_seconds"] > 0 for row in report["rows"]), report["rows"]
