"""`tfcli info RUN`: a run directory's model, parameters, memory, KV-cache cost, tokenizer and history;
`tfcli info --device`: this machine and what tfcli.accel measured and chose on it."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tfcli.cli.common import counted, human_bytes, print_json, print_table, stdout_console
from tfcli.cli.options import JsonFlag, RunOrNone


def info(
    run: RunOrNone = None,
    device: Annotated[
        bool,
        typer.Option(
            "--device", help="Describe this machine instead: its processor, and which products, loss and decoding step tfcli chose here, measured, and why."
        ),
    ] = False,
    forget: Annotated[
        Optional[list[str]],
        typer.Option(
            "--forget",
            metavar="WHAT",
            help="Forget decisions measured on this machine, so the next runs measure them again: all, busy (those measured while "
            "other work held the cores), a kind of work (products, loss, decoding, quantized, peak), or the start of a name --device lists. "
            "Repeatable.",
            show_default=False,
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Describe a run directory without loading its weights.

    Shows the config, parameters by part, weight memory in fp32 and bf16, the KV-cache bytes per
    generated token (grouped- and multi-query attention shrink it), the tokenizer and the training history,
    and flags a weights file or tokenizer that does not match config.json.

    Exit code 1 when it finds such a problem: all it can read is still shown, the problems as `problem`
    rows (under `problems` with --json). 0 for an intact run, 2 when the run cannot be read at all.

    With --device (and no run): the processor and its vector extensions, torch and its threads, whether
    oneDNN and tfcli's C code are usable here, and every choice tfcli.accel measured on this machine so far
    (candidate times, what was kept, why a candidate was dropped, how busy the machine was) with the file
    that keeps them. A choice measured while other work held the cores may have kept a slower path:
    `tfcli info --device --forget busy`, run on an idle machine, has the next runs measure those again.

    \b
    Example: tfcli info runs/gpt2
    """
    from tfcli.errors import TfcliError

    if forget:
        if run is not None:
            raise TfcliError("--forget forgets this machine's decisions, not a run's", hint="drop the run directory")
        _forget(forget, json_output)
        return
    if device:
        if run is not None:
            raise TfcliError("--device describes this machine, not a run", hint="drop the run directory, or drop --device")
        _device(json_output)
        return
    if run is None:
        raise TfcliError("no run directory given", hint="tfcli info RUN, or tfcli info --device for this machine")
    from tfcli.info import run_info

    data = run_info(run)
    if json_output:
        print_json(data)
    else:
        _print_table(data)
    if data["problems"]:
        raise typer.Exit(code=1)


def _print_table(data: dict) -> None:
    from rich.table import Table
    from rich.text import Text

    console = stdout_console()
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    if "word2vec" in data:
        _vectors_rows(table, data)
        print_table(console, table)
        return
    _model_rows(table, data)
    _size_rows(table, data)
    model = data["model"]
    tok = data["tokenizer"]
    padding = f" (model vocabulary {model['vocab_size']:,}: never generated past the tokenizer's)" if model["vocab_size"] > tok["vocab_size"] else ""
    table.add_row(
        "tokenizer",
        f"{tok['vocab_size']:,} tokens{padding}, {tok['model']} ({tok['pre_tokenizer']}), "
        f"specials {' '.join(dict.fromkeys(tok['special_tokens'].values())) or 'none'}",
    )
    history = data["history"]
    if history:
        read = (
            f"{counted(history['records'], 'record')} read from the first line and the end of a {human_bytes(history['file_bytes'])} file"
            if history["tail_only"]
            else counted(history["records"], "record")
        )
        table.add_row(
            "history",
            f"{read}, steps {history['first_step']}..{history['last_step']}, "
            f"last loss {_loss(history['last_loss'])}, best val loss {_loss(history['best_val_loss'])}",
        )
    for problem in data["problems"]:
        table.add_row(Text("problem", style="bold red"), Text(problem, style="red"))
    print_table(console, table)


