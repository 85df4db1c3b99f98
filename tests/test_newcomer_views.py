"""Bugs a newcomer met in the "see inside" commands: `train sae -o` at a run, a tokenizer or a shard folder wrote
over its metrics.jsonl and trainer/; an SAE or buffer wider than the machine was a traceback or the kernel's
kill; `eval --tasks -o` into a missing folder a traceback after the whole scoring; `inspect-features --data`
took a binary file, counted a short text's tokens once per window, and read any number of windows into memory;
`inspect-ablate --top-k 0` an empty table. Bad input is one line (exit 2), with nothing on disk changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import snapshot
from tests.helpers import one_line
from tfcli.checkpoint import save_checkpoint
from tfcli.data.shards import open_shard
from tfcli.errors import TfcliError
from tfcli.inspect import feature_views
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.sae.files import sae_config, save_sae
from tfcli.sae.model import SparseAutoencoder, refuse_what_memory_cannot_hold
from tfcli.tokenizer.core import TextTokenizer

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def run(tmp_path_factory, trained_tokenizer) -> Path:
    """A tiny GPT-2-shaped run (random weights) and an SAE on its residual stream, beside it in RUN/../sae."""
    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("newcomer-views")
    save_checkpoint(
        root / "run", Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=32, d_ff=64)), tokenizer
    )
    sae = SparseAutoencoder(32, 64, "topk", k=4)
    save_sae(root / "sae", sae, sae_config(sae, HOOK))
    return root / "run"


# ---- train sae -o ------------------------------------------------------------------------------------------


def _train_sae(cli, run: Path, data: Path, output: Path, *extra: str):
    return cli(
        "train",
        "sae",
        run,
        "--hook",
        HOOK,
        "--data",
        data,
        "-o",
        output,
        "--max-tokens",
        "64",
        "--batch-size",
        "32",
        "--buffer",
        "64",
        "--context",
        "16",
        *extra,
    )


def test_an_sae_is_never_trained_into_a_run_a_tokenizer_or_a_shard_folder(cli, run, shards, trained_tokenizer, tmp_path):
    """`train sae -o RUN` replaced the run's metrics.jsonl and trainer/state.json with the SAE's."""
    folders = {"a run directory": tmp_path / "run", "a tokenizer folder": tmp_path / "tokenizer", "a token-shard folder": tmp_path / "shards"}
    for origin, folder in zip((run, trained_tokenizer, shards), folders.values()):
        shutil.copytree(origin, folder)
    (folders["a run directory"] / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    for kind, folder in folders.items():
        before = snapshot(folder)
        one_line(_train_sae(cli, run, shards, folder), f"{folder} is {kind}; the SAE would write over its files")
        assert snapshot(folder) == before, kind
    others = tmp_path / "notes"
    others.mkdir()
    (others / "notes.txt").write_text("mine")
    one_line(_train_sae(cli, run, shards, others), "holds files that are not an SAE's ('notes.txt')")
    one_line(_train_sae(cli, run, shards, others / "notes.txt"), "is a file, not a folder")
    assert (others / "notes.txt").read_text() == "mine" and sorted(p.name for p in others.iterdir()) == ["notes.txt"]


def test_an_sae_folder_is_still_trained_into_and_resumed(cli, run, shards, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _train_sae(cli, run, shards, empty)
    assert result.code == 0 and (empty / "cfg.json").is_file(), result.stderr
    result = cli("train", "sae", run, "--hook", HOOK, "--data", shards, "-o", empty, "--max-tokens", "128", "--resume")
    assert result.code == 0 and "resuming at step 2" in result.stdout, (result.stdout, result.stderr)


@pytest.mark.parametrize("option", [("--width", "100000000000"), ("--buffer", "100000000000000")])
def test_an_sae_or_a_buffer_wider_than_the_machine_is_one_line_before_any_allocation(cli, run, shards, tmp_path, option):
    """--width 1e8 was a traceback from torch's allocator; --buffer 1e11 ended in the kernel's kill."""
    one_line(_train_sae(cli, run, shards, tmp_path / "sae", *option), "GB; this machine has", "use a smaller --width (or --expansion) or --buffer")
    assert not (tmp_path / "sae").exists()


def test_the_memory_an_sae_needs_is_counted_from_its_buffer_and_both_matrices(monkeypatch):
    monkeypatch.setattr("tfcli.sae.model.physical_memory", lambda: 4 * (100 * 8 + 8 * 8 * 16))
    refuse_what_memory_cannot_hold(8, 16, 100)  # exactly what there is
    for d_in, d_sae, buffer in ((8, 17, 100), (8, 16, 101)):
        with pytest.raises(TfcliError, match="use a smaller --width"):
            refuse_what_memory_cannot_hold(d_in, d_sae, buffer)


# ---- eval --tasks -o -----------------------------------------------------------------------------------------


def test_eval_tasks_output_in_a_missing_folder_is_refused_before_scoring(cli, run, tmp_path, monkeypatch):
    """-o missing/results.json ran every task, then ended in a FileNotFoundError traceback."""
    pytest.importorskip("lm_eval", reason="the eval extra: pip install 'tfcli[eval]'")
    scored = []
    monkeypatch.setattr("tfcli.harness.evaluate.evaluate_tasks", lambda *args, **kwargs: scored.append(args))
    one_line(cli("eval", run, "--tasks", "tfcli_story_choice", "--limit", "2", "-o", tmp_path / "missing" / "r.json"), "the folder of", "does not exist")
    one_line(cli("eval", run, "--tasks", "tfcli_story_choice", "--limit", "2", "-o", tmp_path), "is a folder")
    assert scored == [] and not (tmp_path / "missing").exists()


# ---- inspect-features --data ---------------------------------------------------------------------------------


def test_inspect_features_refuses_a_binary_data_file(cli, run, tmp_path):
    binary = tmp_path / "program.txt"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    sae = run.parent / "sae"
    for extra in (("--feature", "1"), ()):
        one_line(cli("inspect-features", run, "--sae", sae, "--data", binary, *extra), f"{binary} looks like a binary file")


def test_a_short_text_is_read_once_not_once_per_window(cli, run, tmp_path):
    """A 7-token text was drawn 64 times: 'fires on ... of 448 tokens', and its one top context shown five times."""
    text = tmp_path / "short.txt"
    text.write_text("the fox saw the ball.", encoding="utf-8")
    n_tokens = len(TextTokenizer.load(run).encode(text.read_text()))
    sae = run.parent / "sae"
    top = cli("inspect-features", run, "--sae", sae, "--data", text, "--json")
    assert top.code == 0, top.stderr
    assert json.loads(top.stdout)["tokens_read"] == n_tokens
    feature = json.loads(top.stdout)["rows"][0]["feature"]
    report = json.loads(cli("inspect-features", run, "--sae", sae, "--data", text, "--feature", feature, "--json").stdout)
    assert report["tokens_read"] == n_tokens
    places = [(tuple(c["tokens"]), c["at"]) for c in report["contexts"]]
    assert len(places) == len(set(places)) and 1 <= len(places) <= n_tokens


def test_windows_never_overlap_and_are_fewer_where_the_data_holds_fewer(run, shards):
    session = feature_views.FeatureSession(run, run.parent / "sae")
    held = open_shard(shards, "val")
    ids = session.windows(shards, 10_000, 8)
    aligned = torch.from_numpy(np.asarray(held[: len(held) // 8 * 8], dtype=np.int64).reshape(-1, 8))
    assert torch.equal(ids, aligned)  # every window the split holds side by side, each once, none overlapping
    few = session.windows(shards, 3, 8)
    assert few.shape == (3, 8) and all((aligned == row).all(1).any() for row in few)
    assert torch.equal(few, session.windows(shards, 3, 8))  # drawn by the seed


def test_features_are_read_a_batch_at_a_time_and_the_windows_are_capped(run, shards, monkeypatch):
    """Every window's (N, T, d_sae) features were held at once, and --windows had no bound (1e8 was the kernel's kill)."""
    session = feature_views.FeatureSession(run, run.parent / "sae")
    with pytest.raises(TfcliError, match="pass fewer --windows"):
        session.windows(shards, 100_000_000, 128)
    whole = feature_views.top_features(session, shards, top=5, windows=16, context=8)
    monkeypatch.setattr(feature_views, "FORWARD_TOKENS", 8)  # one window at a time
    seen = []
    features = session.features
    monkeypatch.setattr(session, "features", lambda ids: seen.append(ids.shape[0]) or features(ids))
    batched = feature_views.top_features(session, shards, top=5, windows=16, context=8)
    assert set(seen) == {1} and len(seen) == whole.tokens_read // 8
    assert [r["feature"] for r in batched.rows] == [r["feature"] for r in whole.rows]
    for a, b in zip(batched.rows, whole.rows):
        assert a["top_token"] == b["top_token"] and a["max"] == pytest.approx(b["max"]) and a["density"] == pytest.approx(b["density"])


# ---- inspect-ablate --top-k ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-2"])
def test_inspect_ablate_refuses_a_top_k_below_one(cli, run, value):
    one_line(cli("inspect-ablate", run, "--text", "the fox saw the ball", "--top-k", value), f"--top-k must be at least 1, not {value}")


# ---- names as the user wrote them; tokens as every other view shows them ----------------------------------------


def test_a_neuron_out_of_range_names_the_neuron_option(cli, run):
    """--neuron 0.9 said '--head 9 is out of range ... or all', an option not given and a value --neuron refuses."""
    stderr = one_line(cli("inspect-attention", run, "--text", "the fox", "--neuron", "0.9"), "--neuron 0.9: head 9 is out of range", "pick 0 to 1")
    assert "'all'" not in stderr
    one_line(cli("inspect-attention", run, "--text", "the fox", "--neuron", "3.0"), "--neuron 3.0: layer 3 is out of range")


def test_a_layer_dot_head_out_of_range_is_named_as_written(cli, run):
    """--head 0.9 (split into --layer 0 --head 9) said '--head 9 is out of range', a value the user never wrote."""
    stderr = one_line(cli("inspect-attention", run, "--text", "the fox", "--head", "0.9"), "--head 0.9: head 9 is out of range", "pick 0 to 1")
    assert "--head 9 " not in stderr and "'all'" not in stderr  # 'all' would be --head 0.all, not a fix for 0.9
    one_line(cli("inspect-attention", run, "--text", "the fox", "--head", "2.-1"), "--head 2.-1: layer 2 is out of range")
    one_line(cli("inspect-attention", run, "--text", "the fox", "--head", "0.x"), "--head 0.x: the head must be a number")
    shown = cli("inspect-attention", run, "--text", "the fox", "--head", "-1.-1")  # negative counts from the end
    assert shown.code == 0 and "layer 0, head 1" in " ".join(shown.stdout.split()), shown.stdout


def test_a_layer_out_of_range_names_the_negative_ones_it_takes(cli, run):
    """--layer -3 on a 2-layer model said 'pick one from 0 to 1', though -1 and -2 are taken (counted from the end)."""
    one_line(cli("inspect-attention", run, "--text", "the fox", "--head", "-3"), "--head -3 is out of range", "pick 0 to 1, or -1 to -2 from the end, or 'all'")
    one_line(cli("inspect-attention", run, "--text", "the fox", "--layer", "1"), "--layer 1 is out of range", "pick 0, or -1 from the end")


def test_inspect_embeddings_shows_hostile_words_escaped_cut_or_refused(cli, run):
    """An --analogy's title went to the terminal raw (an ESC sequence, a bidi override); a word not UTF-8 went on (as
    U+FFFD's bytes) to a UnicodeEncodeError on a UTF-8 terminal; a megabyte given as a word printed four megabytes of
    note; an empty word showed the space token's neighbours."""
    shown = cli("inspect-embeddings", run, "--analogy", "the\u202e - \x1b[31mfox + ball", "-k", "2")
    assert shown.code == 0 and "\x1b" not in shown.stdout and "\u202e" not in shown.stdout, shown.stdout
    assert "the\\u202e - \\x1b[31mfox + ball" in " ".join(shown.stdout.split())  # the title, escaped (the table may wrap it)
    one_line(cli("inspect-embeddings", run, "--analogy", "caf\udce9 - fox + ball"), "--analogy is not UTF-8 text (character 4)")
    one_line(cli("inspect-embeddings", run, "--neighbours", "fox", "caf\udce9"), "the word 'caf\\udce9' is not UTF-8 text")
    one_line(cli("inspect-embeddings", run, "--neighbours", ""), "a word is empty")
    big = cli("inspect-embeddings", run, "--neighbours", "-k", "2", "--", "the fox " * 125_000)  # a megabyte
    assert big.code == 0 and len(big.stdout) < 5_000, len(big.stdout)
    flat = " ".join(big.stdout.split())
    assert "'… (1,000,000 characters) is 250,001 tokens (' the' ' fox' " in flat and " …); using ' the'" in flat, big.stdout  # 16 listed


