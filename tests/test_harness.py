"""`tfcli eval --tasks`: lm-eval's harness on tfcli runs. The tfcli model class against the harness's own `hf`
model on the same run exported with `tfcli export --to hf` (GPT-2- and Llama-shaped, a LoRA chat run), its rolling
log-likelihood against `tfcli eval`'s perplexity, the command's table, JSON and comparison, and bad input."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.conftest import SAMPLE_DATA

if os.environ.get("CI"):
    import lm_eval  # noqa: F401  CI installs the test extra, which holds the harness: missing, these tests fail
else:
    pytest.importorskip("lm_eval", reason="could not import lm_eval: the eval extra, pip install 'tfcli[eval]'")

SHAPES = {
    "gpt2": dict(positions="learned", norm="layernorm", activation="gelu_tanh"),
    "llama": dict(positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=1, tie_embeddings=False),
}
BLOCK = 64  # shorter than the stories: contexts are cut from the left, rolling windows slide
LIMIT = 8


def training_text() -> str:
    """A slice of the stories and dates written as the dates task asks them, for a tokenizer and a few steps."""
    stories = (SAMPLE_DATA / "corpus" / "stories.txt").read_text(encoding="utf-8")[:40_000]
    dates = [json.loads(line) for line in (SAMPLE_DATA / "dates.jsonl").read_text(encoding="utf-8").splitlines()[2000:2600]]
    return stories + "\n\n" + "\n".join(f"{d['source']} = {d['target']}" for d in dates) + "\n"


def train_briefly(model, ids, steps: int = 80) -> None:
    """A few steps of next-token training on random windows: predictions with some shape, not noise."""
    import torch

    from tfcli.model.transformer import Loss

    data = torch.tensor(ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - BLOCK - 1, (8,), generator=generator)
        rows = torch.stack([data[s : s + BLOCK + 1] for s in starts])  # (8, BLOCK + 1)
        loss = model(rows[:, :-1], head=Loss(rows[:, 1:])).loss / rows[:, 1:].numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A GPT-2-shaped and a Llama-shaped run trained for a moment, each with its `tfcli export --to hf` folder beside it."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.hf.convert import export_hf
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    folder = tmp_path_factory.mktemp("harness")
    (folder / "corpus.txt").write_text(training_text(), encoding="utf-8")
    train_tokenizer(resolve_corpus([folder / "corpus.txt"]), folder / "tokenizer", TokenizerTrainingConfig(vocab_size=512))
    tokenizer = TextTokenizer.load(folder / "tokenizer")
    ids = tokenizer.encode(training_text())
    out = {}
    for shape, options in SHAPES.items():
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layers=2, n_heads=2, d_model=32, d_ff=64, **options))
        train_briefly(model, ids)
        save_checkpoint(folder / shape, model, tokenizer)
        export_hf(folder / shape, folder / f"{shape}_hf")
        out[shape] = folder / shape
    return out


def both_models(run: Path, hf_folder: Path, options):
    """The harness's results for the tfcli model class and for its own `hf` model on the exported run."""
    from lm_eval.models.huggingface import HFLM

    from tfcli.harness.evaluate import run_harness
    from tfcli.harness.model import TfcliLM

    ours = run_harness(TfcliLM(run, batch_size=4), options)
    theirs = run_harness(HFLM(pretrained=str(hf_folder), device="cpu", dtype="float32", batch_size=4), options)
    return ours, theirs


def assert_same_results(ours: dict, theirs: dict) -> None:
    """Accuracies identical, every request's log-likelihood within 1e-4 with the same greedy flag, every
    generation the same text."""
    assert set(ours["results"]) == set(theirs["results"]) == {"tfcli_story_choice", "tfcli_last_word", "tfcli_dates"}
    texts = []
    for task, metrics in ours["results"].items():
        for key, value in metrics.items():
            if "," not in key or "stderr" in key:
                continue
            if key.startswith("perplexity"):
                assert value == pytest.approx(theirs["results"][task][key], rel=1e-4), (task, key)
            else:
                assert value == theirs["results"][task][key], (task, key)
        assert len(ours["samples"][task]) == len(theirs["samples"][task]) == LIMIT
        for a, b in zip(ours["samples"][task], theirs["samples"][task]):
            assert a["arguments"] == b["arguments"]  # the same prompts, built by the harness
            for (mine,), (hf,) in zip(a["resps"], b["resps"]):
                if isinstance(mine, str):
                    assert mine == hf
                    texts.append(mine)
                else:
                    assert mine[0] == pytest.approx(hf[0], abs=1e-4) and mine[1] == hf[1]
    assert any(text.strip() for text in texts)  # the generations say something: the comparison is not of empty strings


