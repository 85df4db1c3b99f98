"""`tfcli train sae`: parse, call tfcli.train.sae, print its progress lines (no torch at import)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.options import DecoderRun, JsonFlag

Hook = Annotated[
    str,
    typer.Option(
        "--hook",
        help="The hook point to read, TransformerLens's name: blocks.L.hook_resid_post, blocks.L.hook_mlp_out, blocks.L.attn.hook_z, ...",
        show_default=False,
    ),
]
SaeData = Annotated[
    Path, typer.Option("--data", help="A shard folder (its train split; val for CE loss recovered) or a text file (its last 10% held out).", show_default=False)
]


def train_sae(
    run: DecoderRun,
    hook: Hook,
    data: SaeData,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="The SAE folder to write [default: RUN/saes/HOOK].", show_default=False)] = None,
    arch: Annotated[str, typer.Option("--arch", help="topk, relu (SAELens's standard) or jumprelu.")] = "topk",
    width: Annotated[int, typer.Option("--width", help="Features (d_sae); 0: --expansion times the hook's width.")] = 0,
    expansion: Annotated[int, typer.Option("--expansion", help="Features per dimension of the hook, when --width is 0.")] = 8,
    k: Annotated[int, typer.Option("--k", help="topk: features kept per vector.")] = 32,
    lr: Annotated[float, typer.Option("--lr", help="Adam's learning rate (constant).")] = 4e-4,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Activation vectors per step.")] = 1024,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Activation vectors (tokens) to train on, in all.")] = 2_000_000,
    time_budget: Annotated[
        Optional[str], typer.Option("--time-budget", help="Stop after this long (90s, 3m, 1h) if --max-tokens is not reached first.", show_default=False)
    ] = None,
    context: Annotated[int, typer.Option("--context", help="Tokens per window the model reads (at most its block size - 1).")] = 128,
    buffer: Annotated[int, typer.Option("--buffer", help="Vectors in the shuffled activation buffer (its memory: buffer x width x 4 bytes).")] = 65_536,
    sparsity: Annotated[float, typer.Option("--sparsity", help="relu: the L1 coefficient; jumprelu: the L0 coefficient.")] = 1.0,
    dead_after: Annotated[int, typer.Option("--dead-after", help="Vectors without a firing before a feature counts as dead (and is revived).")] = 200_000,
    log_every: Annotated[int, typer.Option("--log-every", help="Steps between progress lines and metrics records.")] = 50,
    save_every: Annotated[int, typer.Option("--save-every", help="Steps between checkpoints (CE loss recovered measured at each); 0: only at the end.")] = 500,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the initial weights and the activations' order.")] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the SAE in -o from its checkpoint, with its own settings (--max-tokens and --time-budget may change).")
    ] = False,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N or mps.")] = "cpu",
    json_output: JsonFlag = False,
) -> None:
    """Train a sparse autoencoder on one hook point of a run: activations stream from the model into a
    shuffled buffer, the decoder's directions are kept unit norm, dead features are revived (AuxK for topk,
    resampling for relu and jumprelu). Saved in SAELens's layout (cfg.json, sae_weights.safetensors) with
    metrics.jsonl and an exact --resume.

    \b
    Example: tfcli train sae runs/quickstart/model --hook blocks.1.hook_resid_post --data runs/quickstart/shards -o runs/sae
    """
    from tfcli.train.command_line import parse_duration
    from tfcli.train.sae import SaeTrainSettings
    from tfcli.train.sae import train_sae as train

    budget = parse_duration(time_budget) if time_budget else 0.0
    settings = SaeTrainSettings(
        run=str(run), hook=hook, data=str(data), arch=arch, width=width, expansion=expansion, k=k, lr=lr, batch_size=batch_size, max_tokens=max_tokens,
        time_budget=budget, context=context, buffer=buffer, sparsity=sparsity, dead_after=dead_after, log_every=log_every, save_every=save_every,
        seed=seed, device=device,
    )  # fmt: skip
    out = output if output is not None else Path(run) / "saes" / hook.removeprefix("decoder.")
    _render(train(settings, out, resume=resume), json_output)


def _render(events, json_output: bool) -> None:
    """The trainer's events as progress lines, or with --json the final record only."""
    from tfcli.cli.common import print_json, stdout_console

    last = {}
    for event in events:
        r = event.record
        if json_output:
            last = r if event.kind == "done" else last
            continue
        if event.kind == "start":
            what = "resuming at step {step}".format(**r) if r["resumed"] else "training"
            stdout_console().print(
                f"{what}: {r['arch']} SAE, {r['d_sae']} features on {r['hook']} (width {r['d_in']}, inputs scaled by {r['scale']:g})",
                markup=False,
                highlight=False,
            )
        elif event.kind == "log":
            stdout_console().print(
                f"step {r['step']:>6}  tokens {r['tokens']:>9,}  mse {r['mse']:.4g}  L0 {r['l0']:.1f}  explained variance {r['explained_variance']:.3f}  "
                f"dead {r['dead_fraction']:.1%}  dense {r['dense_fraction']:.1%}",
                markup=False,
                highlight=False,
            )
        elif event.kind == "saved":
            stdout_console().print(f"saved at step {r['step']}: CE loss recovered {r['ce_loss_recovered']:.3f}", markup=False, highlight=False)
        else:
            stdout_console().print(
                f"done: CE loss recovered {r['ce_loss_recovered']:.3f} (clean {r['ce_loss_clean']:.3f}, spliced {r['ce_loss_spliced']:.3f}, "
                f"zero-ablated {r['ce_loss_zero']:.3f}), {r['dead_fraction']:.1%} dead; saved to {r['output']}",
                markup=False,
                highlight=False,
            )
    if json_output:
        print_json(last)


SaeOption = Annotated[
    Optional[Path],
    typer.Option(
        "--sae", help="An SAE folder (tfcli's or SAELens's): its L0, explained variance, dead features and CE loss recovered on --data.", show_default=False
    ),
]


def evaluate_sae_command(runs: list[Path], sae: Path, data: Path | None, tasks: str | None, device: str, json_output: bool) -> None:
    """`tfcli eval RUN --sae SAE --data DATA`: the SAE's metrics on the data's held-out windows."""
    from rich.table import Table

    from tfcli.cli.common import print_json, print_table, stdout_console
    from tfcli.errors import TfcliError
    from tfcli.train.sae import evaluate_sae

    if data is None or tasks is not None or len(runs) > 1:
        raise TfcliError("--sae goes with one run and --data", hint="tfcli eval RUN --sae SAE --data SHARDS|TEXT")
    result = evaluate_sae(runs[0], sae, data, device=device)
    if json_output:
        print_json(result)
        return
    table = Table(title=f"SAE {sae} on {result['hook']} ({result['d_sae']} features, {result['architecture']}), {result['tokens']:,} held-out tokens")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("L0 (features active per token)", f"{result['l0']:.2f}"),
        ("explained variance", f"{result['explained_variance']:.3f}"),
        ("MSE", f"{result['mse']:.4g}"),
        ("dead features (never fired here)", f"{result['dead_fraction']:.1%}"),
        ("dense features (on > 10% of tokens)", f"{result['dense_fraction']:.1%}"),
        ("CE loss: clean / spliced / zero-ablated", f"{result['ce_loss_clean']:.3f} / {result['ce_loss_spliced']:.3f} / {result['ce_loss_zero']:.3f}"),
        ("CE loss recovered", f"{result['ce_loss_recovered']:.3f}"),
    ]
    for row in rows:
        table.add_row(*row)
    print_table(stdout_console(), table)