def test_the_features_on_each_token_mark_its_spaces_as_the_other_views_do(cli, run, tmp_path):
    """The token column showed ' fox' (a space no one sees, a blank row for a space token), where every other view shows ␣fox."""
    sae = run.parent / "sae"
    result = cli("inspect-features", run, "--sae", sae, "--text", "the fox saw\nthe ball")
    assert result.code == 0 and "␣fox" in result.stdout and "↵" in result.stdout and "\\n" not in result.stdout, result.stdout
    page = tmp_path / "features.html"
    assert cli("inspect-features", run, "--sae", sae, "--text", "the fox saw the ball", "-o", page).code == 0
    assert "␣fox" in page.read_text(encoding="utf-8")
    document = json.loads(cli("inspect-features", run, "--sae", sae, "--text", "the fox saw the ball", "--json").stdout)
    assert " fox" in document["tokens"] and "␣fox" in document["labels"]  # the data keeps the text as it is, and the labels


def test_the_notebook_views_take_numbers_and_check_their_counts(run):
    """inspect.attention(run, text, layer=1) was an AttributeError ('int' object has no attribute 'strip'), and
    inspect.features(..., windows=0) a ValueError from numpy."""
    from tfcli import inspect

    view = inspect.attention(run, "the fox saw the fox", layer=0, head=-1)
    assert "fox" in view._repr_html_()
    assert (view.inspection.layers, view.inspection.heads) == ([0], [1])
    with pytest.raises(TfcliError, match="--layer 4 is out of range"):
        inspect.attention(run, "the fox", layer=4)
    for counts in ({"windows": 0}, {"context": 0}, {"top": -1}):
        with pytest.raises(TfcliError, match="must be at least 1"):
            inspect.features(run, run.parent / "sae", feature=1, data=run, **counts)


