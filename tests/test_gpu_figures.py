"""scripts/gpu_figures.py: scripts/gpu_check.sh's steps land in one figures.json (machine, each step's exit
code, time and stderr tail, each bench's --json output, the issue's headline), whatever a step left behind."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_collector():
    spec = importlib.util.spec_from_file_location("gpu_figures", ROOT / "scripts" / "gpu_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_steps_figures_land_in_one_file(tmp_path, capsys):
    logs, out = tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    out.mkdir()
    (logs / "summary.txt").write_text(
        "== train: python3 -m tfcli bench train --batch max --json\n   train: exit 0 in 61 s\n"
        "== serve: python3 -m tfcli bench serve RUN --json\n   serve: exit 124 in 95 s\n"
        "== train_eager: python3 -m tfcli bench train --batch 256 --json\n   train_eager: exit 0 in 40 s\n"
    )
    (logs / "machine.txt").write_text("NVIDIA H200, 580.159.04, 143771 MiB\nModel name: Intel Xeon\n")
    train = {
        "batch": 256,
        "batch_search": {"largest": 256, "tried": [[256, True], [512, False]], "stopped_by": "out of memory"},
        "card": {"device_name": "NVIDIA H200", "card": "H200 SXM", "bf16_peak_flops": 989.4e12, "note": ""},
        "compile": True,
        "results": [
            {"preset": "gpt2-small", "implementation": "tfcli", "tokens_per_sec": 5e5, "mfu": 0.5, "card_mfu": 0.41, "peak_device_mb": 1e5, "compiled": True}
        ],
    }
    (logs / "train.out").write_text(json.dumps(train, indent=2))
    eager = {**train, "compile": False, "batch_search": None, "results": [{**train["results"][0], "card_mfu": 0.3, "compiled": False}]}
    (logs / "train_eager.out").write_text(json.dumps(eager))
    (logs / "serve.out").write_text("")  # killed at its limit: no JSON
    (logs / "serve.err").write_text("\n".join(f"line {i}" for i in range(50)))
    load_collector().main(logs, out)
    figures = json.loads((out / "figures.json").read_text())
    assert figures["machine"][0].startswith("NVIDIA H200")
    assert figures["steps"]["train"] == {"command": "python3 -m tfcli bench train --batch max --json", "exit": 0, "seconds": 61, "stderr_tail": []}
    assert (
        figures["steps"]["serve"]["exit"] == 124
        and figures["steps"]["serve"]["stderr_tail"][-1] == "line 49"
        and len(figures["steps"]["serve"]["stderr_tail"]) == 30
    )
    assert figures["figures"]["serve"] is None and figures["figures"]["train"] == train
    headline = figures["headline"]["train"]
    assert headline["batch"] == 256 and headline["card"]["card"] == "H200 SXM" and headline["rows"][0]["card_mfu"] == 0.41
    assert headline["compile"] is True and headline["rows"][0]["compiled"] is True
    uncompiled = figures["headline"]["train_uncompiled"]
    assert uncompiled["compile"] is False and uncompiled["rows"][0]["card_mfu"] == 0.3 and uncompiled["rows"][0]["compiled"] is False
    assert "serve" not in figures["headline"] and "train: exit 0 in 61 s" in capsys.readouterr().out
