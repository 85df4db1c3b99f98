"""The hostile-input sweep: every command, fed the strings a user can type or a file can hold (prompts,
--text, --stop, --set values, TOML configs, labels in JSON lines, file names with spaces, non-ASCII and
non-UTF-8 bytes, special-token spellings, NUL, U+2028, bidi marks, lone surrogates), ends with exit 0 or
a one-line error and exit 2, never a traceback, and leaves its output complete or absent.

The calls run in-process through `main()` on tiny runs built once per module, so each example costs
milliseconds. The default run tries a few examples per command; a longer one:

    TFCLI_SWEEP_EXAMPLES=500 python3 -m pytest -m sweep -q
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.conftest import TINY_TEXT
from tests.helpers import Ran, run

pytestmark = pytest.mark.sweep

EXAMPLES = int(os.environ.get("TFCLI_SWEEP_EXAMPLES", "0"))


def sweep(examples: int):
    """Hypothesis settings for one command: `examples` by default, TFCLI_SWEEP_EXAMPLES when it is set. No
    shrinking: a call takes milliseconds to a second, and shrinking one failure could take minutes; the
    failing example is printed as found."""
    phases = (Phase.explicit, Phase.reuse, Phase.generate)
    return settings(max_examples=EXAMPLES or examples, deadline=None, suppress_health_check=list(HealthCheck), phases=phases, print_blob=True)


# ---- the strings ----------------------------------------------------------------------------------------

SPECIAL_SPELLINGS = [
    "<|endoftext|>",
    "<|pad|>",
    "<|unk|>",
    "<|mask|>",
    "<|cls|>",
    "<|im_start|>",
    "[MASK]",
    "[CLS]",
    "[SEP]",
    "[PAD]",
    "[UNK]",
    "<s>",
    "</s>",
    "<unk>",
    "<mask>",
    "##ing",
    "Ġ",
    "▁",
    "</w>",
    "@@weights-0@@",
]
ODD = [
    "\u2028",  # line separator
    "\u2029",  # paragraph separator
    "\u202e",  # right-to-left override
    "\u200f",  # right-to-left mark
    "\u200b",  # zero-width space
    "\ufeff",  # byte-order mark
    "\udcff",  # a byte that is not UTF-8, as Python decodes an argument (surrogateescape)
    "\udc80",
    "\ud800",  # a lone high surrogate
    "\r\n",
    "\r",
    "\t",
    "\n",
    "\n\n",
    "\x1b[31m",
    "\x7f",
    "\x85",
    "e\u0301",
    "🦊",
    "\U0010ffff",
    "\ufffd",
    "[bold red]x[/]",
    "$(id)",
    "'",
    '"',
    "\\",
    "%s{}",
    "</script>",
    "<img src=x onerror=alert(1)>",
    " ",
    "--help",
    "-o",
]
WORDS = ["the fox", " ball", "Once upon a time", "Zoë", "café", "1.5", "-3", "true", "0"]


def hostile_text(max_pieces: int = 6, nul: bool = False) -> st.SearchStrategy[str]:
    """Text as a user or a file may give it; `nul` lets in NUL (a file may hold it, a command line cannot)."""
    pieces = st.one_of(
        st.sampled_from(SPECIAL_SPELLINGS),
        st.sampled_from(ODD + (["\x00"] if nul else [])),
        st.sampled_from(WORDS),
        st.text(alphabet=st.characters(exclude_categories=() if nul else ("Cs",), exclude_characters="" if nul else "\x00"), max_size=6),
    )
    return st.lists(pieces, max_size=max_pieces).map("".join)


ARGV_TEXT = hostile_text()
FILE_TEXT = hostile_text(nul=True)


def _name_piece() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["a b", " lead", "trail ", "café", "日本語", "\udcff", "\udce9x", "-dash", "#", "'q'", "$x", "\u202e", "e\u0301", "..", "."]),
        st.just("n" * 260),  # longer than a file system takes (ENAMETOOLONG)
        st.text(alphabet=string.ascii_letters + string.digits + " _-.é", min_size=1, max_size=8),
    )


FILE_NAME = st.lists(_name_piece(), min_size=1, max_size=3).map("".join).filter(lambda n: n not in (".", ".."))


# ---- running a command as a process would ----------------------------------------------------------------


def clean_end(result: Ran, *args) -> Ran:
    """Exit 0, or exit 2 with one `error:` line last on stderr; never a traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code in (0, 2), (args, result.code, result.stderr[-3000:])
    if result.code == 2:
        tail = result.stderr.rstrip("\n").split("\n")
        errors = [i for i, line in enumerate(tail) if line.startswith("error: ")]
        assert errors and errors[-1] == len(tail) - 1, (args, result.stderr)
    return result