def test_the_quickstart_never_makes_its_folders_inside_a_run_or_a_shard_folder(cli, run, shards, tmp_path):
    """`quickstart -o runs/quickstart/model` trained a tokenizer, shards, a model and a classifier inside the run."""
    data = tmp_path / "data"
    (data / "corpus").mkdir(parents=True)
    (data / "corpus" / "stories.txt").write_text("the fox saw the ball.\n", encoding="utf-8")
    for folder, kind in ((run, "a run directory"), (shards, "a token-shard folder")):
        before = snapshot(folder)
        one_line(cli("quickstart", "--data", data, "-o", folder, "--steps", "1"), f"{folder} is {kind}; the quickstart makes a folder of its own")
        assert snapshot(folder) == before


@pytest.mark.parametrize("option", ["--eval-analogies", "--eval-similarity"])
def test_a_word_test_file_with_nothing_in_it_is_one_line(cli, run, tmp_path, option):
    """An empty questions file scored 'total 0 of 0' (a pairs file 'rho --'), exit 0, as if the vectors were tested."""
    empty, comments = tmp_path / "empty.txt", tmp_path / "comments.txt"
    empty.write_text("")
    comments.write_text("# nothing but a comment\n\n")
    what = "questions" if option == "--eval-analogies" else "word pairs"
    for path in (empty, comments):
        one_line(cli("inspect-embeddings", run, option, path), f"{path} holds no {what}")
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("nothingknown alsounknown 5.0\n")  # a file whose words the table lacks is still a result
    if option == "--eval-similarity":
        assert cli("inspect-embeddings", run, option, pairs).code == 0


