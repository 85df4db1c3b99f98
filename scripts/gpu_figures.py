"""Collect what scripts/gpu_check.sh's steps wrote into one file, figures.json: the machine (card, driver,
torch, processor, date), each step's command, exit code, seconds and the tail of its stderr, the --json output
of each bench, and the headline figures issue #48 asks for, ready for docs/benchmarks.md. Prints the headline.

Usage: python3 scripts/gpu_figures.py LOGS OUT   (LOGS: the steps' NAME.out / NAME.err and summary.txt)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

STEP_LINE = re.compile(r"^   (?P<name>\S+): exit (?P<code>\d+) in (?P<seconds>\d+) s$")
COMMAND_LINE = re.compile(r"^== (?P<name>[^:]+): (?P<command>.*)$")
TRAIN_ROW = ("preset", "implementation", "tokens_per_sec", "mfu", "card_mfu", "peak_device_mb", "out_of_memory", "compiled", "compile_seconds", "note")


def steps(summary: str) -> dict[str, dict]:
    """Each step's command, exit code and seconds, from summary.txt."""
    found: dict[str, dict] = {}
    for line in summary.splitlines():
        if match := COMMAND_LINE.match(line):
            found[match["name"]] = {"command": match["command"]}
        elif match := STEP_LINE.match(line):
            found.setdefault(match["name"], {}).update(exit=int(match["code"]), seconds=int(match["seconds"]))
    return found


def json_output(path: Path) -> dict | None:
    """A bench's --json output (the whole of its stdout), or None where the step printed none."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def headline(figures: dict) -> dict:
    """The issue's figures, where the steps gave them: decode ms per token at 1 and 16 rows (and the ratio to
    transformers), training tokens/s and MFU (measured-matmul and datasheet) at the largest batch, compiled and
    uncompiled, serve."""
    out: dict = {}
    for step in ("generate", "generate16"):
        for bench in (figures.get(step) or {}).get("benches", []):
            out[step] = {
                "preset": bench.get("preset"),
                "rows": bench.get("batch"),
                "ms_per_step": bench.get("ms_per_step"),
                "speedup_vs_transformers": bench.get("speedup_vs_transformers"),
                "same_tokens": bench.get("same_tokens"),
                "same_tokens_compiled": bench.get("same_tokens_compiled"),
                "compiled_tuning": bench.get("tuning"),
            }
    # compiled at the largest batch; the fixed batch, uncompiled, where the search or the compiling failed; the
    # same batch uncompiled where the budget had time left
    for name, step in (("train", figures.get("train") or figures.get("train_fixed")), ("train_uncompiled", figures.get("train_eager"))):
        if step:
            out[name] = {
                "batch": step.get("batch"),
                "compile": step.get("compile", False),
                "batch_search": step.get("batch_search"),
                "card": step.get("card"),
                "rows": [{key: row.get(key) for key in TRAIN_ROW} for row in step.get("results", [])],
            }
    serve = figures.get("serve")
    if serve:
        out["serve"] = serve.get("bench", serve)
    return out


def main(logs: Path, out: Path) -> None:
    summary = (logs / "summary.txt").read_text() if (logs / "summary.txt").exists() else ""
    ran = steps(summary)
    for name, step in ran.items():
        err = logs / f"{name}.err"
        step["stderr_tail"] = err.read_text(errors="replace").splitlines()[-30:] if err.exists() else []
    figures = {name: json_output(logs / f"{name}.out") for name in ran if name not in ("tests", "run")}
    tests = logs / "tests.out"
    machine = logs / "machine.txt"
    collected = {
        "machine": machine.read_text().splitlines() if machine.exists() else [],
        "steps": ran,
        "tests": tests.read_text(errors="replace").splitlines()[-15:] if tests.exists() else [],
        "headline": headline(figures),
        "figures": figures,
    }
    (out / "figures.json").write_text(json.dumps(collected, indent=2) + "\n")
    print(json.dumps({"machine": collected["machine"], "headline": collected["headline"]}, indent=1))
    for name, step in ran.items():
        print(f"{name}: exit {step.get('exit')} in {step.get('seconds')} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