def file_bytes(text: str) -> bytes:
    """`text` as a file would hold it: U+DC80..U+DCFF as the bytes they stand for (surrogateescape), other lone
    surrogates as the bytes no UTF-8 decoder takes (surrogatepass), the rest as UTF-8."""
    out = bytearray()
    for ch in text:
        out += bytes([ord(ch) - 0xDC00]) if "\udc80" <= ch <= "\udcff" else ch.encode("utf-8", "surrogatepass")
    return bytes(out)


def no_temp_files(folder: Path) -> None:
    if folder.is_dir():
        left = [p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.endswith(".next")]
        assert not left, left


# ---- the tiny world the commands run on ------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory, trained_tokenizer) -> dict[str, Path]:
    """A decoder, an encoder and a classifier run (random weights, saved as tfcli saves them), and shards."""
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.data.shards import encode_corpus
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    root = tmp_path_factory.mktemp("sweep")
    tokenizer = TextTokenizer.load(trained_tokenizer)
    base = dict(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=2, n_heads=2, d_model=16)
    torch.manual_seed(0)
    save_checkpoint(root / "decoder", Transformer(ModelConfig(**base, activation="gelu_tanh")), tokenizer)  # exports as GPT-2
    save_checkpoint(root / "encoder", Transformer(ModelConfig(**base, arch="encoder")), tokenizer)
    save_checkpoint(root / "classifier", Transformer(ModelConfig(**base, n_classes=3)), tokenizer, training={"labels": ["neg", "pos", "Zoë 🦊"]})
    corpus = root / "corpus.txt"
    corpus.write_text(TINY_TEXT * 30, encoding="utf-8")
    encode_corpus(resolve_corpus([corpus]), tokenizer, root / "shards", val_fraction=0.2)
    return {"root": root, "tokenizer": trained_tokenizer, "shards": root / "shards", **{k: root / k for k in ("decoder", "encoder", "classifier")}}