def test_the_logit_lens_next_row_shows_each_next_token_as_the_text_does(cli, run, tmp_path):
    """In another script the 'next' row named byte pieces by their vocabulary entries ('×', 'ŀ') where the header,
    one position on, shows the characters they are part of."""
    result = cli("inspect-logits", run, "--text", "שלום")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[1].split()
    following = next(line for line in lines if line.startswith("next")).split()[1:]
    assert len(following) >= 3 and set("שלום") & set(following), result.stdout
    assert following[:-1] == header[1 : len(following)], result.stdout
    page = tmp_path / "lens.html"
    assert cli("inspect-logits", run, "--text", "שלום", "-o", page).code == 0
    assert "×" not in page.read_text(encoding="utf-8").split("the token each position should predict")[1]


def test_an_eval_batch_whose_logits_cannot_fit_is_one_line(cli, run, shards):
    """--batch-size 100000 took 2.6 GB on the quickstart's shards and would take the kernel's kill on larger ones."""
    one_line(cli("eval", run, "--data", shards, "--batch-size", "100000000000"), "need", "GB for their logits alone; this machine has")
    assert cli("eval", run, "--data", shards, "--batch-size", "4", "--device", "cpu").code == 0


def test_a_run_in_a_folder_whose_name_is_not_utf8_is_named_as_such(cli, run, tmp_path):
    """safetensors (Rust) opens only UTF-8 paths: such a run was said to be a truncated or corrupted file."""
    odd = tmp_path / os.fsdecode(b"run-\xff")
    shutil.copytree(run, odd)
    for args in (("generate", odd, "--prompt", "The fox", "-n", "2"), ("inspect-attention", odd, "--text", "The fox", "--json")):
        result = cli(*args)
        assert result.code == 2 and "is not a UTF-8 path" in one_line(result), result.stderr
        assert "corrupted" not in result.stderr
