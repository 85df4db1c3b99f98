"""`tfcli train pretrain`, `tfcli train finetune` and `tfcli train word2vec`: parse, build the job, render the loop's
events (cli/train_progress.py)."""

from __future__ import annotations

import inspect
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from tfcli.cli.common import Typer
from tfcli.cli.options import DeviceOrNone, JsonFlag, PrecisionOrNone
from tfcli.cli.sae import train_sae
from tfcli.cli.train_progress import render_training

if TYPE_CHECKING:
    from tfcli.train.command_line import RunOptions

app = Typer(
    help="Pretrain a model on token shards, fine-tune a run directory on a new task, or train word vectors.\n\n"
    "\b\nExample: tfcli train pretrain --data runs/quickstart/shards -o runs/tiny --preset tiny --max-steps 500",
    no_args_is_help=True,
    rich_markup_mode=None,
)

Output = Annotated[Path, typer.Option("--output", "-o", help="The run directory to write (or to continue with --resume).", show_default=False)]
ConfigFile = Annotated[
    Optional[Path], typer.Option("--config", help="A TOML file: [model] and [train] tables (or flat keys), and `preset`.", show_default=False)
]
Sets = Annotated[
    Optional[list[str]],
    typer.Option(
        "--set",
        help="Override one setting: --set d_model=128 --set train.weight_decay=0 (repeatable; fine-tuning keeps the model's shape, so there only dropout and training settings).",
        show_default=False,
    ),
]
MaxSteps = Annotated[Optional[int], typer.Option("--max-steps", help="Optimizer updates to run [default: 1000].", show_default=False)]
TimeBudget = Annotated[
    Optional[str], typer.Option("--time-budget", help="Train for a wall-clock budget instead (90s, 3m, 1h); the schedule spans it.", show_default=False)
]
BatchSize = Annotated[Optional[int], typer.Option("--batch-size", help="Sequences per micro-batch, per process [default: 16].", show_default=False)]
GradAccum = Annotated[Optional[int], typer.Option("--grad-accum", help="Micro-batches per update [default: 1].", show_default=False)]
Lr = Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate [default: 1e-3].", show_default=False)]
OptimizerChoice = Annotated[
    Optional[str],
    typer.Option(
        "--optimizer",
        help="adamw, or muon: Muon on the blocks' weight matrices (its own rate, --set muon_lr=0.02), AdamW (--lr) on embeddings, output layer, heads, norms and biases [default: adamw].",
        show_default=False,
    ),
]
Schedule = Annotated[
    Optional[str],
    typer.Option(
        "--schedule",
        help="The learning rate after the warm-up: cosine, linear or constant, or wsd (stable at the peak, then a linear decay over the last --set decay_fraction=0.2 of the run or the budget) [default: cosine].",
        show_default=False,
    ),
]
EarlyStop = Annotated[
    Optional[int],
    typer.Option(
        "--early-stop",
        help="Stop after N evaluations in a row without a lower validation loss (best/ keeps the lowest); 0: never [default: 5 with --time-budget or text as --data, else 0].",
        show_default=False,
    ),
]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed for initialisation, data order, masks and dropout [default: 1337].", show_default=False)]
SaveEvery = Annotated[Optional[int], typer.Option("--save-every", help="Steps between checkpoints; 0 = only at the end [default: 500].", show_default=False)]
KeepEvery = Annotated[
    Optional[int],
    typer.Option(
        "--keep-checkpoints",
        help="Keep every N-th step's weights under RUN/checkpoints/step-NNNNNNN (safetensors, no optimizer state), e.g. for inspect-attention --checkpoints [default: 0, none].",
        show_default=False,
    ),
]
EvalEvery = Annotated[Optional[int], typer.Option("--eval-every", help="Steps between validations; 0 = only at the end [default: 100].", show_default=False)]
LogEvery = Annotated[Optional[int], typer.Option("--log-every", help="Steps between metrics.jsonl records [default: 10].", show_default=False)]
Compile = Annotated[bool, typer.Option("--compile", help="Use torch.compile where it works (falls back with a note where it does not).")]
LogTo = Annotated[
    Optional[list[str]],
    typer.Option(
        "--log-to",
        help="Also log the metrics to tensorboard (RUN/tensorboard/), wandb (offline unless WANDB_MODE=online) or trackio (local); repeatable, or comma-separated. Each needs its extra: pip install 'tfcli[tensorboard]'.",
        show_default=False,
    ),
]
Resume = Annotated[bool, typer.Option("--resume", help="Continue the run in -o from its last checkpoint, exactly.")]
Fsdp = Annotated[
    bool,
    typer.Option(
        "--fsdp", help="Under torchrun: shard parameters, gradients and optimizer state across the processes (FSDP) instead of copying the model to each (DDP)."
    ),
]