def _model_rows(table, data: dict) -> None:
    """The run, the model's shape and options, its task, classes and adapter."""
    from rich.text import Text

    model = data["model"]
    table.add_row("run", data["run"] + (f"  (from {data['source']})" if data["source"] else ""))
    layers = str(model["n_layers"]) + (f" + {model['n_decoder_layers'] or model['n_layers']} decoder" if model["arch"] == "encoder-decoder" else "")
    layers += " layer" if layers == "1" else " layers"
    table.add_row(
        "model",
        f"{model['arch']}, {layers}, d_model {model['d_model']}, {counted(model['n_heads'], 'head')} "
        f"({model['n_kv_heads'] or model['n_heads']} kv), context {model['block_size']}",
    )
    table.add_row(
        "options",
        f"{model['positions']} positions, {model['norm_placement']}-{model['norm']}, {model['activation']}, "
        f"bias {'on' if model['bias'] else 'off'}, embeddings {'tied' if model['tie_embeddings'] else 'untied'}"
        + "".join(f", {option}" for option in _more_options(model)),
    )
    trained = data["training"] or {}
    if trained.get("task"):
        parent = trained.get("init_from")
        table.add_row("task", Text(str(trained["task"]) + (f" (fine-tuned from {parent})" if parent else "")))
    if model["n_classes"]:
        labels = trained.get("labels") or [f"class {i}" for i in range(model["n_classes"])]
        table.add_row("classes", Text(f"{model['n_classes']}: " + ", ".join(map(str, labels))))
    adapter = data.get("adapter")
    if adapter:
        share = adapter["parameters"] / max(data["parameters"]["total"], 1)
        saved = f", and {', '.join(adapter['modules_to_save'])} whole" if adapter["modules_to_save"] else ""
        table.add_row(
            "adapter",
            Text(
                f"LoRA rank {adapter['rank']}, alpha {adapter['alpha']:g} on {', '.join(adapter['targets'])} ({adapter['layers']} layers{saved}): "
                f"{adapter['parameters']:,} trained parameters ({share:.2%}); parent {adapter['parent_path']}"
            ),
        )


def _size_rows(table, data: dict) -> None:
    """Parameters, where they were imported from, the weights' and the KV cache's bytes."""
    params = data["parameters"]
    parts = ", ".join(f"{name} {params[name]:,}" for name in ("embeddings", "attention", "mlp", "norms", "heads") if params[name])
    table.add_row("parameters", f"{params['total']:,} ({parts})")
    if data["source_class"]:
        extra = params["total"] - data["source_parameters"]
        fresh = f"; tfcli added a fresh masked-LM head of {extra:,}" if extra else ""
        table.add_row("imported", f"{data['source_class']}, {data['source_parameters']:,} parameters as transformers counts them{fresh}")
    weights = data["weights_bytes"]
    if data.get("quantized"):
        held = ", ".join(f"{kind} {counted(count, 'tensor')}" for kind, count in data["quantized"].items())
        table.add_row("weights", f"quantized: {held}; the file {human_bytes(weights['file'])} ({human_bytes(weights['fp32'])} as fp32)")
    else:
        table.add_row("weights", f"{human_bytes(weights['fp32'])} fp32, {human_bytes(weights['bf16'])} bf16")
    kv = data["kv_cache_bytes_per_token"]
    if kv["bf16"]:
        saving = f", {kv['multi_head_equivalent_bf16'] // kv['bf16']}x less than multi-head" if kv["kv_heads"] < kv["query_heads"] else ""
        cross = kv["cross_attention_per_source_token_bf16"]
        cross_text = f", plus {human_bytes(cross)} per source token for cross-attention" if cross else ""
        table.add_row("KV cache", f"{human_bytes(kv['bf16'])} per token bf16 ({human_bytes(kv['fp32'])} fp32; {kv['kv_heads']} kv heads{saving}){cross_text}")