@pytest.fixture(scope="module", autouse=True)
def small_machine():
    """A training run times the machine's peak FLOP/s for its MFU once (0.3 s of matmuls) and draws loss.png,
    which the sweep never looks at; and this machine has 64 MB, so a --set that asks for a big model is refused (by the check
    that refuses one larger than the real memory) instead of built."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tfcli.train.setup.peak_matmul_flops", lambda *args, **kwargs: 1e12)
        patch.setattr("tfcli.train.loop.plot_loss_curve", lambda *args, **kwargs: False)  # 0.3 s of matplotlib a run
        patch.setattr("tfcli.train.setup.physical_memory", lambda: 64 << 20)
        yield


@pytest.fixture
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("out")


def _fresh(scratch: Path) -> Path:
    """A new empty folder per example (hypothesis runs many examples in one test call)."""
    import tempfile

    return Path(tempfile.mkdtemp(dir=scratch))


def _write_name(folder: Path, name: str, data: bytes) -> Path | None:
    """Write `data` under a made-up file name; None where the file system refuses the name (too long)."""
    path = folder / name
    try:
        path.write_bytes(data)
    except OSError:
        return None
    return path


# ---- tokenize -------------------------------------------------------------------------------------------


@sweep(15)
@given(text=ARGV_TEXT, as_json=st.booleans())
def test_tokenize_show(world, text, as_json):
    result = clean_end(run("tokenize", "show", "-t", world["tokenizer"], *(["--json"] if as_json else []), "--", text))
    if result.code == 0 and as_json:
        result.json()


@sweep(10)
@given(text=hostile_text(max_pieces=4), model=st.sampled_from(["bpe", "wordpiece"]), as_json=st.booleans())
def test_tokenize_trace(text, model, as_json):
    result = clean_end(run("tokenize", "trace", "-m", model, "--merges", "20", *(["--json"] if as_json else []), "--", text))
    if result.code == 0 and as_json:
        result.json()


@sweep(6)
@given(content=FILE_TEXT, name=FILE_NAME, out_name=FILE_NAME, as_jsonl=st.booleans(), documents=st.sampled_from(["paragraph", "line", "file"]))
@example(content="", name="caf\udce9 \udcff", out_name="\udcff", as_jsonl=False, documents="paragraph")  # found: meta.json and --json
@example(content="x", name="a", out_name="n" * 260, as_jsonl=True, documents="line")  # a name too long
def test_tokenize_encode(world, scratch, content, name, out_name, as_jsonl, documents):
    folder = _fresh(scratch)
    data = (json.dumps({"text": content}) + "\n" + json.dumps({"text": TINY_TEXT}) + "\n") if as_jsonl else content + "\n\n" + TINY_TEXT
    source = _write_name(folder, name + (".jsonl" if as_jsonl else ".txt"), file_bytes(data))
    if source is None:
        return
    out = folder / out_name
    clean_end(run("tokenize", "encode", source, "-t", world["tokenizer"], "-o", out, "--documents", documents, "--json"))
    from tfcli.data.shards import load_shard_meta

    if os.path.exists(out / "meta.json"):
        load_shard_meta(out)  # complete: the sizes agree with meta.json
    else:
        assert not os.path.exists(out / "train.bin")
    no_temp_files(folder)


@sweep(5)
@given(
    content=FILE_TEXT,
    name=FILE_NAME,
    specials=st.lists(
        st.one_of(st.sampled_from(["eos", "pad", "unk", "mask", "cls"]).flatmap(lambda r: ARGV_TEXT.map(lambda t: f"{r}={t}")), ARGV_TEXT), max_size=3
    ),
    model=st.sampled_from(["bpe", "wordpiece", "unigram", "char"]),
)
@example(content="", name="a", specials=["cls=a b"], model="wordpiece")  # found: the template's ValueError
@example(content="", name="a", specials=["unk=\udcff<|x|>"], model="bpe")  # found: tokenizers' TypeError
def test_tokenize_train(scratch, content, name, specials, model):
    folder = _fresh(scratch)
    source = _write_name(folder, name + ".txt", file_bytes(content + "\n" + TINY_TEXT))
    if source is None:
        return
    out = folder / "tok"
    args = ["tokenize", "train", source, "-o", out, "-m", model, "--vocab-size", "300"]
    for item in specials:
        args.append(f"--special-tokens={item}")
    clean_end(run(*args))
    if os.path.exists(out / "tokenizer.json"):
        from tfcli.tokenizer.core import TextTokenizer

        TextTokenizer.load(out)
    no_temp_files(folder)


# ---- generate -------------------------------------------------------------------------------------------


@sweep(10)
@given(prompt=ARGV_TEXT, stops=st.lists(ARGV_TEXT, max_size=2), as_json=st.booleans(), sample=st.booleans())
def test_generate(world, prompt, stops, as_json, sample):
    args = ["generate", world["decoder"], f"--prompt={prompt}", "-n", "3", "--device", "cpu"]
    args += [f"--stop={s}" for s in stops]
    args += ["--strategy", "sample", "--seed", "1"] if sample else []
    args += ["--json"] if as_json else []
    result = clean_end(run(*args))
    if result.code == 0 and as_json:
        result.json()


@sweep(4)
@given(prompts=st.lists(FILE_TEXT, min_size=1, max_size=3), name=FILE_NAME)
def test_generate_prompt_file(world, scratch, prompts, name):
    path = _write_name(_fresh(scratch), name, file_bytes("\n".join(prompts)))
    if path is not None:
        clean_end(run("generate", world["decoder"], "--prompt-file", path, "-n", "2", "--device", "cpu", "--no-stream"))


@sweep(6)
@given(text=ARGV_TEXT, mask=st.booleans(), classify=st.booleans())
def test_fill_mask_and_classify(world, text, mask, classify):
    if classify:
        clean_end(run("generate", world["classifier"], f"--classify={text}", "--device", "cpu", "--json"))
    else:
        text = f"{text} <|mask|>" if mask else text
        clean_end(run("generate", world["encoder"], f"--fill-mask={text}", "--device", "cpu"))


# ---- inspect --------------------------------------------------------------------------------------------


def _complete_or_absent(path: Path, kind: str) -> None:
    if not os.path.exists(path):  # (False for a name too long, where Path.exists raises)
        return
    data = path.read_bytes()
    if kind == "json":
        json.loads(data.decode("utf-8"))
    elif kind == "html":
        assert data.rstrip().endswith(b"</html>")
    else:
        assert data[:8] == b"\x89PNG\r\n\x1a\n"


@sweep(6)
@given(
    text=ARGV_TEXT,
    compare=st.none() | ARGV_TEXT,
    token=st.none() | ARGV_TEXT,
    kind=st.sampled_from(["json", "html", "terminal"]),
    out_name=FILE_NAME,
)
@example(text="hi \udcff there", compare=None, token=None, kind="json", out_name="a")  # found: a UnicodeEncodeError
def test_inspect_attention(world, scratch, text, compare, token, kind, out_name):
    folder = _fresh(scratch)
    out = folder / f"{out_name}.{kind}"
    args = ["inspect-attention", world["decoder"], f"--text={text}", "--device", "cpu", "-l", "0", "--head", "0"]
    args += [f"--compare={compare}"] if compare is not None else []
    args += [f"--token={token}"] if token is not None else []
    args += ["--format", kind] + (["-o", out] if kind != "terminal" else [])
    clean_end(run(*args))
    _complete_or_absent(out, kind)
    no_temp_files(folder)


@sweep(5)
@given(text=ARGV_TEXT, kind=st.sampled_from(["json", "html", "terminal"]), command=st.sampled_from(["inspect-logits", "inspect-ablate"]))
def test_inspect_logits_and_ablate(world, scratch, text, kind, command):
    folder = _fresh(scratch)
    out = folder / f"out.{kind}"
    args = [command, world["decoder"], f"--text={text}", "--device", "cpu"]
    args += ["--heads", "0.0"] if command == "inspect-ablate" else []
    args += ["--format", kind] + (["-o", out] if kind != "terminal" else [])
    clean_end(run(*args))
    _complete_or_absent(out, kind)


@sweep(5)
@given(clean=ARGV_TEXT, corrupt=ARGV_TEXT, answer=ARGV_TEXT, wrong=st.none() | ARGV_TEXT)
def test_inspect_patch(world, clean, corrupt, answer, wrong):
    args = ["inspect-patch", world["decoder"], f"--clean={clean}", f"--corrupt={corrupt}", f"--answer={answer}", "--device", "cpu", "--json"]
    args += [f"--wrong={wrong}"] if wrong is not None else []
    result = clean_end(run(*args))
    if result.code == 0:
        result.json()


# ---- inspect-features, inspect-embeddings ------------------------------------------------------------------

MEGABYTE = ("the fox \u2028 <|endoftext|> \u202e\u200f [MASK] ▁ " * 40_000)[: 1 << 20]  # a megabyte of a word, a text, a file
RAW_CONTROLS = [ch.encode() for ch in ("\x1b", "\u202e", "\u2028")]  # a terminal view shows them escaped, never sends them


def _shown_escaped(result: Ran, args) -> None:
    """A terminal view's output holds no control character, bidi override or line separator of the input raw."""
    if result.code == 0:
        assert not any(ch in result.stdout for ch in RAW_CONTROLS), (args, result.stdout[:3000])