def _shared(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


# The options every transformer training command takes, declared once: `takes` puts them into a
# command's signature (where typer finds its options) and the command reads them from ctx.params.
RUN_OPTIONS = (
    _shared("config", ConfigFile),
    _shared("sets", Sets),
    _shared("max_steps", MaxSteps),
    _shared("time_budget", TimeBudget),
    _shared("batch_size", BatchSize),
    _shared("grad_accum", GradAccum),
    _shared("lr", Lr),
    _shared("optimizer", OptimizerChoice),
    _shared("schedule", Schedule),
    _shared("seed", Seed),
    _shared("save_every", SaveEvery),
    _shared("keep_every", KeepEvery),
    _shared("eval_every", EvalEvery),
    _shared("early_stop", EarlyStop),
    _shared("log_every", LogEvery),
    _shared("device", DeviceOrNone),
    _shared("precision", PrecisionOrNone),
    _shared("compile_model", Compile, False),
    _shared("fsdp", Fsdp, False),
    _shared("resume", Resume, False),
)


def takes(options: tuple[inspect.Parameter, ...], *, before: str):
    """Add `options` to a command's signature, before its parameter `before`; the function takes them as
    **options (typer passes every option by name)."""

    def add(command):
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        at = next(i for i, p in enumerate(own) if p.name == before)
        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[at:]]
        command.__signature__ = inspect.Signature([*own[:at], *options, *keyword])
        return command

    return add


PretrainData = Annotated[
    Path,
    typer.Option(
        "--data",
        help="A shard folder from `tfcli tokenize encode`, or text (a file, a folder, JSON lines with a text field, ...): then a tokenizer sized to it and its shards are made in RUN/data/ first, and the quickstart's settings are the defaults.",
        show_default=False,
    ),
]
Arch = Annotated[
    Optional[str],
    typer.Option(
        "--arch",
        help="decoder (causal LM), encoder (masked LM) or encoder-decoder (span denoising) [default: the preset's or config's, else decoder].",
        show_default=False,
    ),
]
Preset = Annotated[
    Optional[str],
    typer.Option(
        "--preset",
        help="Model preset: tiny, small, gpt2-small, bert-base, seq2seq-tiny [default: tiny; seq2seq-tiny for encoder-decoder].",
        show_default=False,
    ),
]
Recipe = Annotated[
    Optional[str],
    typer.Option(
        "--recipe",
        help="classic (AdamW, cosine, GELU, LayerNorm, tied head) or modern (the speedrun's: Muon, warmup-stable-decay, rotary, RMSNorm, SwiGLU, QK-norm, zero-init projections, untied head); under --config and --set; --resume keeps the run's own [default: classic; modern for text as --data].",
        show_default=False,
    ),
]
ShardTokenizer = Annotated[
    Optional[Path],
    typer.Option("--tokenizer", "-t", help="The tokenizer the shards were encoded with [default: found beside the shards].", show_default=False),
]
ContextSize = Annotated[Optional[int], typer.Option("--block-size", help="The model's context length in tokens (the preset's by default).", show_default=False)]
Objective = Annotated[
    Optional[str],
    typer.Option(
        "--objective",
        help="lm, mlm or denoise (the architecture's own), or word2vec: word vectors (skip-gram or CBOW with negative sampling) instead of a transformer [default: the architecture's].",
        show_default=False,
    ),
]
Word2VecAlgorithm = Annotated[
    Optional[str],
    typer.Option("--word2vec", help="word2vec: skipgram (each word predicts its neighbours) or cbow [default: skipgram].", show_default=False),
]
Dim = Annotated[Optional[int], typer.Option("--dim", help="word2vec: the length of each vector [default: 100].", show_default=False)]
Window = Annotated[
    Optional[int],
    typer.Option("--window", help="word2vec: the most words on each side; each word draws a window of 1..N [default: 5].", show_default=False),
]
Negatives = Annotated[Optional[int], typer.Option("--negatives", help="word2vec: noise words per example [default: 5].", show_default=False)]
Subsample = Annotated[
    Optional[float], typer.Option("--subsample", help="word2vec: the threshold for dropping frequent words; 0: none [default: 1e-3].", show_default=False)
]
Epochs = Annotated[Optional[int], typer.Option("--epochs", help="word2vec: passes over the shards [default: 5].", show_default=False)]
Word2VecThreads = Annotated[
    Optional[int], typer.Option("--threads", help="word2vec: threads updating the vectors at once (as gensim's workers) [default: 1].", show_default=False)
]

