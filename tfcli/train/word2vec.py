"""`train pretrain --objective word2vec`: the job (vectors, settings, shards, tokenizer) and the trainer the one
training loop (`loop.py`) drives, with the same events, metrics.jsonl, checkpoints, --resume and --time-budget
as a transformer's. The arithmetic is the C kernel's (`tfcli.word2vec.kernel`); here the corpus is cut into
steps and each step's span into one piece per thread.

A step is `step_tokens` tokens of train.bin (epochs of it laid end to end); special tokens and the end of an
epoch end a sentence, so no window crosses a document. Every random draw of step s, thread t derives from
(seed, s, t): one thread resumes exactly; several interleave their updates (Hogwild) as gensim's workers do.
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tfcli.data.shards import load_shard_meta, open_shard
from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind, describe_write_error
from tfcli.tokenizer.core import TextTokenizer
from tfcli.train.data import derived_seed
from tfcli.train.distributed import World
from tfcli.train.events import Finished, Logged, Note, Saved, Started, StepDone
from tfcli.train.fingerprint import shard_fingerprint
from tfcli.train.job import find_tokenizer
from tfcli.train.run_checks import check_output
from tfcli.train.state import (
    METRICS_FILE,
    TRAINER_FORMAT,
    MetricsWriter,
    TrainerState,
    commit_trainer_state,
    find_trainer_state,
    stage_trainer_state,
    truncate_metrics,
)
from tfcli.word2vec.config import RESUMABLE_CHANGES, Word2VecConfig, Word2VecRecord, Word2VecTraining
from tfcli.word2vec.kernel import train_span, train_span_function
from tfcli.word2vec.run import COUNTS, INPUT, OUTPUT, load_vectors, read_vectors_config, save_vectors
from tfcli.word2vec.vocab import count_tokens, initial_vectors, keep_thresholds, noise_table


@dataclasses.dataclass(frozen=True)
class Word2VecJob:
    run_dir: Path
    vectors: Word2VecConfig
    config: Word2VecTraining
    tokenizer: TextTokenizer
    data: Path
    resume: bool = False
    data_fingerprint: str = ""
    notes: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        """What the loss curve's title says the run is."""
        return f"word2vec, {self.vectors.algorithm}"

    def training_record(self, step: int, words: int) -> Word2VecRecord:
        return Word2VecRecord(self.config, "word2vec", str(self.data), step, words)


def word2vec_job(*, data: Path, output: Path, vectors: dict[str, Any], settings: dict[str, Any], tokenizer_path: Path | None, resume: bool) -> Word2VecJob:
    """The job from the command line's values (None: the default), checked before anything is written."""
    _refuse_other_artifacts(Path(data))
    meta = load_shard_meta(data)
    tokenizer = find_tokenizer(data, tokenizer_path)
    if meta.vocab_size != tokenizer.vocab_size:
        raise TfcliError(f"the shards hold ids for {meta.vocab_size:,} tokens but the tokenizer has {tokenizer.vocab_size:,}")
    config = Word2VecConfig(vocab_size=tokenizer.vocab_size, **{k: v for k, v in vectors.items() if v is not None})
    training = Word2VecTraining(**{k: v for k, v in settings.items() if v is not None})
    if meta.train_tokens < 2:
        raise TfcliError(f"{data}/train.bin holds {meta.train_tokens} tokens; word2vec needs text to learn from", hint="encode a larger corpus")
    job = Word2VecJob(Path(output), config, training, tokenizer, Path(data), resume, shard_fingerprint(data))
    check_output(job.run_dir, resume)
    if resume:
        _check_resumed(job)
    return job


def _refuse_other_artifacts(data: Path) -> None:
    """--data at a run directory, a tokenizer or a shard folder's own file: named for what it is."""
    kind = artifact_kind(data) if data.exists() else None
    if kind is None or kind == "a token-shard folder":
        return
    where = f"the folder {data.parent}" if kind.endswith("of a token-shard folder") else "a folder of token shards, as `tfcli tokenize encode` writes"
    raise TfcliError(f"{data} is {kind}, not a folder of token shards", hint=f"pass {where}")