def _vectors_rows(table, data: dict) -> None:
    """A word2vec run's rows: the vectors, the objective, the training, the tokenizer, the history, problems."""
    from rich.text import Text

    vectors, tok = data["word2vec"], data["tokenizer"]
    table.add_row("run", data["run"])
    table.add_row(
        "word2vec",
        f"{vectors['algorithm']}, {vectors['vocab_size']:,} vectors of {vectors['dim']} (word and context tables), window {vectors['window']}, "
        f"{vectors['negatives']} negatives, subsample {vectors['subsample']:g}",
    )
    table.add_row("parameters", f"{data['parameters']['total']:,} ({human_bytes(data['weights_bytes']['fp32'])} fp32)")
    trained = data["training"]
    if trained:
        settings = trained["config"]
        table.add_row(
            "training",
            Text(f"{trained['words']:,} tokens of {trained['data']} in {counted(trained['step'], 'step')}, lr {settings['lr']:g} to {settings['min_lr']:g}"),
        )
    table.add_row("tokenizer", f"{tok['vocab_size']:,} tokens, {tok['model']} ({tok['pre_tokenizer']})")
    history = data["history"]
    if history:
        table.add_row(
            "history",
            f"{counted(history['records'], 'record')}, steps {history['first_step']}..{history['last_step']}, last loss {_loss(history['last_loss'])}",
        )
    for problem in data["problems"]:
        table.add_row(Text("problem", style="bold red"), Text(problem, style="red"))


def _more_options(model: dict) -> list[str]:
    """The options pretrained models bring (Llama's rotary base and scaling, Qwen2's q/k/v biases, Gemma 3's
    local layers and norms, BERT's parts)."""
    options = []
    if model["positions"] == "rotary":
        options.append(f"rope base {model['rope_base']:g}")
    if model.get("rope_fraction", 1.0) != 1.0:
        options.append(f"rotary on {model['rope_fraction']:g} of each head")
    if model.get("rope_scaling"):
        options.append(f"rope scaling {model['rope_scaling']['kind']} x{model['rope_scaling']['factor']:g}")
    if model.get("qk_norm"):
        options.append("QK-norm")
    if model.get("logit_softcap"):
        options.append(f"logits soft-capped at {model['logit_softcap']:g}")
    if model.get("zero_init_proj"):
        options.append("output projections started at zero")
    if model.get("d_head"):
        options.append(f"heads {model['d_head']} wide")
    if model.get("attn_scale"):
        options.append(f"attention scale {model['attn_scale']:g}")
    if model.get("sliding_window"):
        local = model.get("local_layers") or []
        window = f"window {model['sliding_window']:,} on {len(local)} of {model['n_layers']} layers"
        options.append(window + (f" (rope base {model['rope_local_base']:g})" if model.get("rope_local_base") else ""))
    if model.get("post_norms"):
        options.append("sublayer output norms")
    if model.get("scale_embeddings"):
        options.append("embeddings x sqrt(d)")
    for key, name in (("qkv_bias", "q/k/v bias"), ("mlp_bias", "mlp bias")):
        if model.get(key) is not None:
            options.append(f"{name} {'on' if model[key] else 'off'}")
    if model.get("type_vocab_size"):
        options.append(f"{model['type_vocab_size']} token types")
    if model.get("embedding_norm"):
        options.append("embedding norm")
    if model.get("pooler"):
        options.append("pooler")
    return options