@pytest.mark.parametrize("shape", SHAPES)
def test_tfcli_model_equals_the_harness_hf_model(runs, shape):
    from tfcli.harness.evaluate import TaskOptions

    ours, theirs = both_models(runs[shape], runs[shape].parent / f"{shape}_hf", TaskOptions(("tfcli",), limit=LIMIT, log_samples=True, batch_size=4))
    assert_same_results(ours, theirs)
    choices = [round(r[0][0], 3) for s in ours["samples"]["tfcli_story_choice"] for r in s["resps"]]
    assert len(set(choices)) > len(choices) // 2  # a model with some shape: the numbers held equal are not all alike


def test_lora_chat_run_with_its_template_equals_the_hf_model(runs, cli, tmp_path):
    """A LoRA chat run (its adapter over the GPT-2-shaped parent, ChatML), prompts written with its chat
    template, against the hf model on `tfcli export --merge --to hf` of it."""
    from tfcli.harness.evaluate import TaskOptions

    run = tmp_path / "lora"
    train = ["train", "finetune", "--init-from", runs["gpt2"], "--task", "chat", "--data", SAMPLE_DATA / "chat_val.jsonl", "-o", run]
    assert cli(*train, "--batch-size", "8", "--lr", "1e-2", "--max-steps", "3", "--lora-rank", "2").code == 0
    assert cli("export", run, "--to", "hf", "--merge", "-o", tmp_path / "hf").code == 0
    ours, theirs = both_models(run, tmp_path / "hf", TaskOptions(("tfcli",), limit=LIMIT, log_samples=True, batch_size=4, chat_template=True))
    prompt = ours["samples"]["tfcli_dates"][0]["arguments"][0][0]
    assert prompt.count("<|im_start|>assistant") == 4 and prompt.endswith("<|im_start|>assistant\n")  # three examples as turns, then the question
    assert_same_results(ours, theirs)


@pytest.mark.parametrize("shape", SHAPES)
def test_rolling_loglikelihood_equals_tfcli_eval_perplexity(runs, shape, cli, tmp_path):
    """The harness's rolling windows over a text (after the prefix token, back to back, each window's first
    input the token before it) are `tfcli eval`'s windows over shards holding [eos] + the text's tokens."""
    import numpy as np
    from lm_eval.api.instance import Instance

    from tfcli.data.shards import encode_corpus, load_shard_meta
    from tfcli.harness.model import TfcliLM
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(runs[shape])
    text = (SAMPLE_DATA / "corpus" / "stories.txt").read_text(encoding="utf-8")[60_000:63_000]
    ids = tokenizer.encode(text)[: 5 * BLOCK]
    text = tokenizer.decode(ids)
    assert tokenizer.encode(text) == ids and len(ids) == 5 * BLOCK  # five whole windows
    (tmp_path / "one.txt").write_text("one two three\n", encoding="utf-8")
    from tfcli.corpus.reader import resolve_corpus

    shards = tmp_path / "shards"
    encode_corpus(resolve_corpus([tmp_path / "one.txt"]), tokenizer, shards, val_fraction=0.0)
    stream = np.asarray([tokenizer.require("eos"), *ids], dtype=np.uint16)
    stream.tofile(shards / "val.bin")
    meta = json.loads((shards / "meta.json").read_text())
    meta.update(val_tokens=len(stream), val_documents=1)
    (shards / "meta.json").write_text(json.dumps(meta))
    load_shard_meta(shards)

    result = cli("eval", runs[shape], "--data", shards, "--split", "val", "--json")
    assert result.code == 0, result.stderr
    reported = json.loads(result.stdout)
    assert reported["tokens"] == len(ids)
    lm = TfcliLM(runs[shape], batch_size=3)
    (total,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert -total / len(ids) == pytest.approx(reported["loss"], abs=1e-4)
    assert math.exp(-total / len(ids)) == pytest.approx(reported["ppl"], rel=1e-4)


def test_command_table_results_file_and_json(runs, cli, tmp_path):
    out = tmp_path / "results.json"
    result = cli("eval", runs["gpt2"], "--tasks", "tfcli_story_choice,tfcli_last_word", "--limit", "4", "-o", out)
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].replace(" ", "").startswith("|Tasks|Version|Filter|n-shot|Metric|")  # the harness's own table
    assert any(line.startswith("|tfcli_story_choice") and "|acc " in line for line in lines)
    saved = json.loads(out.read_text())
    assert set(saved["results"]) == {"tfcli_story_choice", "tfcli_last_word"} and "samples" not in saved
    assert saved["n-samples"]["tfcli_story_choice"]["effective"] == 4
    result = cli("eval", runs["gpt2"], "--tasks", "tfcli_story_choice", "--limit", "4", "--json")
    assert json.loads(result.stdout)["results"]["tfcli_story_choice"]["acc,none"] == saved["results"]["tfcli_story_choice"]["acc,none"]


