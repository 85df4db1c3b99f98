"""What a training run shows while it runs: a live bar on a terminal, a line per record otherwise, then the summary.
Renders the events tfcli.train.loop yields; under torchrun only rank 0 speaks."""

from __future__ import annotations

import os
from typing import Any

from tfcli.cli.common import counted, print_json, stderr_console, stdout_console


def render_training(job, json_output: bool) -> None:
    """Run the job's training loop and render its events."""
    from tfcli.runtime import keep_freed_memory
    from tfcli.train.loop import train

    keep_freed_memory()  # for this process: a training step's large blocks are reused, not mapped afresh
    is_main = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 speaks
    view = _TrainingView(stderr_console(), live=is_main)
    with view.progress:
        for event in train(job):
            if is_main:
                view.show(event)
    if view.finished is not None and is_main:
        _print_summary(view.finished, json_output)


class _TrainingView:
    """The live bar (on a terminal) and the lines printed on stderr, event by event."""

    def __init__(self, console, *, live: bool) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.live = console.is_terminal and live
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            console=console,
            disable=not self.live,
        )
        self.task_id = None
        self.status: dict[str, str] = {"loss": "loss --"}
        self.finished = None
        self.printed_step = None

    def show(self, event) -> None:
        from rich.text import Text

        from tfcli.train.events import Finished, Logged, Note, Saved, Started, StepDone

        if isinstance(event, Started):
            self._started(event)
        elif isinstance(event, StepDone):
            self._step_done(event)
        elif isinstance(event, Logged):
            self._logged(event.record)
        elif isinstance(event, Saved):
            self.console.print(Text(f"saved {'best ' if event.best else ''}checkpoint at step {event.step} in {event.path}", style="dim"), soft_wrap=True)
        elif isinstance(event, Note):
            self.console.print(Text(f"note: {event.message}", style="yellow"), soft_wrap=True)
        elif isinstance(event, Finished):
            self.finished = event

    def _started(self, event) -> None:
        from rich.text import Text

        what = counted(event.max_steps, "step") if event.max_steps else f"{event.time_budget:.0f} s budget"
        self.console.print(
            Text(
                f"training {event.parameters:,} parameters ({event.trainable:,} trainable, {event.trainable / max(event.parameters, 1):.2%}) on {event.device} "
                f"{event.precision}, {counted(event.world_size, 'process', 'processes')}, {event.tokens_per_step:,} tokens per step, {what}"
                + (f", from step {event.step}" if event.step else "")
                + (f"; MFU against the fastest {event.precision} matmul timed on this machine" if event.peak_flops else ""),
                style="dim",
            ),
            soft_wrap=True,
        )
        self.task_id = self.progress.add_task("step", total=1.0, status="", eta="--")

    def _step_done(self, event) -> None:
        status = self.status
        status.update(lr=f"lr {event.lr:.2e}", rate=f"{event.tokens_per_sec:,.0f} tok/s")
        if event.mfu:  # word2vec has no matrix products to count
            status["mfu"] = f"MFU {event.mfu:.1%}"
        eta = f"{event.remaining / 60:.1f} min" if event.remaining is not None else "--"
        self.progress.update(
            self.task_id,
            completed=event.fraction,
            description=f"step {event.step:,}",
            status="  ".join(status[k] for k in ("loss", "lr", "rate", "mfu") if k in status),
            eta=eta,
        )

    def _logged(self, record: dict[str, Any]) -> None:
        from rich.text import Text

        if isinstance(record.get("loss"), float):
            self.status["loss"] = f"loss {record['loss']:.4f}"
        if record["step"] == self.printed_step:  # the final validation joined a step already shown: show what it adds
            record = {k: v for k, v in record.items() if k == "step" or k.startswith("val_")}
        if not self.live or any(k.startswith("val_") for k in record):
            self.console.print(Text(describe_record(record)), soft_wrap=True)
            self.printed_step = record["step"]


def _print_summary(finished, json_output: bool) -> None:
    from rich.text import Text

    summary = {
        "run": str(finished.run_dir),
        "step": finished.step,
        "stopped_by": finished.reason,
        "why": finished.why,
        "best_val_loss": finished.best_val_loss,
        "elapsed_seconds": round(finished.elapsed, 3),
        "last": finished.last,
        "loss_plot": str(finished.plot) if finished.plot else None,
    }
    if json_output:
        print_json(summary)
        return
    out = stdout_console()
    if finished.reason == "early_stop":
        out.print(Text(f"stopped early: {finished.why}"), soft_wrap=True)
    out.print(Text(f"done: {describe_record(finished.last)}", style="bold"), soft_wrap=True)
    out.print(
        Text(
            f"run directory {finished.run_dir}"
            + (f", loss curve {finished.plot}" if finished.plot else "")
            + (f", best checkpoint {finished.run_dir / 'best'}" if finished.best_val_loss is not None else "")
        ),
        soft_wrap=True,
    )


def describe_record(record: dict[str, Any]) -> str:
    """One metrics record as a line. Example: {"step": 10, "loss": 2.5} -> "step     10  loss 2.5000"."""
    parts = [f"step {record['step']:>6}"]
    for key, fmt in (
        ("loss", "loss {:.4f}"),
        ("val_loss", "val {:.4f}"),
        ("val_bpb", "bpb {:.3f}"),
        ("val_accuracy", "acc {:.3f}"),
        ("val_macro_f1", "F1 {:.3f}"),
        ("lr", "lr {:.2e}"),
        ("tokens_per_sec", "{:,.0f} tok/s"),
        ("mfu", "MFU {:.1%}"),
    ):
        if isinstance(record.get(key), (int, float)):
            parts.append(fmt.format(record[key]))
    return "  ".join(parts)