@pytest.fixture(scope="module")
def sae(world) -> Path:
    """A random TopK SAE on the decoder's residual stream after block 0."""
    import torch

    from tfcli.sae.files import sae_config, save_sae
    from tfcli.sae.model import SparseAutoencoder

    torch.manual_seed(0)
    model = SparseAutoencoder(16, 32, "topk", k=4)
    save_sae(world["root"] / "sae", model, sae_config(model, "blocks.0.hook_resid_post"))
    return world["root"] / "sae"


@sweep(6)
@given(text=ARGV_TEXT, kind=st.sampled_from(["json", "html", "terminal", "stdout"]), out_name=FILE_NAME)
@example(text=MEGABYTE, kind="terminal", out_name="a")  # longer than the block size: one line
@example(text="the \x1b[31mfox\u202e\u2028 <|endoftext|>", kind="terminal", out_name="a")
def test_inspect_features_on_a_text(world, sae, scratch, text, kind, out_name):
    folder = _fresh(scratch)
    out = folder / f"{out_name}.{kind}"
    args = ["inspect-features", world["decoder"], "--sae", sae, f"--text={text}", "--device", "cpu"]
    args += {"stdout": ["--json"], "terminal": []}.get(kind, ["-o", out])
    result = clean_end(run(*args))
    if kind == "stdout" and result.code == 0:
        assert result.json()["text"] == text
    if kind == "terminal":
        _shown_escaped(result, args)
    _complete_or_absent(out, kind)
    no_temp_files(folder)