def test_compare_runs_in_one_table(runs, cli):
    result = cli("eval", "--compare", runs["gpt2"], runs["llama"], "--tasks", "tfcli_story_choice", "--limit", "4")
    assert result.code == 0, result.stderr
    header, *rows = [line for line in result.stdout.splitlines() if line.strip()]
    assert header.split()[-2:] == [runs["gpt2"].name, runs["llama"].name]  # the paths below the folder they share
    assert any(row.split()[:3] == ["tfcli_story_choice", "0", "acc"] for row in rows)


def write_task(folder: Path, records: list[dict], **changes) -> Path:
    """A local multiple-choice task in `folder`: task.yaml and its data beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    fields = {
        "task": "mine",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": "data.jsonl"}},
        "output_type": "multiple_choice",
        "test_split": "test",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "label",
        **changes,
    }
    (folder / "task.yaml").write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in fields.items() if v is not None) + "\n", encoding="utf-8")
    return folder


RECORDS = [{"question": "The cat sat on the", "choices": ["mat", "sky"], "label": 0}, {"question": "A red", "choices": ["ball", "run"], "label": 0}]


def test_a_local_task_runs_from_another_folder(runs, cli, tmp_path, monkeypatch):
    folder = write_task(tmp_path / "tasks", RECORDS)
    monkeypatch.chdir(runs["gpt2"].parent)  # data_files are read beside the task file, not from here
    result = cli("eval", runs["gpt2"], "--tasks", "mine", "--include-path", folder, "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["n-samples"]["mine"]["effective"] == 2


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no doc_to_target", r"task mine \(.*task.yaml\) has no doc_to_target"),
        ("record without its field", "task mine: evaluated document 2 has no 'question'"),
        ("unknown task", "unknown task 'tfcli_story_choise'"),
        ("encoder run", "is an encoder; lm-eval tasks score a decoder"),
        ("too many shots", "task tfcli_story_choice has 20 examples for few-shot prompts, fewer than --num-fewshot 21"),
        ("no chat template", "has no chat template"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(runs, cli, tmp_path, case, expected):
    import re

    run, tasks, extra = runs["gpt2"], "mine", []
    if case == "no doc_to_target":
        extra = ["--include-path", write_task(tmp_path / "t", RECORDS, doc_to_target=None)]
    elif case == "record without its field":
        extra = ["--include-path", write_task(tmp_path / "t", [RECORDS[0], {"choices": ["a", "b"], "label": 1}])]
    elif case == "unknown task":
        tasks = "tfcli_story_choise"
    elif case == "encoder run":
        from tfcli.checkpoint import save_checkpoint
        from tfcli.model.config import ModelConfig
        from tfcli.model.transformer import Transformer
        from tfcli.tokenizer.core import TextTokenizer

        tokenizer = TextTokenizer.load(run)
        run = tmp_path / "encoder"
        save_checkpoint(
            run, Transformer(ModelConfig(arch="encoder", vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=16)), tokenizer
        )
        tasks = "tfcli_story_choice"
    elif case == "too many shots":
        tasks, extra = "tfcli_story_choice", ["--num-fewshot", "21"]
    elif case == "no chat template":
        tasks, extra = "tfcli_story_choice", ["--chat-template", "--limit", "1"]
    result = cli("eval", run, "--tasks", tasks, *extra)
    assert result.code == 2, result.stdout + result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and re.search(expected, error_lines[0]), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_the_eval_command_without_lm_eval_is_unchanged(runs, cli):
    """--data still scores loss and perplexity; --tasks and --data together, or neither, are refused."""
    assert cli("eval", runs["gpt2"]).code == 2
    assert cli("eval", runs["gpt2"], "--tasks", "tfcli", "--data", "x").code == 2
    assert cli("eval", runs["gpt2"], runs["llama"], "--tasks", "tfcli").code == 2  # two runs need --compare


@pytest.mark.parametrize(
    "task, expected",
    [
        (
            "hellaswag",
            r"task hellaswag: its dataset Rowan/hellaswag is on the Hugging Face Hub and not in this machine's cache .*"
            r"python -c \"import datasets; datasets.load_dataset\('Rowan/hellaswag'\)\"",
        ),
        ("hellaswg", r"unknown task 'hellaswg'; did you mean hellaswag\b"),
    ],
)
def test_registry_tasks_offline_and_misspelt(runs, cli, tmp_path, monkeypatch, task, expected):
    """A harness task whose data is on the Hub, offline and not cached (empty caches here, whatever this
    machine holds), says where the data is and how to get it; a misspelt registry name gets the real one."""
    import re

    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    result = cli("eval", runs["gpt2"], "--tasks", task, "--limit", "2")
    assert result.code == 2, result.stdout + result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and re.search(expected, error_lines[0]), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
