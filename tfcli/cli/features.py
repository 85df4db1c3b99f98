"""`tfcli inspect-features`: what an SAE's features respond to (tfcli.inspect.feature_views); torch is imported
inside the command body."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.circuits import _emit, _format, _text
from tfcli.cli.options import InspectFormat, InspectOutput, InspectText, InspectTextFile, JsonFlag, Run

SaeFolder = Annotated[Path, typer.Option("--sae", help="An SAE folder (tfcli's or SAELens's) trained on this run's hook point.", show_default=False)]


def inspect_features(
    run: Run,
    sae: SaeFolder,
    feature: Annotated[
        Optional[int], typer.Option("--feature", help="One feature: its top contexts, histogram, density and logit effects.", show_default=False)
    ] = None,
    top: Annotated[int, typer.Option("--top", help="With --feature: contexts and logit tokens shown; else: the N most active features.")] = 10,
    text: InspectText = None,
    text_file: InspectTextFile = None,
    data: Annotated[
        Optional[Path], typer.Option("--data", help="A shard folder (its val split) or a text file to read windows from.", show_default=False)
    ] = None,
    windows: Annotated[int, typer.Option("--windows", help="Windows of --data read, side by side, never overlapping (fewer where --data holds fewer).")] = 64,
    context: Annotated[int, typer.Option("--context", help="Tokens per window (at most the model's block size).")] = 128,
    output_format: InspectFormat = None,
    output: InspectOutput = None,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N or mps.")] = "cpu",
    json_output: JsonFlag = False,
) -> None:
    """What an SAE's features respond to: --feature F (its top-activating contexts, tokens shaded by the
    activation, a histogram, its density and the tokens its decoder direction promotes and suppresses),
    the --top N most active features on --data, or --text "..." (the features on each token, strongest first).
    Terminal, --json, or a self-contained page with -o FILE.html.

    \b
    Example: tfcli inspect-features runs/quickstart/model --sae runs/sae --feature 3 --data runs/quickstart/shards
    """
    from tfcli.errors import TfcliError
    from tfcli.inspect import feature_views as f

    began = time.perf_counter()
    fmt = _format(output_format, output, json_output)
    if fmt == "png":
        raise TfcliError("inspect-features writes terminal, json and html", hint="pass -o FILE.html or --json")
    given_text = text is not None or text_file is not None
    if given_text and (feature is not None or data is not None):
        raise TfcliError(
            "--text shows the features on each token of one text; --feature and --data go without it", hint="pass --text, or --data with or without --feature"
        )
    if not given_text and data is None:
        raise TfcliError("pass --data (for --feature F or the --top features) or --text", hint='tfcli inspect-features RUN --sae SAE --text "..."')
    if top < 1 or windows < 1 or context < 1:
        raise TfcliError("--top, --windows and --context must be at least 1")
    session = f.FeatureSession(run, sae, device)
    if given_text:
        result = f.text_features(session, _text(text, text_file), top=min(top, 10))
        views, page = (lambda width: [f.text_table(result)]), (lambda: f.text_html(result))
    elif feature is not None:
        result = f.feature_report(session, data, feature, top=top, windows=windows, context=context)
        views, page = (lambda width: f.report_renderables(result)), (lambda: f.report_html(result))
    else:
        result = f.top_features(session, data, top=top, windows=windows, context=context)
        views, page = (lambda width: [f.top_table(result)]), (lambda: f.top_html(result))
    _emit(fmt, output, result.to_json(), views, time.perf_counter() - began, None, page)