@sweep(5)
@given(content=FILE_TEXT, name=FILE_NAME, mode=st.sampled_from(["--text-file", "top", "feature"]), feature=st.integers(-2, 40), as_json=st.booleans())
@example(content=MEGABYTE, name="big", mode="feature", feature=3, as_json=False)
@example(content=MEGABYTE, name="big", mode="--text-file", feature=0, as_json=True)
def test_inspect_features_on_a_file(world, sae, scratch, content, name, mode, feature, as_json):
    """--text-file holds the text alone; --data the text and a story after it, so there are windows to read."""
    folder = _fresh(scratch)
    path = _write_name(folder, name + ".txt", file_bytes(content if mode == "--text-file" else content + "\n" + TINY_TEXT * 3))
    if path is None:
        return
    args = ["inspect-features", world["decoder"], "--sae", sae, "--device", "cpu"]
    if mode == "--text-file":
        args += ["--text-file", path]
    else:
        args += ["--data", path, "--windows", "4", "--context", "16", *(["--feature", feature] if mode == "feature" else [])]
    result = clean_end(run(*args, *(["--json"] if as_json else [])))
    if result.code == 0 and as_json:
        result.json()
    elif not as_json:
        _shown_escaped(result, args)


def _embedding_args(words: list[str], view: str) -> list[str]:
    """The words as --neighbours, --map or an --analogy takes them (an analogy of the first words, or one word as written)."""
    if view == "analogy":
        return ["--analogy", words[0] if len(words) == 1 else f"{words[0]} - {words[1]} + {words[-1]}"]
    return [f"--{view}", "--", *words]


@sweep(8)
@given(
    words=st.lists(ARGV_TEXT, min_size=1, max_size=3),
    view=st.sampled_from(["neighbours", "map", "analogy"]),
    which=st.sampled_from(["decoder", "encoder"]),
    strict=st.booleans(),
    output=st.sampled_from([None, "--json", "png", "html", "json"]),
    out_name=FILE_NAME,
)
@example(words=[MEGABYTE], view="neighbours", which="decoder", strict=False, output=None, out_name="a")  # a bounded note, not megabytes
@example(words=[MEGABYTE, "fox"], view="analogy", which="decoder", strict=False, output=None, out_name="a")
@example(words=["\x1b[31mred", "\u202efox", "ball"], view="analogy", which="decoder", strict=False, output=None, out_name="a")  # found: raw in the title
@example(words=["caf\udce9", "fox"], view="analogy", which="decoder", strict=False, output=None, out_name="a")  # found: a UnicodeEncodeError
@example(words=["<|endoftext|>", "[MASK]", "\u2028"], view="map", which="encoder", strict=False, output="html", out_name="a")
@example(words=[""], view="neighbours", which="decoder", strict=False, output=None, out_name="a")
def test_inspect_embeddings_words(world, scratch, words, view, which, strict, output, out_name):
    folder = _fresh(scratch)
    out = folder / f"{out_name}.{output}"
    args = ["inspect-embeddings", world[which], "-k", "3", *(["--strict"] if strict else [])]
    args += ["--json"] if output == "--json" else ["-o", out] if output is not None and view == "map" else []
    args += _embedding_args(words, view)
    result = clean_end(run(*args))
    if output == "--json" and result.code == 0:
        result.json()
    elif output is None:
        _shown_escaped(result, args)
        assert len(result.stdout) < 20_000, (args, len(result.stdout))  # a megabyte word's note is cut
    if output in ("png", "html", "json"):
        _complete_or_absent(out, output)
    no_temp_files(folder)


