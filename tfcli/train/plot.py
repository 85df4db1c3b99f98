"""The loss curve of a run (train and validation loss against the step), as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcli.fsutil import atomic_open


def plot_loss_curve(records: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Draw train and validation loss from metrics records; False when there is nothing to draw."""
    train = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), (int, float))]
    val = [(r["step"], r["val_loss"]) for r in records if isinstance(r.get("val_loss"), (int, float))]
    if not train and not val:
        return False
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 4), dpi=120)
    ax = figure.add_subplot()
    if train:
        ax.plot(*zip(*train), label="train", color="#4477aa", linewidth=1.2)
    if val:
        ax.plot(*zip(*val), label="validation", color="#ee6677", marker="o", markersize=3, linewidth=1.2)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.set_ylabel("loss (nats per target)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    figure.tight_layout()
    with atomic_open(path, "wb") as handle:
        figure.savefig(handle, format="png")
    return True
