"""`tfcli generate --fill-mask` and `--classify`: an encoder's likeliest fillers for each [MASK], a classifier's label
probabilities, as tables or JSON. Renders what tfcli.generate.masked computes."""

from __future__ import annotations

from pathlib import Path

from tfcli.cli.common import print_json, print_table, stderr_console, stdout_console


def show_fillers(run: Path, checkpoint, text: str, top_k: int | None, json_output: bool) -> None:
    """The likeliest tokens for each [MASK] in `text` (5 unless --top-k says otherwise)."""
    from rich.table import Table

    from tfcli.generate.masked import fill_mask as fill_masks
    from tfcli.tokenizer.show import visible

    predictions = fill_masks(checkpoint.model, checkpoint.tokenizer, text, top_k=5 if top_k is None else top_k)
    if json_output:
        print_json(
            {
                "run": str(run),
                "text": text,
                "masks": [
                    {
                        "mask": p.position,
                        "fillers": [{"token_id": f.token_id, "token": f.token, "probability": round(f.probability, 6), "text": f.text} for f in p.fillers],
                    }
                    for p in predictions
                ],
            }
        )
        return
    console = stdout_console()
    for p in predictions:
        table = Table(title=f"mask {p.position + 1} of {len(predictions)}" if len(predictions) > 1 else None)
        for column in ("token", "probability", "text"):
            table.add_column(column, justify="right" if column == "probability" else "left")
        for f in p.fillers:
            table.add_row(f'"{visible(f.token)}"', f"{f.probability:.4f}", visible(f.text))
        print_table(console, table)


def show_labels(run: Path, checkpoint, text: str, json_output: bool) -> None:
    """The classification head's probability of each label for `text`, with a warning when the text is cut."""
    from rich.table import Table
    from rich.text import Text

    from tfcli.generate.masked import classify as classify_texts
    from tfcli.generate.masked import label_names
    from tfcli.tokenizer.show import visible

    console = stdout_console()
    model = checkpoint.model
    labels = label_names(checkpoint.config.training, model.config.n_classes)
    tokens = (
        len(checkpoint.tokenizer.encode(text)) + 1 + (model.config.arch == "encoder" and "sep" in checkpoint.tokenizer.special_ids)
    )  # and [cls] or [eos], BERT's [sep]
    if tokens > model.config.block_size:
        marker = "[cls]" if model.config.arch == "encoder" else "[eos]"
        stderr_console().print(
            Text(
                f"warning: the text has {tokens:,} tokens with its {marker}, more than the context "
                f"({model.config.block_size:,}); classifying its first {model.config.block_size - 1:,}",
                style="yellow",
            ),
            soft_wrap=True,
        )
    (ranked,) = classify_texts(model, checkpoint.tokenizer, [text], labels)
    if json_output:
        print_json({"run": str(run), "text": text, "labels": [{"label": label, "probability": round(p, 6)} for label, p in ranked]})
        return
    table = Table()
    table.add_column("label")
    table.add_column("probability", justify="right")
    for label, p in ranked:
        table.add_row(visible(label), f"{p:.4f}")
    print_table(console, table)
