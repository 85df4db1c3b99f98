"""`tfcli tokenize`: train a tokenizer (BPE, WordPiece, Unigram, char), encode corpora into shards; show tokens and
trace BPE and WordPiece merges (cli/tokenize_views.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tfcli.cli.common import Typer, counted, human_bytes, make_progress, print_json, print_table, stderr_console, stdout_console
from tfcli.cli.options import JsonFlag
from tfcli.cli.tokenize_views import TokenizerFile, show, trace

app = Typer(
    help="Train a tokenizer (BPE, WordPiece, Unigram, char), encode text into token shards, and look at tokens and merges.\n\n"
    "\b\nExample: tfcli tokenize train sample_data/corpus -o runs/tok --vocab-size 4096",
    no_args_is_help=True,
    rich_markup_mode=None,
)

Corpus = Annotated[
    list[str],
    typer.Argument(
        help="Files, folders (read recursively), quoted globs, or - for standard input: plain text, JSON lines (.jsonl, .json), "
        "CSV / TSV or Parquet, each also compressed (.gz, .zst, .xz, .bz2).",
        show_default=False,
    ),
]
Field = Annotated[
    str,
    typer.Option(
        "--field",
        help="The field that holds the text in JSON lines (a dotted path reaches into nested objects), "
        "the column in CSV, TSV and Parquet. Records without a string there are skipped and counted.",
    ),
]
InputFormat = Annotated[
    str,
    typer.Option(
        "--input-format",
        help="auto (by extension, then by the first bytes; standard input that starts with { is JSON lines), text, jsonl, csv, tsv or parquet.",
    ),
]


TokenizerOutput = Annotated[Path, typer.Option("--output", "-o", help="Folder to write tokenizer.json and tokenizer_config.json into.")]
TokenizerModel = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="bpe (byte-pair encoding, GPT-2 style), wordpiece (BERT's: ## continuations; also writes vocab.txt), "
        "unigram (SentencePiece-style, as T5 uses), char (one token per character, as nanoGPT's shakespeare_char) "
        "or word (one token per word or punctuation run, rarer ones unk: classic word2vec's vocabulary).",
    ),
]
VocabSize = Annotated[int, typer.Option(help="Tokens in the vocabulary, special tokens included (for char: a cap; rarer characters become unk).")]
MinFrequency = Annotated[
    Optional[int],
    typer.Option(
        help="bpe, wordpiece: a pair is merged only if it occurs at least this often (default 2). "
        "char, word: a character or word seen fewer times becomes unk (default 1).",
        show_default=False,
    ),
]
SpecialTokens = Annotated[
    Optional[list[str]],
    typer.Option(
        "--special-tokens",
        help="Repeatable. ROLE=TEXT renames a role's token (roles: eos, pad, unk, mask, cls); "
        "a bare TEXT adds an extra special token. Defaults: <|endoftext|> <|pad|> <|unk|> <|mask|> <|cls|>; "
        "for wordpiece BERT's [PAD] [UNK] [CLS] [SEP] (eos) [MASK].",
        show_default=False,
    ),
]
PreTokenizer = Annotated[
    Optional[str],
    typer.Option(
        help="bpe only: byte-level (default; lossless, never unknown), whitespace (classic word-level BPE) or metaspace (SentencePiece-style).",
        show_default=False,
    ),
]
Lowercase = Annotated[bool, typer.Option("--lowercase", help="Lowercase text before tokenizing (wordpiece: as bert-base-uncased).")]
StripAccents = Annotated[
    Optional[bool],
    typer.Option(
        "--strip-accents/--keep-accents",
        help="wordpiece only: strip accents (é -> e) or keep them. Default: strip them when lowercasing, as BERT's normalizer does.",
        show_default=False,
    ),
]
LimitAlphabet = Annotated[
    Optional[int], typer.Option(help="Keep at most this many initial characters (bpe with whitespace or metaspace, wordpiece).", show_default=False)
]
MaxLength = Annotated[int, typer.Option(help="model_max_length written to tokenizer_config.json.")]


@app.command("train")
def train(
    corpus: Corpus,
    output: TokenizerOutput,
    model: TokenizerModel = "bpe",
    vocab_size: VocabSize = 8192,
    min_frequency: MinFrequency = None,
    special_tokens: SpecialTokens = None,
    pre_tokenizer: PreTokenizer = None,
    lowercase: Lowercase = False,
    strip_accents: StripAccents = None,
    limit_alphabet: LimitAlphabet = None,
    max_length: MaxLength = 1024,
    field: Field = "text",
    input_format: InputFormat = "auto",
    json_output: JsonFlag = False,
) -> None:
    """Train a tokenizer on text files, JSON lines, CSV or Parquet: byte-pair encoding (default), WordPiece, Unigram or characters.

    Reads the corpus as a stream (invalid UTF-8 replaced and counted), trains with Hugging Face
    `tokenizers`, and writes DIR/tokenizer.json and DIR/tokenizer_config.json atomically (and BERT's
    DIR/vocab.txt for wordpiece).

    A character-level tokenizer, as nanoGPT's shakespeare_char: --model char.

    \b
    Example: tfcli tokenize train sample_data/corpus -o runs/tok --vocab-size 4096
    """
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.tokenizer.specials import default_specials, parse_special_tokens
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    config = TokenizerTrainingConfig(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=parse_special_tokens(special_tokens or [], default_specials(model)),
        pre_tokenizer=pre_tokenizer,  # type: ignore[arg-type]
        lowercase=lowercase,
        limit_alphabet=limit_alphabet,
        model_max_length=max_length,
        model=model,  # type: ignore[arg-type]
        strip_accents=strip_accents,
    )
    sources = resolve_corpus(corpus, field=field, input_format=input_format)
    summary = _train_with_progress(sources, output, config)
    if json_output:
        print_json(summary.to_json())
        return
    _render_train_summary(summary)


def _train_with_progress(sources, output: Path, config):
    """Train the tokenizer with a progress display: the bytes read, then the merges (or the vocabulary) being made."""
    from tfcli.fsutil import no_empty_folder_left
    from tfcli.tokenizer.train import train_tokenizer

    model = config.model
    console = stderr_console()
    with make_progress(console) as progress:
        reading = progress.add_task("reading corpus", total=max(sources.total_bytes, 1) if not sources.has_stdin else None)
        merging = None

        def report(stage: str, done: int, total: int) -> None:
            nonlocal merging
            if stage == "read":
                progress.update(reading, completed=done, total=max(total, 1) if not sources.has_stdin else None)
            elif merging is None:
                progress.update(reading, completed=sources.total_bytes)
                merging = progress.add_task("computing merges" if model in ("bpe", "wordpiece") else "building the vocabulary", total=None)
            elif done:
                progress.update(merging, total=1, completed=1)

        with no_empty_folder_left(output):
            return train_tokenizer(sources, output, config, progress=report)


_SHORT_OF_THE_ASK = {
    "bpe": "the corpus has no more pairs at this --min-frequency",
    "wordpiece": "the corpus has no more pairs at this --min-frequency",
    "unigram": "the trainer kept no more pieces",
    "char": "the corpus has no more characters",
    "word": "the corpus has no more words at this --min-frequency",
}


def _render_train_summary(summary) -> None:
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    vocab = f"{summary.vocab_size:,}"
    if summary.vocab_size < summary.requested_vocab_size:
        vocab += f" (asked {summary.requested_vocab_size:,}: {_SHORT_OF_THE_ASK.get(summary.model, 'the trainer made no more')})"
    normalized = [name for name, on in (("lowercased", summary.lowercase), ("accents stripped", summary.strip_accents)) if on]
    table.add_row("tokenizer", str(summary.path))
    table.add_row("model", f"{summary.model} ({summary.pre_tokenizer}{''.join(', ' + n for n in normalized)})")
    table.add_row("vocab size", vocab)
    if summary.merges is not None:
        table.add_row("merges", f"{summary.merges:,}")
    table.add_row("alphabet", f"{summary.alphabet_size:,} " + ("bytes" if summary.pre_tokenizer == "byte-level" else "characters"))
    if summary.unknown_characters:
        table.add_row(
            "unknown",
            f"{counted(summary.unknown_characters, 'rarer character')} of {summary.characters_seen:,} seen, "
            f"{counted(summary.unknown_occurrences, 'occurrence')} in the corpus, encoded as {summary.unk_token}",
        )
    table.add_row("special tokens", " ".join(summary.special_tokens))
    table.add_row("corpus", f"{counted(summary.files, 'file')}, {human_bytes(summary.bytes_read)}")
    table.add_row("bytes per token", f"{summary.bytes_per_token:.2f} (on {human_bytes(summary.sample_bytes)} of the training text)")
    _add_reading_rows(
        table, summary.invalid_bytes, summary.files_with_invalid_utf8, len(summary.skipped_binary), summary.skipped_records, summary.skipped_examples
    )
    table.add_row("time", f"{summary.seconds:.2f} s")
    print_table(stdout_console(), table)


@app.command("encode")
def encode(
    corpus: Corpus,
    tokenizer: TokenizerFile,
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="Folder to write train.bin, val.bin and meta.json into; shards already there are replaced once the new ones are complete."
        ),
    ],
    val_fraction: Annotated[float, typer.Option(help="Share of documents held out for validation.")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the train/validation draw.")] = 0,
    documents: Annotated[
        str,
        typer.Option(
            help="What one document of a plain text file is: paragraph (ends at a blank line), line, or file. "
            "In JSON lines, CSV and Parquet each record is one."
        ),
    ] = "paragraph",
    field: Field = "text",
    input_format: InputFormat = "auto",
    json_output: JsonFlag = False,
) -> None:
    """Encode text files, JSON lines, CSV or Parquet into token shards for training.

    Writes DIR/train.bin and DIR/val.bin (flat little-endian token ids, uint16 when the vocabulary
    fits, else uint32; documents separated by the end-of-text id) and DIR/meta.json. Each document goes
    whole to train or validation, drawn with --seed. A byte-level BPE tokenizer with GPT-2's regex is run
    by tiktoken where it is installed (the same ids, faster), else by tokenizers.

    \b
    Example: tfcli tokenize encode sample_data/corpus -t runs/tok -o runs/shards --val-fraction 0.1
    """
    from tfcli.corpus.documents import DOCUMENT_BOUNDARIES
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.errors import TfcliError
    from tfcli.tokenizer.core import TextTokenizer

    if documents not in DOCUMENT_BOUNDARIES:
        raise TfcliError(f"unknown --documents {documents!r}", hint=f"use one of {', '.join(DOCUMENT_BOUNDARIES)}")
    loaded = TextTokenizer.load(tokenizer)
    sources = resolve_corpus(corpus, field=field, input_format=input_format)
    console = stderr_console()
    with make_progress(console, tokens=True) as progress:
        total = None if sources.has_stdin else max(sources.total_bytes, 1)
        task = progress.add_task("encoding", total=total, tokens=0)

        def report(done: int, total_bytes: int, tokens: int) -> None:
            progress.update(task, completed=done, tokens=tokens)

        from rich.text import Text

        from tfcli.fsutil import no_empty_folder_left, remove_stale_temp_files, removed_note

        removed = remove_stale_temp_files(output, ("train.bin", "val.bin", "meta.json"), locked=False)
        if removed:
            console.print(Text(f"note: {removed_note(removed)}", style="yellow"), soft_wrap=True)
        with no_empty_folder_left(output):
            meta = encode_corpus(sources, loaded, output, val_fraction=val_fraction, seed=seed, boundary=documents, progress=report)  # type: ignore[arg-type]
    if json_output:
        print_json({"output": str(output), **meta.to_json()})
        return
    _render_encode_summary(output, meta, packed=any(f.compression or f.format == "parquet" for f in sources.files))


def _render_encode_summary(output: Path, meta, packed: bool) -> None:
    """What encode made, as a table (`packed`: the rate counts compressed bytes on disk)."""
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    total_bytes = sum(s.bytes for s in meta.sources)
    table.add_row("shards", str(output))
    table.add_row("train", f"{meta.train_tokens:,} tokens in {meta.train_documents:,} documents")
    table.add_row("val", f"{meta.val_tokens:,} tokens in {meta.val_documents:,} documents")
    table.add_row("dtype", f"{meta.dtype} (vocab {meta.vocab_size:,})")
    table.add_row("encoder", meta.encoder)
    table.add_row("corpus", f"{counted(len(meta.sources), 'file')}, {human_bytes(total_bytes)}")
    _add_reading_rows(
        table, meta.invalid_utf8_bytes, meta.invalid_utf8_files, len(meta.skipped_binary_files), meta.skipped_records, meta.skipped_record_examples
    )
    rate = total_bytes / meta.seconds / 1e6 if meta.seconds else 0.0
    table.add_row("time", f"{meta.seconds:.2f} s ({rate:.1f} MB/s{' of compressed files' if packed else ''})")
    if meta.val_fraction > 0 and meta.val_documents == 0:
        table.add_row("warning", "no document went to validation; use more documents or a larger --val-fraction")
    print_table(stdout_console(), table)


def _add_reading_rows(table, invalid_bytes: int, invalid_files: int, binary_files: int, skipped_records: int, skipped_examples: list[str]) -> None:
    """The rows on what reading met, each only when it happened: invalid UTF-8, binary files, records without text."""
    if invalid_bytes:
        table.add_row("invalid UTF-8", f"{counted(invalid_bytes, 'byte')} in {counted(invalid_files, 'file')}, replaced with U+FFFD")
    if binary_files:
        table.add_row("skipped", f"{counted(binary_files, 'binary file')}")
    if skipped_records:
        table.add_row("skipped records", _skipped_records(skipped_records, skipped_examples))


def _skipped_records(count: int, examples: list[str]):
    """'2 records without text in the field (a.jsonl line 3 has no 'text' field ...; ...)', as data, not markup."""
    from rich.text import Text

    return Text(f"{counted(count, 'record')} without text in the field ({'; '.join(examples)}{'; ...' if count > len(examples) else ''})")


app.command("show")(show)
app.command("trace")(trace)
