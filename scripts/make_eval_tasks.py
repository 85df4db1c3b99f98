"""Write the data of tfcli's shipped lm-eval tasks (tfcli/harness/tasks/*.jsonl) from sample_data/.

- story choice: a story without its last sentence, and four endings: its own and three other stories' (multiple choice);
- last word: a story cut before the last word of its last sentence, the word to predict (LAMBADA-style);
- dates: a date in a human format and the same date in ISO 8601 (generation, exact match).
Each has a small train split for few-shot examples and a test split. Deterministic: a rerun writes the same bytes.

    python scripts/make_eval_tasks.py                   # reads sample_data/, writes tfcli/harness/tasks/
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCE_END = re.compile(r'(?<=[.!?])\s+(?=[A-Z"])|(?<=[.!?]")\s+')
LAST_WORD = re.compile(r"^(?P<context>.*\S) (?P<word>[a-z]{3,})\.$", re.DOTALL)
SIZES = {"train": 20, "test": 200}


def stories(corpus: Path) -> list[str]:
    text = corpus.read_text(encoding="utf-8")
    return [" ".join(s.split()) for s in text.split("\n\n") if s.strip()]


def story_choice(texts: list[str], rng: random.Random) -> list[dict]:
    split = [SENTENCE_END.split(t) for t in texts]
    usable = [s for s in split if len(s) >= 3 and '"' not in s[-1]]
    endings = sorted({s[-1] for s in usable})
    docs = []
    for sentences in usable:
        ending = sentences[-1]
        others = rng.sample([e for e in endings if e != ending], 3)
        choices = [ending, *others]
        rng.shuffle(choices)
        docs.append({"context": " ".join(sentences[:-1]), "choices": choices, "label": choices.index(ending)})
    return docs


def last_word(texts: list[str]) -> list[dict]:
    docs = []
    for text in texts:
        match = LAST_WORD.match(text)
        if match and not match["context"].endswith('"'):
            docs.append({"context": match["context"], "word": match["word"]})
    return docs


def dates(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_splits(out: Path, name: str, docs: list[dict], rng: random.Random) -> None:
    docs = list(docs)
    rng.shuffle(docs)
    start = 0
    for split, size in SIZES.items():
        lines = [json.dumps(d, ensure_ascii=False) for d in docs[start : start + size]]
        (out / f"{name}_{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        start += size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "sample_data")
    parser.add_argument("--out", type=Path, default=ROOT / "tfcli" / "harness" / "tasks")
    args = parser.parse_args()
    texts = stories(args.data / "corpus" / "stories.txt")
    write_splits(args.out, "story_choice", story_choice(texts, random.Random(1)), random.Random(2))
    write_splits(args.out, "last_word", last_word(texts), random.Random(3))
    write_splits(args.out, "dates", dates(args.data / "dates.jsonl"), random.Random(4))


if __name__ == "__main__":
    main()
