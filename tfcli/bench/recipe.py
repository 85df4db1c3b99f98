"""`tfcli bench recipe`: the classic recipe beside the modern one (tfcli/train/recipes.py) at equal wall time,
on texts of different kinds, over several seeds; with `ablate`, modern with each trick left out in turn.

Each text is made into a tokenizer and shards once, as the one-command path makes them (train/text_data.py);
every run then trains the one-command path's model (the tiny preset, batch 32, lr 3e-3, an evaluation every
100 steps, early stopping) for the same --time-budget, in its own `tfcli train pretrain` process with the same
number of threads, the recipes interleaved seed by seed so that a machine's drift falls on both. The figure is
the validation bits per byte of the best checkpoint (what best/ keeps), and, at equal steps, of the last
evaluation every run of the text reached."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pydoc_data.topics
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tfcli.errors import TfcliError
from tfcli.train.recipes import MODERN_TRICKS, OTHER_TRICKS, recipe_settings
from tfcli.train.text_data import TEXT_DEFAULTS, prepare_text_data

ONE_COMMAND_SETTINGS = {key: value for key, value in TEXT_DEFAULTS.items() if key not in ("max_steps", "save_every")}


@dataclasses.dataclass(frozen=True)
class Variant:
    """A recipe as the bench runs it: --recipe NAME, or modern with the tricks in `without` left out or those in
    `adding` put in (given to the run as a config file of those settings, under the classic recipe)."""

    name: str
    recipe: str
    without: tuple[str, ...] = ()
    adding: tuple[str, ...] = ()


@dataclasses.dataclass
class RecipeRun:
    text: str
    variant: str
    seed: int
    steps: int
    seconds: float
    best_bpb: float
    evaluations: list[tuple[int, float]]  # (step, val bpb) of every evaluation
    stopped_early: bool


def variants(ablate: bool) -> list[Variant]:
    """classic and modern, and with `ablate` modern without each of its tricks and with each other trick, in turn."""
    found = [Variant("classic", "classic"), Variant("modern", "modern")]
    if ablate:
        found += [Variant(f"modern - {trick}", "modern", without=(trick,)) for trick in MODERN_TRICKS]
        found += [Variant(f"modern + {trick}", "modern", adding=(trick,)) for trick in OTHER_TRICKS]
    return found


def prepare_texts(texts: list[Path], folder: Path) -> list[tuple[str, Path]]:
    """Each text's tokenizer and shards, made once as the one-command path makes them: (name, shard folder)."""
    prepared = []
    for index, text in enumerate(texts):
        steps = prepare_text_data(text, folder / f"text-{index}")
        while True:
            try:
                next(steps)
            except StopIteration as done:
                prepared.append((text.name, done.value))
                break
    return prepared


def _command(shards: Path, output: Path, variant: Variant, seed: int, budget: float) -> list[str]:
    command = [sys.executable, "-m", "tfcli", "train", "pretrain", "--data", str(shards), "-o", str(output), "--json"]
    command += ["--seed", str(seed), "--time-budget", f"{budget:g}s"]
    command += ["--batch-size", str(ONE_COMMAND_SETTINGS["batch_size"]), "--lr", str(ONE_COMMAND_SETTINGS["lr"])]
    command += ["--eval-every", str(ONE_COMMAND_SETTINGS["eval_every"]), "--early-stop", str(ONE_COMMAND_SETTINGS["early_stop"])]
    if not variant.without and not variant.adding:
        return [*command, "--recipe", variant.recipe]
    settings = recipe_settings(variant.recipe, without=variant.without, adding=variant.adding)
    config = output.with_name(output.name + ".toml")
    config.write_text(
        "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items()), encoding="utf-8"
    )  # JSON's strings, numbers, booleans are TOML's
    return [*command, "--config", str(config)]


def _read_run(run_dir: Path, summary: dict, text: str, variant: Variant, seed: int) -> RecipeRun:
    """The run's evaluations (metrics.jsonl) and how it ended (the summary `train pretrain --json` prints)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evaluations = [(r["step"], r["val_bpb"]) for r in records if "val_bpb" in r]
    if not evaluations:
        raise TfcliError(f"the {variant.name} run on {text} made no evaluation", hint="give it a longer --budget")
    best = min(b for _, b in evaluations)
    return RecipeRun(text, variant.name, seed, summary["step"], summary["elapsed_seconds"], best, evaluations, summary["stopped_by"] == "early_stop")


def run_recipe_bench(texts: list[Path], folder: Path, *, budget: float, seeds: int, ablate: bool = False, threads: int = 1) -> Iterator[RecipeRun]:
    """Yield every run as it finishes (text by text, seed by seed, the variants interleaved)."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    for text, shards in prepare_texts(texts, folder):
        for seed in range(seeds):
            for variant in variants(ablate):
                run_dir = folder / f"{text}-{variant.name.replace(' ', '').replace('+', 'plus')}-{seed}"
                done = subprocess.run(_command(shards, run_dir, variant, seed, budget), capture_output=True, text=True, env=environment)
                if done.returncode != 0:
                    raise RuntimeError(f"the {variant.name} run on {text} failed:\n{done.stderr[-2000:]}")
                yield _read_run(run_dir, json.loads(done.stdout[done.stdout.index("{") :]), text, variant, seed)


@dataclasses.dataclass
class RecipeSummary:
    text: str
    variant: str
    runs: int
    steps: float  # mean steps in the budget
    best_bpb: float  # mean over seeds of the best checkpoint's val bpb
    spread: float  # max - min over seeds
    equal_steps: int  # the last evaluation step every run of this text reached
    bpb_at_equal_steps: float
    versus_classic: float  # best_bpb / classic's best_bpb - 1 (negative: lower, better)


def summarize(runs: list[RecipeRun]) -> list[RecipeSummary]:
    summaries = []
    for text in dict.fromkeys(r.text for r in runs):
        of_text = [r for r in runs if r.text == text]
        shared_steps = set.intersection(*({step for step, _ in r.evaluations} for r in of_text))
        common = max(shared_steps, default=0)  # the last evaluation step every run reached (0: none in common)
        rows = {}
        for variant in dict.fromkeys(r.variant for r in of_text):
            mine = [r for r in of_text if r.variant == variant]
            best = [r.best_bpb for r in mine]
            at_common = [dict(r.evaluations)[common] for r in mine] if common else [math.nan]
            rows[variant] = RecipeSummary(
                text,
                variant,
                len(mine),
                statistics.mean(r.steps for r in mine),
                statistics.mean(best),
                max(best) - min(best),
                common,
                statistics.mean(at_common),
                0.0,
            )
        classic = rows.get("classic")
        for row in rows.values():
            row.versus_classic = row.best_bpb / classic.best_bpb - 1 if classic else 0.0
        summaries.extend(rows.values())
    return summaries


def default_texts(folder: Path, stories: Path) -> list[Path]:
    """The sample stories and Python's language reference (pydoc_data.topics), a text of another kind."""
    reference = folder / "python-reference.txt"
    reference.write_text("\n\n".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics)), encoding="utf-8")
    return [stories, reference]
