"""The options (and the run argument) that more than one command takes, each declared once: a command's signature
names the alias (`device: Device = "auto"`), so an option has one name, one type and one help text wherever it is
taken. The default stays in each signature: `tfcli inspect-embeddings` measures on the cpu by default, `tfcli
generate` wherever a GPU is. An option one command (or one command group's module) takes stays there."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

# every command

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout instead of a table.")]

# the run a command reads

RUN_HELP = "A run directory (config.json, model.safetensors, tokenizer.json)."
Run = Annotated[Path, typer.Argument(help=RUN_HELP, show_default=False)]
RunOrNone = Annotated[Optional[Path], typer.Argument(help=RUN_HELP, show_default=False)]
DecoderRun = Annotated[Path, typer.Argument(help="A decoder run directory (trained, fine-tuned, LoRA or imported).", show_default=False)]

# where and how a model runs

DEVICES = "auto (a GPU if there is one), cpu, cuda, cuda:N or mps"
PRECISIONS = "auto (bf16 on a GPU that has it, else fp32), fp32 or bf16"
Device = Annotated[str, typer.Option("--device", help=f"{DEVICES}.")]
Precision = Annotated[str, typer.Option("--precision", help=f"{PRECISIONS}.")]
# training: None is "not given", so a --config file or --set may set them
DeviceOrNone = Annotated[Optional[str], typer.Option("--device", help=f"{DEVICES} [default: auto].", show_default=False)]
PrecisionOrNone = Annotated[Optional[str], typer.Option("--precision", help=f"{PRECISIONS} [default: auto].", show_default=False)]
Threads = Annotated[
    int,
    typer.Option(
        "--threads", help="CPU threads for torch (0: one for models under 5M parameters, where waking threads costs more than it saves; else torch's default)."
    ),
]

# the text the inspect-* commands read, and what they write

InspectText = Annotated[Optional[str], typer.Option("--text", help="The text to look at (for an encoder-decoder: the source).", show_default=False)]
InspectTextFile = Annotated[Optional[Path], typer.Option("--text-file", help="Read the text from a UTF-8 file instead.", show_default=False)]
InspectTarget = Annotated[
    Optional[str], typer.Option("--target", help="Encoder-decoder only: the target text the decoder reads (after its start token).", show_default=False)
]
InspectFormat = Annotated[
    Optional[str], typer.Option("--format", "-f", help="terminal, html, png or json (default: from -o's suffix, else terminal).", show_default=False)
]
InspectOutput = Annotated[
    Optional[Path], typer.Option("--output", "-o", help="The file to write: .html, .png or .json (json prints to stdout without it).", show_default=False)
]
InspectStart = Annotated[int, typer.Option("--start", help="Terminal view of a long text: the first position shown.")]

# the benchmarks (tfcli bench ...)

REPEAT_HELP = "Rounds of every job, interleaved; each job keeps its best round"
Repeat = Annotated[int, typer.Option("--repeat", help=f"{REPEAT_HELP}.")]
Workdir = Annotated[Optional[Path], typer.Option("--workdir", help="Scratch folder (default: a temporary one, removed afterwards).", show_default=False)]
SampleData = Annotated[
    Optional[Path], typer.Option("--data", help="The sample data whose corpus/ the bench reads (default: ./sample_data).", show_default=False)
]
JobThreads = Annotated[int, typer.Option("--threads", help="torch threads in every timed process (0: each side's default).")]
FirstRun = Annotated[
    bool,
    typer.Option(
        "--first-run/--no-first-run",
        help="An untimed run first, in which tfcli measures its choices for these shapes on this machine (kept in its decisions file), "
        "so the rounds time what every later run does. --no-first-run leaves it out: where an earlier run measured them, or for a quick check.",
    ),
]
