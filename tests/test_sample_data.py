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


def test_the_chat_set_is_word_games_and_validation_plays_them_on_new_words():
    train, val = (
        [json.loads(line) for line in (SAMPLE_DATA / name).read_text(encoding="utf-8").splitlines()] for name in ("chat_train.jsonl", "chat_val.jsonl")
    )
    assert len(train) == 2000 and len(val) == 200
    for conversation in train + val:
        roles = [m["role"] for m in conversation["messages"]]
        assert roles in (["user", "assistant"] * k for k in (1, 2)) or roles[1:] in (["user", "assistant"] * k for k in (1, 2))
        assert roles[0] in ("system", "user") and all(m["content"] for m in conversation["messages"])
    assert any(len(c["messages"]) == 5 for c in train)  # a system message and two exchanges

    def games(conversations) -> set:
        """(game, the three words) of every exchange, each reply checked against its question."""
        found = set()
        for conversation in conversations:
            messages = [m for m in conversation["messages"] if m["role"] != "system"]
            for question, reply in zip(messages[::2], messages[1::2]):
                words = question["content"].rsplit(": ", 1)[1].rstrip("?.").split()
                game = "first" if "first" in question["content"] else "last" if "last" in question["content"] else "repeat"
                expected = {"first": f"It is {words[0]}.", "last": f"It is {words[-1]}.", "repeat": f"Sure: {' '.join(words)}."}[game]
                assert len(words) == 3 and reply["content"] == expected, (question, reply)
                found.add((game, tuple(words)))
        return found

    assert {game for game, _ in games(val)} == {"first", "last", "repeat"}
    assert not games(val) & games(train)  # no game is played on the same three words in both files
