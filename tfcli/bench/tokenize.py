"""`tfcli bench tokenize`: tfcli's tokenizer training and corpus encoding, side by side with raw
`tokenizers` calls doing the same work, on the same text, in one run.

Every measurement runs in a fresh subprocess (`python -m tfcli.bench.tokenize JOB ...`), so each has its
own peak RSS and none warms a cache for another. The corpus is synthesized from sample_data/ when no
corpus is given (stories drawn at random, seeded), and the report says so.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tfcli.bench.common import keep_fastest, peak_rss_mb, run_worker
from tfcli.corpus.documents import iter_document_pieces
from tfcli.corpus.reader import ReadStats, resolve_corpus
from tfcli.data.shards import encode_corpus
from tfcli.errors import TfcliError
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.specials import DEFAULT_SPECIALS
from tfcli.tokenizer.train import train_tokenizer
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

BENCH_VOCAB_SIZE = 8192
BENCH_MIN_FREQUENCY = 2
SYNTH_FILES = 8


@dataclasses.dataclass
class Measurement:
    job: str
    seconds: float
    peak_rss_mb: float
    bytes: int
    tokens: int = 0
    encoder: str = ""  # encode_tfcli: what computed the ids (tiktoken where it gives tokenizers' ids, else tokenizers)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else 0.0


@dataclasses.dataclass
class TokenizeBench:
    corpus: str
    corpus_bytes: int
    synthesized: bool
    repeat: int
    train_raw: Measurement
    train_tfcli: Measurement
    encode_raw: Measurement
    encode_tfcli: Measurement

    @property
    def train_ratio(self) -> float:
        """tfcli train wall time / raw train wall time (target <= 1.10)."""
        return self.train_tfcli.seconds / self.train_raw.seconds

    @property
    def encode_ratio(self) -> float:
        """tfcli encode throughput / raw encode_batch throughput (target: `encode_target`)."""
        return self.encode_tfcli.mb_per_s / self.encode_raw.mb_per_s

    @property
    def encode_target(self) -> float:
        """>= 2.5 where tfcli encodes with tiktoken, >= 0.9 where it encodes with tokenizers too."""
        return 2.5 if self.encode_tfcli.encoder == "tiktoken" else 0.9

    def to_json(self) -> dict:
        return {
            "corpus": self.corpus,
            "corpus_bytes": self.corpus_bytes,
            "synthesized": self.synthesized,
            "repeat": self.repeat,
            "measurements": [
                dataclasses.asdict(m) | {"mb_per_s": round(m.mb_per_s, 3)} for m in (self.train_raw, self.train_tfcli, self.encode_raw, self.encode_tfcli)
            ],
            "train_time_ratio": round(self.train_ratio, 4),
            "encode_throughput_ratio": round(self.encode_ratio, 4),
            "encode_throughput_target": self.encode_target,
        }


def synthesize_corpus(source: Path, out_dir: Path, size_mb: float, seed: int = 0) -> list[Path]:
    """Write about `size_mb` MB of text into SYNTH_FILES files by drawing paragraphs of `source` at random."""
    paragraphs = [p.text for p in iter_document_pieces(resolve_corpus([source]), "paragraph", ReadStats()) if p.text]
    if not paragraphs:
        raise TfcliError(f"{source} holds no text to build a bench corpus from")
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    target = int(size_mb * 1e6)
    per_file = target // SYNTH_FILES + 1
    files = []
    for i in range(SYNTH_FILES):
        path = out_dir / f"synth-{i:02d}.txt"
        written = 0
        with open(path, "w", encoding="utf-8", newline="\n") as handle:
            while written < per_file:
                chunk = "\n\n".join(rng.choices(paragraphs, k=256)) + "\n\n"
                handle.write(chunk)
                written += len(chunk.encode("utf-8"))
        files.append(path)
    return files


def _job(job: str, files: list[Path], work: Path) -> Measurement:
    """One measurement, run inside the worker subprocess."""
    total = sum(f.stat().st_size for f in files)
    if job == "train_raw":
        started = time.perf_counter()
        tokenizer = Tokenizer(models.BPE(unk_token=DEFAULT_SPECIALS["unk"]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=BENCH_VOCAB_SIZE,
            min_frequency=BENCH_MIN_FREQUENCY,
            show_progress=False,
            special_tokens=list(DEFAULT_SPECIALS.values()),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tokenizer.train([str(f) for f in files], trainer)
        tokenizer.save(str(work / "raw-tokenizer.json"))
        return Measurement(job, time.perf_counter() - started, peak_rss_mb(), total)
    if job == "train_tfcli":
        started = time.perf_counter()
        config = TokenizerTrainingConfig(vocab_size=BENCH_VOCAB_SIZE, min_frequency=BENCH_MIN_FREQUENCY)
        train_tokenizer(resolve_corpus(files), work / "tfcli-tokenizer", config)
        return Measurement(job, time.perf_counter() - started, peak_rss_mb(), total)
    if job == "encode_raw":
        tokenizer = Tokenizer.from_file(str(work / "tfcli-tokenizer" / "tokenizer.json"))
        batches = []
        for f in files:  # read before the clock starts: the baseline times encode_batch alone
            lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
            batches.extend(lines[i : i + 8192] for i in range(0, len(lines), 8192))
        started = time.perf_counter()
        tokens = 0
        for batch in batches:
            tokens += sum(len(e.ids) for e in tokenizer.encode_batch(batch, add_special_tokens=False))
        return Measurement(job, time.perf_counter() - started, peak_rss_mb(), total, tokens)
    if job == "encode_tfcli":
        started = time.perf_counter()
        tokenizer = TextTokenizer.load(work / "tfcli-tokenizer" / "tokenizer.json")
        meta = encode_corpus(resolve_corpus(files), tokenizer, work / "shards", val_fraction=0.01)
        return Measurement(job, time.perf_counter() - started, peak_rss_mb(), total, meta.train_tokens + meta.val_tokens, meta.encoder)
    raise ValueError(f"unknown bench job {job}")


def _run_job(job: str, files: list[Path], work: Path) -> Measurement:
    return Measurement(**run_worker("tfcli.bench.tokenize", [job, str(work), *map(str, files)]))


def run_tokenize_bench(
    work: Path,
    corpus: list[str] | None = None,
    size_mb: float = 50.0,
    sample: Path | None = None,
    repeat: int = 3,
    progress=None,
) -> TokenizeBench:
    """Measure the four jobs (train raw, train tfcli, encode raw, encode tfcli) on one corpus.

    The jobs run interleaved, `repeat` rounds; each keeps its best time (the least disturbed by other
    work on the machine) and its worst peak RSS.
    """
    if repeat < 1:
        raise TfcliError(f"--repeat must be at least 1, not {repeat}")
    work.mkdir(parents=True, exist_ok=True)
    synthesized = corpus is None
    if corpus is None:
        if sample is None:
            raise TfcliError("no corpus and no sample data to synthesize one from", hint="pass --corpus or --data")
        files = synthesize_corpus(sample, work / "corpus", size_mb)
    else:
        files = [f.path for f in resolve_corpus(corpus).files]
    results: dict[str, Measurement] = {}
    for round_number in range(1, repeat + 1):
        for job in ("train_raw", "train_tfcli", "encode_raw", "encode_tfcli"):
            if progress:
                progress(f"{job.replace('_', ' ')} (round {round_number} of {repeat})")
            measured = _run_job(job, files, work)
            keep_fastest(results, job, measured)
    description = f"synthesized from {sample}" if synthesized else ", ".join(map(str, corpus or []))
    return TokenizeBench(
        corpus=description,
        corpus_bytes=sum(f.stat().st_size for f in files),
        synthesized=synthesized,
        repeat=repeat,
        **results,
    )


if __name__ == "__main__":
    job_name, work_dir, *paths = sys.argv[1:]
    measured = _job(job_name, [Path(p) for p in paths], Path(work_dir))
    print(json.dumps(dataclasses.asdict(measured)))