@sweep(4)
@given(content=FILE_TEXT, name=FILE_NAME, option=st.sampled_from(["--data", "--eval-analogies", "--eval-similarity"]), as_json=st.booleans())
@example(content=MEGABYTE[: 1 << 16], name="big", option="--data", as_json=False)  # (a megabyte is 1M tokens read, by design: seconds)
@example(content=MEGABYTE, name="big", option="--eval-analogies", as_json=False)
@example(content=MEGABYTE.replace(" ", "\n"), name="big", option="--eval-similarity", as_json=True)
def test_inspect_embeddings_files(world, scratch, content, name, option, as_json):
    """--data: contextual vectors over the text and a story after it; the evaluations: the text as questions,
    and one well-formed line after it."""
    tail = {"--data": "\n" + TINY_TEXT, "--eval-analogies": "\n: section\nthe fox the ball\n", "--eval-similarity": "\nfox ball 3.5\n"}[option]
    path = _write_name(_fresh(scratch), name + ".txt", file_bytes(content + tail))
    if path is None:
        return
    args = ["inspect-embeddings", world["decoder"], option, path, *(["--json"] if as_json else [])]
    args += ["--layer", "1", "--neighbours", "--", "fox"] if option == "--data" else []
    result = clean_end(run(*args))
    if result.code == 0 and as_json:
        result.json()
    elif not as_json:
        _shown_escaped(result, args)


# ---- eval -----------------------------------------------------------------------------------------------


@sweep(4)
@given(content=FILE_TEXT, name=FILE_NAME)
def test_eval_on_text(world, scratch, content, name):
    path = _write_name(_fresh(scratch), name + ".txt", file_bytes(content))
    if path is not None:
        clean_end(run("eval", world["decoder"], "--data", path, "--device", "cpu", "--max-batches", "1", "--json"))


# ---- train: --set, TOML, labels ---------------------------------------------------------------------------

SETTING_NAMES = ["d_model", "n_heads", "n_layers", "d_ff", "positions", "norm", "activation", "dropout", "lr", "warmup_steps"]
# (not time_budget, max_steps or eval_batches: a valid value there is a long run, not a hostile one)
SETTING_NAMES += ["schedule", "grad_clip", "seed", "beta2", "eps", "label_smoothing", "model.bias", "train.lr", "rope_base"]
SETTING_NAMES += ["mask_prob", "freeze", "block_size", "n_kv_heads", "tie_embeddings", "vocab_size", "nonsense"]