# `train word2vec`'s own: its defaults differ from a transformer's
Word2VecData = Annotated[Path, typer.Option("--data", help="A shard folder from `tfcli tokenize encode` (any tokenizer's).", show_default=False)]
Word2VecLr = Annotated[
    Optional[float], typer.Option("--lr", help="word2vec: the learning rate at the start; it falls linearly to 0.0001 [default: 0.025].", show_default=False)
]
Word2VecSeed = Annotated[
    Optional[int],
    typer.Option("--seed", help="word2vec: the seed of the vectors' initialisation and of every random draw [default: 1337].", show_default=False),
]
Word2VecLogEvery = Annotated[
    Optional[int], typer.Option("--log-every", help="word2vec: steps (100,000 tokens each) between metrics.jsonl records [default: 1].", show_default=False)
]
# what only word vectors take: `train word2vec` and `pretrain --objective word2vec` (a transformer's pretraining refuses them)
WORD2VEC_OPTIONS = (
    _shared("word2vec", Word2VecAlgorithm),
    _shared("dim", Dim),
    _shared("window", Window),
    _shared("negatives", Negatives),
    _shared("subsample", Subsample),
    _shared("epochs", Epochs),
    _shared("threads", Word2VecThreads),
)
WORD2VEC_ONLY = tuple(option.name for option in WORD2VEC_OPTIONS)
WORD2VEC_HINT = "word2vec runs on the CPU for --epochs or --time-budget; its options are --word2vec, --dim, --window, ... (tfcli train word2vec --help)"


