"""`tfcli bench`: speed on this machine, side by side with peers, as ratios measured in one run.

One module a command in this folder (tokenize.py, model.py, generate.py, train.py, lora.py, eval.py, serve.py,
word2vec.py, recipe.py, sae.py), each checking its options and rendering what its `tfcli.bench` module measured; what they share is
in common.py."""

from __future__ import annotations

from tfcli.cli.bench.eval import eval_
from tfcli.cli.bench.generate import generate
from tfcli.cli.bench.lora import lora
from tfcli.cli.bench.model import model
from tfcli.cli.bench.recipe import recipe
from tfcli.cli.bench.sae import sae
from tfcli.cli.bench.serve import serve
from tfcli.cli.bench.tokenize import tokenize
from tfcli.cli.bench.train import train
from tfcli.cli.bench.word2vec import word2vec
from tfcli.cli.common import Typer

app = Typer(
    help="Measure tfcli's speed beside its peers (ratios from one run, on this machine).\n\n\b\nExample: tfcli bench tokenize --size-mb 10 --repeat 1",
    no_args_is_help=True,
    rich_markup_mode=None,
)

app.command("tokenize")(tokenize)
app.command("model")(model)
app.command("generate")(generate)
app.command("train")(train)
app.command("lora")(lora)
app.command("word2vec")(word2vec)
app.command("eval")(eval_)
app.command("serve")(serve)
app.command("recipe")(recipe)
app.command("sae")(sae)