def _loss(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


def _device(json_output: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    from tfcli.accel import report

    data = report()
    if json_output:
        print_json(data)
        return
    console = stdout_console()
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("processor", f"{data['processor']} ({' '.join(data['vector_extensions']) or 'no vector extensions listed'})")
    table.add_row("torch", f"{data['torch']}, {counted(data['threads'], 'thread')}")
    table.add_row("accel", data["accel"])
    for key, label in (("onednn", "oneDNN"), ("c_code", "C code"), ("c_decoder_step", "decoding")):
        if key in data:
            table.add_row(label, Text(data[key]))
    if data["accel"] == "on":
        table.add_row("compiled step", Text(_compiled_steps(data.get("decisions", {}))))
    if "decisions_file" in data:
        table.add_row("decisions", Text(data["decisions_file"] or "kept for this process only"))
    for note in data.get("notes", []):
        table.add_row(Text("note", style="yellow"), Text(note))
    print_table(console, table)
    decisions = data.get("decisions", {})
    if not decisions:
        if data["accel"] == "on":
            console.print("nothing measured yet: choices are made on first use (training, generating, evaluating, benchmarks)")
        return
    busy = data.get("measured_busy", [])
    choices = Table(title="choices measured on this machine (fastest of each candidate's runs)", title_justify="left")
    for column in ("work", "chosen", "candidates", "compiling", "machine", "note"):
        choices.add_column(column)
    for key, decision in decisions.items():
        times = ", ".join(f"{name} {seconds * 1e3:.3g} ms" for name, seconds in decision["seconds"].items())
        compiling = f"{decision['compile_seconds']:.1f} s" if decision.get("compile_seconds") else ""
        choices.add_row(Text(key), decision["choice"], times, compiling, _load_cell(decision.get("load"), key in busy), Text(decision.get("note", "")))
    print_table(console, choices)
    if busy:
        console.print(
            Text(
                f"{counted(len(busy), 'choice was', 'choices were')} measured on a busy machine (other work held the cores): "
                "they may have kept a slower path. On an idle machine, `tfcli info --device --forget busy` has the next runs measure them again.",
                style="yellow",
            )
        )


def _load_cell(load: dict | None, busy: bool):
    """How busy the machine was while a decision was timed. Example: "busy: waited 41% for a core" """
    from rich.text import Text

    if not load:
        return Text("")  # measured by a tfcli that did not record it
    if load.get("waited") is not None:
        said = f"waited {load['waited']:.0%} for a core"
    elif load.get("per_core") is not None:
        said = f"load {load['per_core']:.2f} per core"
    else:
        return Text("")
    return Text(f"busy: {said}", style="red") if busy else Text(said)


def _forget(what: list[str], json_output: bool) -> None:
    """`--forget WHAT`: remove those decisions from this machine's file, one line saying what went."""
    from collections import Counter

    from rich.text import Text

    from tfcli.accel.choices import choices_path, forget, kind_of

    path = choices_path()
    if path is None:
        stdout_console().print("nothing to forget: with no private cache folder, decisions are kept for one process only")
        return
    gone = forget(path, what)
    if json_output:
        print_json({"decisions_file": str(path), "forgotten": gone})
        return
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(Counter(map(kind_of, gone)).items()))
    again = "it" if len(gone) == 1 else "them"
    line = (
        f"forgot {counted(len(gone), 'decision')} ({kinds}) in {path}: the next runs measure {again} again"
        if gone
        else f"nothing to forget ({' '.join(what)}) in {path}"
    )
    stdout_console().print(Text(line))


def _compiled_steps(decisions: dict) -> str:
    """One line per decision of the step compiled by torch.compile (tfcli.accel.compiled_step): which rows,
    what was chosen, how long compiling took. Example: "one row: native chosen, compiled in 12.5 s (...)" """
    from tfcli.accel.compiled_step import KEY_PREFIXES

    lines = []
    for key, decision in decisions.items():
        if key.startswith(KEY_PREFIXES):
            rows = key.split(" ", 1)[0].removeprefix("compiled-rows")
            what = "one row" if key.startswith(KEY_PREFIXES[0]) else f"{rows} rows"
            lines.append(f"{what}: {decision['choice']} chosen, compiled in {decision.get('compile_seconds', 0.0):.1f} s ({key.split(' ', 1)[1]})")
    return "\n".join(lines) or "not tuned here (tfcli bench generate tunes one row; tfcli bench serve --compiled, a batch)"