TOML_VALUE = st.one_of(
    st.integers(-3, 64).map(str),
    st.sampled_from(["1e999", "-0.0", "nan", "inf", "1e30", "99999999999999999999", "0x10", "true", "[1, 2]", "{a = 1}", '"rotary"', "'swiglu'"]),
    st.sampled_from(["rotary", "rmsnorm", "swiglu", "90s", "cosine", "body"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    ARGV_TEXT,
)


@sweep(5)
@given(sets=st.lists(st.tuples(st.sampled_from(SETTING_NAMES), TOML_VALUE), max_size=3), raw=st.none() | ARGV_TEXT)
def test_train_set_values(world, scratch, sets, raw):
    out = _fresh(scratch) / "run"
    args = ["train", "pretrain", "--data", world["shards"], "-o", out, "--max-steps", "1", "--batch-size", "2", "--block-size", "16", "--device", "cpu"]
    args += ["--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "eval_batches=1"]
    for name, value in sets:
        args += ["--set", f"{name}={value}"]
    if raw is not None:
        args += ["--set", raw]
    clean_end(run(*args))
    if os.path.exists(out):
        from tfcli.checkpoint import load_checkpoint

        load_checkpoint(out)
    no_temp_files(out.parent)


def _toml_key(name: str) -> str:
    return name if name.replace("_", "").replace(".", "").isalnum() else json.dumps(name)


@sweep(4)
@given(
    entries=st.lists(st.tuples(st.sampled_from(SETTING_NAMES) | ARGV_TEXT, TOML_VALUE), max_size=4),
    section=st.sampled_from(["", "[model]\n", "[train]\n", "preset = 'tiny'\n", "[[model]]\n"]),
    garbage=st.none() | FILE_TEXT,
    name=FILE_NAME,
)
def test_train_toml_config(world, scratch, entries, section, garbage, name):
    folder = _fresh(scratch)
    lines = [f"{_toml_key(key)} = {value}" for key, value in entries]
    text = section + "\n".join(lines) + "\n" + (garbage or "")
    config = _write_name(folder, name + ".toml", file_bytes(text))
    if config is None:
        return
    out = folder / "run"
    args = ["train", "pretrain", "--data", world["shards"], "-o", out, "--config", config, "--max-steps", "1", "--batch-size", "2", "--block-size", "16"]
    clean_end(run(*args, "--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "eval_batches=1", "--device", "cpu"))
    no_temp_files(folder)


LABEL = st.one_of(ARGV_TEXT, st.integers(-2, 3), st.booleans(), st.none(), st.floats(), st.lists(st.integers(), max_size=2), st.sampled_from(["pos", "neg"]))


@sweep(3)
@given(records=st.lists(st.tuples(FILE_TEXT, LABEL), min_size=1, max_size=6), raw_line=st.none() | FILE_TEXT)
def test_finetune_labels(world, scratch, records, raw_line):
    folder = _fresh(scratch)
    lines = [json.dumps({"text": text, "label": label}) for text, label in records]
    lines += [json.dumps({"text": "the fox", "label": "pos"}), json.dumps({"text": "the dog", "label": "neg"})]
    if raw_line is not None:
        lines.insert(1, raw_line.replace("\n", " "))
    data = folder / "labels.jsonl"
    data.write_bytes(file_bytes("\n".join(lines)))
    out = folder / "run"
    result = clean_end(
        run(
            "train",
            "finetune",
            "--init-from",
            world["decoder"],
            "--task",
            "classify",
            "--data",
            data,
            "-o",
            out,
            "--max-steps",
            "1",
            "--batch-size",
            "2",
            "--set",
            "eval_batches=1",
        )
    )
    if result.code == 0:
        from tfcli.checkpoint import load_checkpoint

        labels = load_checkpoint(out).config.training["labels"]
        assert len(labels) == len(set(labels)) >= 2
    no_temp_files(folder)


def test_a_model_larger_than_memory_is_refused_before_it_is_built(world, scratch):
    out = scratch / "big"
    args = ["train", "pretrain", "--data", world["shards"], "-o", out, "--max-steps", "1", "--device", "cpu"]
    result = clean_end(run(*args, "--set", "d_model=1024", "--set", "n_layers=8", "--set", "n_heads=8"))
    assert result.code == 2 and "GB for their weights alone; this machine has 0.1 GB" in result.stderr, result.stderr
    assert not out.exists()


# ---- info, export, import ----------------------------------------------------------------------------------


@sweep(3)
@given(name=FILE_NAME, as_json=st.booleans())
def test_info_export_import_with_odd_names(world, scratch, name, as_json):
    import shutil

    folder = _fresh(scratch)
    try:
        run_dir = Path(shutil.copytree(world["decoder"], folder / name))
    except OSError:
        return
    result = clean_end(run("info", run_dir, *(["--json"] if as_json else [])))
    if as_json and result.code == 0:
        result.json()
    exported = folder / f"{name} hf"
    clean_end(run("export", run_dir, "-o", exported))
    if os.path.exists(exported):
        clean_end(run("import", exported, "-o", folder / f"{name} back"))
    no_temp_files(folder)