@app.command("pretrain")
@takes(RUN_OPTIONS, before="objective")
@takes(WORD2VEC_OPTIONS, before="log_to")
def pretrain(
    ctx: typer.Context,
    data: PretrainData,
    output: Output,
    arch: Arch = None,
    preset: Preset = None,
    recipe: Recipe = None,
    tokenizer: ShardTokenizer = None,
    block_size: ContextSize = None,
    objective: Objective = None,
    log_to: LogTo = None,
    json_output: JsonFlag = False,
    **shared: Any,
) -> None:
    """Pretrain a model from scratch on token shards, or on text in one command.

    The objective follows the architecture: next-token prediction for a decoder, masked LM (BERT's 15%)
    for an encoder, span denoising (BART's text infilling) for an encoder-decoder. The run directory gets
    the model, the tokenizer, trainer/ (optimizer state for --resume), metrics.jsonl, loss.png, and best/
    (the checkpoint with the lowest validation loss). Ctrl-C saves a checkpoint and exits 130.

    Text as --data (not shards): a byte-level BPE tokenizer with a vocabulary the text can fill, and its
    shards, are made in RUN/data/; the defaults are then the quickstart's (tiny preset, batch 32, lr 3e-3,
    400 steps): --time-budget sets how long it trains instead.

    --objective word2vec trains word vectors instead (the run `tfcli train word2vec` makes), as gensim's Word2Vec
    does (its defaults; the learning rate falls linearly from --lr 0.025), on the shards of any tokenizer
    (`tokenize train --model word` gives classic word2vec); look at them with `tfcli inspect-embeddings`.

    Settings: preset < --config FILE.toml < --set key=value < the options below.
    Many processes: torchrun --nproc-per-node N -m tfcli train pretrain ... (data-parallel; add --fsdp to
    shard a model too large for one device).

    \b
    Example: tfcli train pretrain --data sample_data/corpus/stories.txt -o runs/mine --time-budget 2m
    """
    from tfcli.model.config import ARCHS

    if objective is not None:
        _check_choice("--objective", objective, ("lm", "mlm", "denoise", "word2vec"))
    if objective == "word2vec":  # the run `train word2vec` makes, which takes none of a transformer's options
        _refuse_given(ctx, _transformer_only(ctx), "--objective word2vec", WORD2VEC_HINT)
        settings = {name: shared[name] for name in ("epochs", "threads", "lr", "seed", "save_every", "log_every")}
        _train_word2vec(data, output, tokenizer, _vectors(shared), settings, shared["time_budget"], shared["resume"], json_output)
        return
    _refuse_given(ctx, WORD2VEC_ONLY, "a transformer's pretraining", "they are --objective word2vec's")
    if arch is not None:
        _check_choice("--arch", arch, ARCHS)
    if recipe is not None:
        from tfcli.train.recipes import RECIPES

        _check_choice("--recipe", recipe, tuple(RECIPES))
    options = _run_options(ctx.params).settings({"model.block_size": block_size, "task": objective})
    trackers = _trackers(log_to)
    with _no_empty_run_left(output):
        config, sets, resume = shared["config"], shared["sets"] or [], shared["resume"]
        job = _pretrain_job(data, output, options, arch, preset, recipe, config, sets, tokenizer, resume, trackers=trackers, quiet=json_output)
        render_training(job, json_output)


def _run_options(parameters: dict[str, Any]) -> RunOptions:
    """The options both commands take, out of a command's parameters (`ctx.params`, which holds these numbers,
    words and switches as the function gets them; --compile is compile_model)."""
    import dataclasses

    from tfcli.train.command_line import RunOptions
    from tfcli.training_config import OPTIMIZERS, SCHEDULES

    for option, choices in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES)):
        if parameters[option] is not None:
            _check_choice(f"--{option}", parameters[option], choices)
    return RunOptions(**{f.name: parameters["compile_model" if f.name == "compile" else f.name] for f in dataclasses.fields(RunOptions)})


def _trackers(log_to: Optional[list[str]]) -> tuple[str, ...]:
    from tfcli.train.tracking import check_trackers

    return tuple(check_trackers(log_to or []))


def _no_empty_run_left(output: Path):
    """A start that fails leaves no empty -o behind (nor a stopped run's leftovers it made)."""
    from tfcli.fsutil import no_empty_folder_left
    from tfcli.train.run_checks import RUN_LEFTOVERS

    return no_empty_folder_left(output, RUN_LEFTOVERS)


def _pretrain_job(
    data: Path, output: Path, options: dict[str, Any], arch, preset, recipe, config, sets: list[str], tokenizer, resume: bool, *, trackers, quiet: bool
):
    """The pretraining job; text as --data is made into a tokenizer and shards in RUN/data/ first."""
    from tfcli.train.job import pretrain_job
    from tfcli.train.run_checks import run_recipe
    from tfcli.train.text_data import TEXT_RECIPE, is_shard_folder

    if recipe is None and resume:
        recipe = run_recipe(output)  # the run's own
    if not is_shard_folder(data):
        data = _text_to_shards(data, output, options, config, sets, resume, quiet, recipe_given=recipe is not None)
        recipe = recipe or TEXT_RECIPE
    return pretrain_job(
        data=data,
        output=output,
        arch=arch,
        preset_name=preset,
        config_file=config,
        sets=sets,
        options=options,
        tokenizer_path=tokenizer,
        resume=resume,
        log_to=trackers,
        recipe=recipe,
    )


