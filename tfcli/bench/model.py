"""`tfcli bench model`: one training step (forward + backward) of a model shape, tfcli's Transformer beside
transformers' GPT2LMHeadModel of the same shape and dtype, each in its own process (time and peak RSS).

Before the timed rounds an untimed tfcli run lets tfcli.accel measure its choices for these shapes on this
machine (kept in its decisions file), as the first run of any command here does: the rounds then time what
every later run does, and the first run's extra time and memory stay out of the table."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import torch

from tfcli.bench.common import keep_fastest, peak_rss_mb, run_worker
from tfcli.hf import gpt2_config
from tfcli.loader import prepare
from tfcli.model.config import preset
from tfcli.model.transformer import Loss, Transformer
from tfcli.runtime import keep_freed_memory


@dataclasses.dataclass
class StepMeasurement:
    implementation: str
    seconds_per_step: float
    peak_rss_mb: float
    parameters: int
    loss: float

    @property
    def seconds(self) -> float:
        return self.seconds_per_step


def _step_job(implementation: str, preset_name: str, batch: int, length: int, steps: int, threads: int) -> StepMeasurement:
    keep_freed_memory()  # what `tfcli train` does on CPU; both sides get it, so the models are compared alone
    torch.manual_seed(0)
    if threads:
        torch.set_num_threads(threads)
    config = preset(preset_name)
    ids = torch.randint(0, config.vocab_size, (batch, length + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    if implementation == "tfcli":
        model = prepare(Transformer(config), "train")  # as `tfcli train` runs it: measured on the first step

        def step() -> torch.Tensor:
            return model(inputs, head=Loss(targets)).loss / targets.numel()  # the mean, as transformers reports it
    else:
        import transformers

        hf_config = transformers.GPT2Config(**{k: v for k, v in gpt2_config(config, 0).items() if k not in ("architectures", "model_type")})
        model = transformers.GPT2LMHeadModel(hf_config).train()

        def step() -> torch.Tensor:
            return model(inputs, labels=inputs).loss  # transformers shifts the labels itself

    parameters = sum(p.numel() for p in model.parameters())
    times = []
    loss = 0.0
    for i in range(steps + 1):  # the first step warms up allocators and kernels; it is not counted
        started = time.perf_counter()
        out = step()
        out.backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - started)
        loss = out.item()
    return StepMeasurement(implementation, min(times), peak_rss_mb(), parameters, loss)


def run_model_bench(
    preset_name: str = "gpt2-small", batch: int = 4, length: int = 256, steps: int = 3, threads: int = 0, repeat: int = 1, first_run: bool = True
) -> list[StepMeasurement]:
    """Both implementations, `repeat` interleaved rounds, each job's fastest round kept (after the untimed
    first run unless `first_run` is False)."""
    results: dict[str, StepMeasurement] = {}
    if first_run:  # untimed: tfcli measures its choices for this shape here once, as any first run on a machine does
        run_worker("tfcli.bench.model", ["tfcli", preset_name, str(batch), str(length), "1", str(threads)])
    for _ in range(repeat):
        for implementation in ("tfcli", "transformers"):
            args = [implementation, preset_name, str(batch), str(length), str(steps), str(threads)]
            keep_fastest(results, implementation, StepMeasurement(**run_worker("tfcli.bench.model", args)))
    return [results["tfcli"], results["transformers"]]


if __name__ == "__main__":
    name, preset_arg, batch_arg, length_arg, steps_arg, threads_arg = sys.argv[1:]
    measured = _step_job(name, preset_arg, int(batch_arg), int(length_arg), int(steps_arg), int(threads_arg))
    print(json.dumps(dataclasses.asdict(measured)))