def _check_resumed(job: Word2VecJob) -> None:
    saved = read_vectors_config(job.run_dir)
    before, now = saved.word2vec.to_json(), job.vectors.to_json()
    for key in before:
        if before[key] != now[key]:
            raise TfcliError(f"cannot resume: word2vec {key} was {before[key]!r}, now {now[key]!r}", hint="resume with the settings the run was started with")
    if saved.training is not None:
        before, now = saved.training.config.to_json(), job.config.to_json()
        for key in before:
            if key not in RESUMABLE_CHANGES and before[key] != now[key]:
                raise TfcliError(
                    f"cannot resume: the training setting {key} was {before[key]!r}, now {now[key]!r}",
                    hint=f"only {', '.join(RESUMABLE_CHANGES)} may change on --resume",
                )


class Word2VecTrainer:
    """The loop's trainer for a word2vec job (the same methods as `trainer.Trainer`)."""

    def __init__(self, job: Word2VecJob, world: World) -> None:
        if world.enabled:
            raise TfcliError("word2vec trains in one process (its threads share the tables)", hint="run it without torchrun; --threads sets the threads")
        train_span_function()  # built now: a missing compiler is said before anything is written
        self.job, self.world, cfg, vectors = job, world, job.config, job.vectors
        self.cfg = cfg
        self.corpus = open_shard(job.data, "train")
        self.counts = count_tokens(self.corpus, vectors.vocab_size)
        self.is_break = np.zeros(vectors.vocab_size, dtype=bool)
        self.is_break[list(job.tokenizer.special_ids.values())] = True
        self.counts[self.is_break] = 0  # special tokens end sentences; they are never words
        self.keep = keep_thresholds(self.counts, vectors.subsample)
        self.noise = noise_table(self.counts, vectors.ns_exponent)
        self.total_tokens = cfg.epochs * len(self.corpus)
        self.max_steps = math.ceil(self.total_tokens / cfg.step_tokens)
        self.start_step, self.tokens_seen, self.elapsed_before = 0, 0, 0.0
        self.window_loss, self.window_count, self.window_kept = 0.0, 0, 0
        if job.resume:
            loaded = load_vectors(job.run_dir)
            self.input_vectors, self.output_vectors = loaded.input_vectors, loaded.output_vectors
            self._resume_state()
        else:
            self.input_vectors, self.output_vectors = initial_vectors(vectors.vocab_size, vectors.dim, derived_seed(cfg.seed, "word2vec-init"))
        self.pool = ThreadPoolExecutor(cfg.threads, thread_name_prefix="word2vec")
        self.metrics_path = job.run_dir / METRICS_FILE
        if job.resume:
            truncate_metrics(self.metrics_path, self.start_step)
        elif self.metrics_path.exists():
            self.metrics_path.unlink()
        self.writer = MetricsWriter(self.metrics_path)
        self.step = self.start_step
        self.lr = cfg.lr
        self.elapsed = self.elapsed_before
        self.last_record: dict[str, Any] = {}
        self.logged_step = self.saved_step = -1
        self.window_start = self.run_start = time.perf_counter()
        self.window_tokens = 0

    def _resume_state(self) -> None:
        job = self.job
        _, saved = find_trainer_state(job.run_dir, weights=job.run_dir / "model.safetensors")
        if saved.data_fingerprint != job.data_fingerprint:
            raise TfcliError(f"cannot resume: {job.data} is not the data the run was trained on (its contents differ)")
        if saved.tokenizer_sha256 != job.tokenizer.sha256:
            raise TfcliError("cannot resume: the tokenizer is not the one the run was trained with")
        self.start_step, self.tokens_seen, self.elapsed_before = saved.step, saved.tokens_seen, saved.elapsed_seconds
        self.window_loss, self.window_count = saved.window_loss, saved.window_count

    # ---- what the loop sees -------------------------------------------------------------------------

    def started(self) -> Started:
        cfg, v = self.cfg, self.job.vectors
        parameters = 2 * v.vocab_size * v.dim
        budget = cfg.time_budget
        return Started(
            self.start_step, None if budget else self.max_steps, budget, parameters, parameters, "cpu", "fp32", 1, cfg.step_tokens, 0.0, self.job.run_dir
        )

    def notes_at_start(self):
        cfg, v = self.cfg, self.job.vectors
        seen = int((self.counts > 0).sum())
        yield Note(
            f"word2vec {v.algorithm}: {len(self.corpus):,} tokens a pass, {seen:,} distinct words, dim {v.dim}, window {v.window}, "
            f"{v.negatives} negatives, {cfg.threads} thread{'s' if cfg.threads > 1 else ''}"
        )
        if cfg.time_budget is None and self.start_step >= self.max_steps:
            yield Note(f"the run is already at step {self.start_step} of {self.max_steps}; raise --epochs to train further")
        yield from (Note(note) for note in self.job.notes)

    def begin(self) -> None:
        self.window_start = self.run_start = time.perf_counter()

    def stop_reason(self, signal_received: bool) -> str | None:
        self.elapsed = self.elapsed_before + time.perf_counter() - self.run_start
        if signal_received:
            return "interrupted"
        if self.cfg.time_budget is None and self.step >= self.max_steps:
            return "steps"
        if self.cfg.time_budget is not None and self.elapsed >= self.cfg.time_budget:
            return "budget"
        return None

    # ---- one step -----------------------------------------------------------------------------------

    def _alpha(self, fraction: float) -> float:
        """gensim's linear decay: lr at the start, min_lr at the end."""
        cfg = self.cfg
        return cfg.lr - (cfg.lr - cfg.min_lr) * min(max(fraction, 0.0), 1.0)

    def _span(self, start: int, end: int) -> np.ndarray:
        """Tokens [start, end) of the epochs laid end to end, as int32 ids with -1 where a sentence ends."""
        n = len(self.corpus)
        pieces = []
        position = start
        while position < end:
            offset = position % n
            take = min(end - position, n - offset)
            ids = np.asarray(self.corpus[offset : offset + take], dtype=np.int32)
            pieces.append(np.where(self.is_break[ids], -1, ids).astype(np.int32))
            if offset + take == n:
                pieces.append(np.array([-1], dtype=np.int32))  # an epoch ends a sentence
            position += take
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)

    def step_once(self):
        cfg, v = self.cfg, self.job.vectors
        start = self.step * cfg.step_tokens
        end = start + cfg.step_tokens if cfg.time_budget is not None else min(start + cfg.step_tokens, self.total_tokens)
        tokens = self._span(start, end)
        bounds = np.linspace(0, len(tokens), cfg.threads + 1).astype(np.int64)
        if cfg.time_budget is not None:
            fraction = self.elapsed / cfg.time_budget
            alphas = [(self._alpha(fraction), self._alpha(fraction))] * cfg.threads
        else:
            scale = (end - start) / max(len(tokens), 1)
            alphas = [
                (self._alpha((start + a * scale) / self.total_tokens), self._alpha((start + b * scale) / self.total_tokens)) for a, b in zip(bounds, bounds[1:])
            ]
        self.lr = alphas[0][0]

        def work(t: int) -> tuple[float, int, int]:
            return train_span(
                tokens[bounds[t] : bounds[t + 1]],
                self.input_vectors,
                self.output_vectors,
                self.keep,
                self.noise,
                skipgram=v.algorithm == "skipgram",
                window=v.window,
                negatives=v.negatives,
                alpha_start=alphas[t][0],
                alpha_end=alphas[t][1],
                seed=derived_seed(cfg.seed, "word2vec", self.step, t),
            )

        for loss, kept, examples in self.pool.map(work, range(cfg.threads)):
            self.window_loss += loss
            self.window_count += examples
            self.window_kept += kept
        if not math.isfinite(self.window_loss):
            raise TfcliError(f"step {self.step + 1}: the loss is not finite", hint="lower --lr")
        self.step += 1
        self.tokens_seen += end - start
        self.window_tokens += end - start
        self.elapsed = self.elapsed_before + time.perf_counter() - self.run_start
        return iter(())

    def after_step(self):
        if self.step % self.cfg.log_every == 0:
            yield self._log()
        if self.cfg.save_every and self.step % self.cfg.save_every == 0:
            yield self._save()
        yield self._progress()

    def finish(self, reason: str):
        if self.step > self.start_step and reason != "interrupted" and self.logged_step != self.step:
            yield self._log()
        if self.saved_step != self.step and (self.step > self.start_step or not self.job.resume):
            yield self._save()

    def close(self) -> None:
        self.writer.close()
        self.pool.shutdown()

    def finished(self, reason: str, plot) -> Finished:
        return Finished(self.step, reason, self.job.run_dir, None, self.last_record or {"step": self.step}, self.elapsed, plot)

    # ---- logging and saving -------------------------------------------------------------------------

    def _log(self) -> Logged:
        now = time.perf_counter()
        record: dict[str, Any] = {"step": self.step}
        if self.window_count:
            record["loss"] = self.window_loss / self.window_count
        record.update(
            {
                "lr": self.lr,
                "tokens": self.tokens_seen,
                "tokens_per_sec": round(self.window_tokens / max(now - self.window_start, 1e-9), 4),
                "words_kept": self.window_kept,  # after subsampling, this window
                "elapsed": round(self.elapsed, 4),
            }
        )
        self.writer.write(record)
        self.last_record = record
        self.window_loss, self.window_count, self.window_kept, self.window_tokens = 0.0, 0, 0, 0
        self.window_start, self.logged_step = now, self.step
        return Logged(record)

    def _save(self) -> Saved:
        job = self.job
        state = TrainerState(
            TRAINER_FORMAT,
            self.step,
            self.tokens_seen,
            self.elapsed,
            1,
            job.data_fingerprint,
            job.tokenizer.sha256,
            window_loss=self.window_loss,
            window_count=self.window_count,
        )
        tables = {INPUT: self.input_vectors, OUTPUT: self.output_vectors, COUNTS: self.counts.astype(np.float64)}
        try:
            save_vectors(
                job.run_dir,
                job.vectors,
                job.tokenizer,
                tables,
                job.training_record(self.step, self.tokens_seen),
                before_commit=lambda weights: stage_trainer_state(job.run_dir, state, {}, weights),
                after_commit=lambda: commit_trainer_state(job.run_dir),
            )
        except OSError as exc:
            raise TfcliError(
                f"cannot write the checkpoint in {job.run_dir}: {describe_write_error(exc)}", hint="free some space; the previous one is intact"
            ) from exc
        self.writer.sync()
        self.saved_step = self.step
        return Saved(self.step, job.run_dir, False)

    def _progress(self) -> StepDone:
        cfg = self.cfg
        if cfg.time_budget is None:
            done = self.step / self.max_steps
            remaining = (self.elapsed - self.elapsed_before) / max(self.step - self.start_step, 1) * (self.max_steps - self.step)
        else:
            done, remaining = min(self.elapsed / cfg.time_budget, 1.0), max(cfg.time_budget - self.elapsed, 0.0)
        rate = self.window_tokens / max(time.perf_counter() - self.window_start, 1e-9) if self.window_tokens else self.last_record.get("tokens_per_sec", 0.0)
        return StepDone(self.step, self.lr, self.tokens_seen, rate, 0.0, self.elapsed, remaining, done)