def _text_to_shards(
    data: Path, output: Path, options: dict[str, Any], config: Path | None, sets: list[str], resume: bool, quiet: bool, *, recipe_given: bool
) -> Path:
    """Text as --data: a tokenizer and shards made in RUN/data/, said line by line; the quickstart's settings
    added to `options` where nothing else sets them (and the modern recipe where --recipe is not given). Returns
    the shard folder."""
    from rich.text import Text

    from tfcli.cli.common import stderr_console
    from tfcli.cli.torchrun import under_torchrun
    from tfcli.errors import TfcliError
    from tfcli.train.run_checks import check_output
    from tfcli.train.text_data import TEXT_RECIPE, prepare_text_data, text_defaults

    check_output(output, resume)
    if under_torchrun():  # every rank would make its own tokenizer and shards of the text in RUN/data/ at once
        raise TfcliError(
            f"under torchrun, --data takes a shard folder; {data} is text",
            hint=f"make them first, in one process (tfcli tokenize train {data} -o TOKENIZER, then tfcli tokenize encode {data} --tokenizer TOKENIZER -o SHARDS), and pass --data SHARDS",
        )
    defaults = text_defaults(options, config, sets)
    options.update(defaults)
    console = stderr_console()
    steps = prepare_text_data(data, output, resume=resume)
    with console.status(f"making a tokenizer and shards of {data}"):
        while True:
            try:
                step = next(steps)
            except StopIteration as done:
                shard_dir = done.value
                break
            if not quiet:
                console.print(Text(f"{step.name:<10} ", style="bold") + Text(step.detail), soft_wrap=True)
    said = [] if recipe_given else [f"recipe {TEXT_RECIPE}"]
    said += [f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}" for key, value in defaults.items()]
    if said and not quiet:
        console.print(Text("settings   ", style="bold") + Text(f"for text: {', '.join(said)} (--recipe, the options and --set change them)"), soft_wrap=True)
    return shard_dir


InitFrom = Annotated[Path, typer.Option("--init-from", help="The run directory to start from.", show_default=False)]
Task = Annotated[
    str,
    typer.Option(
        "--task",
        help="lm, mlm or denoise (continued pretraining of a decoder, encoder or encoder-decoder, on shards), classify (text/label records), seq2seq (source/target records), chat (messages records) or instruct (prompt/response records).",
        show_default=False,
    ),
]
FinetuneData = Annotated[
    Path,
    typer.Option(
        "--data",
        help="Shards for lm, mlm and denoise; for classify and seq2seq a labeled set: JSON lines, CSV / TSV or Parquet, compressed or not (.gz, .zst, .xz, .bz2); for chat and instruct JSON lines or Parquet.",
        show_default=False,
    ),
]
ValData = Annotated[
    Optional[Path],
    typer.Option(
        "--val-data", help="A labeled validation set, in any of --data's formats [default: hold out --set val_fraction=0.1 of --data].", show_default=False
    ),
]
TextField = Annotated[
    Optional[str],
    typer.Option(
        "--text-field",
        help="classify: the field (JSON lines; a dotted path reaches into nested objects) or column (CSV, Parquet) of the text [default: text].",
        show_default=False,
    ),
]
LabelField = Annotated[Optional[str], typer.Option("--label-field", help="classify: the field or column of the label [default: label].", show_default=False)]
SourceField = Annotated[
    Optional[str], typer.Option("--source-field", help="seq2seq: the field or column of the source text [default: source].", show_default=False)
]
TargetField = Annotated[
    Optional[str], typer.Option("--target-field", help="seq2seq: the field or column of the target text [default: target].", show_default=False)
]
Freeze = Annotated[
    Optional[str], typer.Option("--freeze", help="none, embeddings, or body (train only the new classification head) [default: none].", show_default=False)
]
ChatTemplate = Annotated[
    Optional[Path],
    typer.Option(
        "--chat-template",
        help="chat, instruct: a Jinja chat template file (transformers' format) [default: the parent's, else ChatML: <|im_start|>role\\n...<|im_end|>, its two markers added to a tokenizer that lacks them]. Conversations are padded, not packed; the loss counts the assistant's tokens only.",
        show_default=False,
    ),
]
LoraRank = Annotated[
    Optional[int],
    typer.Option(
        "--lora-rank",
        help="Train LoRA adapters of this rank on the frozen model instead of its weights; the run keeps only the adapters (a few MB) and names its parent.",
        show_default=False,
    ),
]
LoraAlpha = Annotated[Optional[float], typer.Option("--lora-alpha", help="LoRA: the update is scaled by alpha / rank [default: 2 x rank].", show_default=False)]
LoraDropout = Annotated[Optional[float], typer.Option("--lora-dropout", help="LoRA: dropout on the adapters' input [default: 0].", show_default=False)]
LoraTargets = Annotated[
    Optional[str],
    typer.Option("--lora-targets", help="LoRA: the layers that get adapters, comma-separated: qkv, out, mlp [default: qkv,out,mlp].", show_default=False),
]
WindowSize = Annotated[Optional[int], typer.Option("--block-size", help="Tokens per example or window, at most the model's context.", show_default=False)]


