"""`tfcli bench eval`: the log-likelihood requests the harness makes for one task on a run, scored by tfcli's
model class (the shared scorer: a context's forward shared by its choices) and by the harness's own `hf` model
on the same run exported to a Hugging Face folder, each in its own process with the same thread count: CPU
seconds and requests per CPU second of both, and the ratio (target: tfcli >= 2x).

A few requests are scored untimed first in each process (tfcli.accel measures its choices then; transformers
builds its kernels), so the clock times what the rest of an evaluation does."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from tfcli.bench.common import keep_fastest, peak_rss_mb, run_worker
from tfcli.errors import TfcliError
from tfcli.hf.convert import export_hf
from tfcli.rundir import read_run_config

WARMUP_REQUESTS = 8


@dataclasses.dataclass
class EvalMeasurement:
    model: str  # tfcli | hf
    requests: int
    tokens: int  # context + continuation tokens of the requests, as each model cut them
    cpu_seconds: float  # the process's CPU time (all its threads) while scoring: steady on a busy machine
    wall_seconds: float
    peak_rss_mb: float

    @property
    def seconds(self) -> float:
        return self.cpu_seconds

    @property
    def requests_per_cpu_second(self) -> float:
        return self.requests / self.cpu_seconds


@dataclasses.dataclass
class EvalBench:
    task: str
    limit: int
    batch_size: int
    threads: int
    tfcli: EvalMeasurement
    hf: EvalMeasurement

    @property
    def speedup(self) -> float:
        """tfcli's requests per CPU second over the hf model's."""
        return self.hf.cpu_seconds / self.tfcli.cpu_seconds


def task_requests(task_name: str, limit: int) -> list:
    """The harness's loglikelihood Instances for the first `limit` documents of a task (0-shot)."""
    from tfcli.harness.sandbox import sandboxed_templates  # noqa: PLC0415  the eval extra
    from tfcli.harness.tasks import check_tasks, go_offline, load_tasks, task_manager  # noqa: PLC0415  the eval extra

    go_offline()
    manager = task_manager([task_name], ())
    (task,) = load_tasks(manager, [task_name], limit=limit, num_fewshot=0)  # the first rows only, as eval --limit reads them
    if isinstance(task, str):
        raise TfcliError(f"{task_name} is a group of tasks", hint="bench one task, e.g. tfcli_story_choice")
    if task.OUTPUT_TYPE not in ("loglikelihood", "multiple_choice"):
        raise TfcliError(f"task {task_name} generates text; bench eval times log-likelihood scoring", hint="use tfcli_story_choice or tfcli_last_word")
    task.set_config(key="num_fewshot", value=0)
    check_tasks([task], 0, limit)
    with sandboxed_templates():  # the prompts are rendered here, as eval --tasks renders them
        task.build_all_requests(limit=limit, rank=0, world_size=1)
    return list(task.instances)


def run_eval_bench(run: Path, task: str, limit: int, batch_size: int, threads: int, repeat: int, folder: Path) -> EvalBench:
    """Export the run to folder/hf, then time both models `repeat` times, interleaved; the fastest of each kept."""
    config = read_run_config(run)
    if config.model.arch != "decoder":
        raise TfcliError(f"{run} is an {config.model.arch}; bench eval scores a decoder", hint="bench a language model run")
    if config.adapter is not None:
        raise TfcliError(f"{run} is a LoRA run", hint=f"bench the merged model: tfcli export {run} --merge -o MERGED, then tfcli bench eval MERGED")
    hf_folder = folder / "hf"
    if not hf_folder.exists():
        export_hf(run, hf_folder)
    task_requests(task, limit)  # a bad task is one line here, not a worker's traceback
    best: dict = {}
    for _ in range(repeat):
        for model in ("tfcli", "hf"):
            measured = run_worker("tfcli.bench.eval", [model, str(run), str(hf_folder), task, str(limit), str(batch_size), str(threads)])
            keep_fastest(best, model, EvalMeasurement(**measured))
    return EvalBench(task, limit, batch_size, threads, best["tfcli"], best["hf"])


def _worker(model: str, run: str, hf_folder: str, task: str, limit: int, batch_size: int, threads: int) -> dict:
    requests = task_requests(task, limit)
    if model == "tfcli":
        from tfcli.harness.model import TfcliLM  # noqa: PLC0415  the eval extra

        lm = TfcliLM(run, batch_size=batch_size, device="cpu")
    else:
        from lm_eval.models.huggingface import HFLM

        lm = HFLM(pretrained=hf_folder, device="cpu", dtype="float32", batch_size=batch_size)
    torch.set_num_threads(threads)  # after loading: tfcli's loader picks one thread for a small model
    lm.loglikelihood(requests[:WARMUP_REQUESTS], disable_tqdm=True)
    tokens = sum(len(c) + len(x) for c, x in (lm._encode_pair(*r.args) for r in requests))
    cpu, wall = time.process_time(), time.perf_counter()
    lm.loglikelihood(requests, disable_tqdm=True)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return dataclasses.asdict(EvalMeasurement(model, len(requests), tokens, cpu, wall, peak_rss_mb()))


if __name__ == "__main__":
    model, run, hf_folder, task, limit, batch_size, threads = sys.argv[1:]
    print(json.dumps(_worker(model, run, hf_folder, task, int(limit), int(batch_size), int(threads))))
