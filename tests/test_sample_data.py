"""sample_data/ is what scripts/make_sample_data.py makes, byte for byte, and fits its purpose."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO, SAMPLE_DATA

FILES = ["corpus/stories.txt", "reviews.jsonl", "dates.jsonl", "chat_train.jsonl", "chat_val.jsonl"]


def test_the_generator_reproduces_the_committed_files(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "make_sample_data.py"), "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (SAMPLE_DATA / name).read_bytes(), name


def test_sizes_and_shapes():
    total = sum((SAMPLE_DATA / name).stat().st_size for name in FILES)
    assert 300_000 < (SAMPLE_DATA / FILES[0]).stat().st_size and total < 2_000_000
    reviews = [json.loads(line) for line in (SAMPLE_DATA / "reviews.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {r["label"] for r in reviews} == {"positive", "negative"} and all(set(r) == {"text", "label"} for r in reviews)
    dates = [json.loads(line) for line in (SAMPLE_DATA / "dates.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(set(d) == {"source", "target"} and len(d["target"]) == 10 for d in dates)


def test_the_chat_set_is_arithmetic_in_conversations_and_validation_is_held_out():
    train, val = (
        [json.loads(line) for line in (SAMPLE_DATA / name).read_text(encoding="utf-8").splitlines()] for name in ("chat_train.jsonl", "chat_val.jsonl")
    )
    assert len(train) == 2000 and len(val) == 200
    assert not {json.dumps(c) for c in val} & {json.dumps(c) for c in train}
    for conversation in train + val:
        roles = [m["role"] for m in conversation["messages"]]
        assert roles in (["user", "assistant"] * k for k in (1, 2)) or roles[1:] in (["user", "assistant"] * k for k in (1, 2))
        assert roles[0] in ("system", "user") and all(m["content"] for m in conversation["messages"])
    assert any(len(c["messages"]) == 5 for c in train)  # a system message and two exchanges