@app.command("finetune")
@takes(RUN_OPTIONS, before="log_to")
def finetune(
    ctx: typer.Context,
    init_from: InitFrom,
    task: Task,
    data: FinetuneData,
    output: Output,
    val_data: ValData = None,
    text_field: TextField = None,
    label_field: LabelField = None,
    source_field: SourceField = None,
    target_field: TargetField = None,
    freeze: Freeze = None,
    chat_template: ChatTemplate = None,
    lora_rank: LoraRank = None,
    lora_alpha: LoraAlpha = None,
    lora_dropout: LoraDropout = None,
    lora_targets: LoraTargets = None,
    block_size: WindowSize = None,
    log_to: LogTo = None,
    json_output: JsonFlag = False,
    **shared: Any,
) -> None:
    """Fine-tune a run directory: continued LM on shards, text classification, sequence-to-sequence, or chat.

    The model and its tokenizer come from --init-from; classify adds a new head sized by the labels in the
    data (reported with accuracy and macro-F1 on the validation split). chat and instruct render each
    conversation with a chat template (kept in the run's tokenizer_config.json) and train on the assistant's
    tokens only; a conversation longer than the context loses its oldest exchanges (one whose last exchange
    does not fit is dropped, and counted). The run directory has the same layout as a pretraining run; with
    --lora-rank it keeps the adapters instead of the weights (adapter_config.json + adapter_model.safetensors,
    PEFT's layout) and every command loads it onto its parent; `tfcli export RUN --merge -o OUT` writes a full run.

    \b
    Example: tfcli train finetune --init-from runs/tiny --task classify --data sample_data/reviews.jsonl -o runs/reviews
    """
    from tfcli.train.job import finetune_job
    from tfcli.training_config import TASKS

    _check_choice("--task", task, TASKS)
    options = _finetune_options(ctx.params)
    trackers = _trackers(log_to)
    fields = {"text": text_field, "label": label_field, "source": source_field, "target": target_field}
    with _no_empty_run_left(output):
        job = finetune_job(
            init_from=init_from,
            task=task,
            data=data,
            val_data=val_data,
            output=output,
            config_file=shared["config"],
            sets=shared["sets"] or [],
            options=options,
            resume=shared["resume"],
            fields={k: v for k, v in fields.items() if v is not None},
            chat_template=chat_template,
            log_to=trackers,
        )
        render_training(job, json_output)


def _finetune_options(parameters: dict[str, Any]) -> dict[str, Any]:
    """The settings finetune's parameters give: the shared options and its own."""
    lora_rank = parameters["lora_rank"]
    if lora_rank is not None and lora_rank < 1:
        from tfcli.errors import TfcliError

        raise TfcliError(f"--lora-rank must be at least 1, not {lora_rank}", hint="a rank of 4 to 64 is usual")
    own = ("block_size", "freeze", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
    return _run_options(parameters).settings({name: parameters[name] for name in own})


@app.command("word2vec")
@takes(WORD2VEC_OPTIONS, before="time_budget")
def train_word2vec(
    data: Word2VecData,
    output: Output,
    tokenizer: ShardTokenizer = None,
    time_budget: TimeBudget = None,
    lr: Word2VecLr = None,
    seed: Word2VecSeed = None,
    save_every: SaveEvery = None,
    log_every: Word2VecLogEvery = None,
    resume: Resume = False,
    json_output: JsonFlag = False,
    **vector_options: Any,
) -> None:
    """Train word vectors: skip-gram or CBOW with negative sampling, as gensim's Word2Vec does.

    gensim's defaults: --dim 100 --window 5 --negatives 5 --subsample 1e-3, noise words drawn from the counts
    to the power 0.75, and the learning rate falling linearly from --lr 0.025 to 0.0001 over --epochs (or
    over --time-budget). Any tokenizer's shards will do (`tokenize train --model word` gives classic
    word2vec's words). The run directory is a run like any other: the word and context vectors, the
    tokenizer, metrics.jsonl, loss.png and trainer/ for --resume (one thread resumes exactly); look at the
    vectors with `tfcli inspect-embeddings`. The same run as `tfcli train pretrain --objective word2vec`.

    \b
    Example: tfcli train word2vec --data runs/words/shards -o runs/w2v --epochs 10
    """
    settings = {
        "epochs": vector_options["epochs"],
        "threads": vector_options["threads"],
        "lr": lr,
        "seed": seed,
        "save_every": save_every,
        "log_every": log_every,
    }
    _train_word2vec(data, output, tokenizer, _vectors(vector_options), settings, time_budget, resume, json_output)


def _vectors(options: dict[str, Any]) -> dict[str, Any]:
    """The vectors' settings out of the word2vec options given (None: the default)."""
    return {"algorithm": options["word2vec"], **{name: options[name] for name in ("dim", "window", "negatives", "subsample")}}


def _train_word2vec(
    data: Path,
    output: Path,
    tokenizer: Path | None,
    vectors: dict[str, Any],
    settings: dict[str, Any],
    time_budget: str | None,
    resume: bool,
    json_output: bool,
) -> None:
    """Word vectors from the options given (None: the default), as `train word2vec` and `train pretrain --objective
    word2vec` take them."""
    from tfcli.train.word2vec import word2vec_job

    if vectors["algorithm"] is not None:
        _check_choice("--word2vec", vectors["algorithm"], ("skipgram", "cbow"))
    if time_budget is not None:
        from tfcli.train.command_line import parse_duration

        settings = {**settings, "time_budget": parse_duration(time_budget)}
        if settings["epochs"] is not None:
            from tfcli.errors import TfcliError

            raise TfcliError("--epochs and --time-budget do not go together: a budget sets the run's length", hint="pass one of them")
    with _no_empty_run_left(output):
        job = word2vec_job(data=data, output=output, vectors=vectors, settings=settings, tokenizer_path=tokenizer, resume=resume)
        render_training(job, json_output)


app.command("sae")(train_sae)


def _transformer_only(ctx: typer.Context) -> set[str]:
    """pretrain's parameters that `train word2vec` does not take (--objective aside): a transformer's alone."""

    return {param.name for param in ctx.command.params if param.name is not None} - set(inspect.signature(train_word2vec).parameters) - {"objective"}


def _refuse_given(ctx: typer.Context, names: Collection[str], what: str, hint: str) -> None:
    """Refuse the first of these parameters of the command that the command line gave: it does not apply to `what`."""
    from tfcli.errors import TfcliError

    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name in names else None
        if source is not None and source.name == "COMMANDLINE":
            flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
            raise TfcliError(f"{flag} does not apply to {what}", hint=hint)


def _check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    from tfcli.errors import TfcliError

    if value not in choices:
        raise TfcliError(f"{option} must be one of {', '.join(choices)}, not {value!r}")
