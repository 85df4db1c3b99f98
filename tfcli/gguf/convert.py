"""Export a run to one GGUF file llama.cpp loads (f32, f16, q8_0; bf16, q4_0, q4_k_m in tfcli.quant's formats, and a
quantized run's own blocks as they are), and import a GGUF file into a run.

Export writes with `gguf`'s own writer, under the names and conventions of llama.cpp's converter, into a
temp file beside the target (.NAME.<random>.tmp, locked while it is written) renamed into place at the end.
Import parses the file with `tfcli.gguf.reader` (bounded, every tensor checked to lie inside the file),
builds the config, reads each tensor it expects and checks its shape, then saves a run directory as
`tfcli import` does for a Hugging Face folder, in a staging folder beside it (.RUN.<random>.tmp) that
becomes the run at the end. Either way a kill -9 leaves the temp file or the staging folder, which the
next export or import to the same place removes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tfcli.checkpoint import TIED_KEY, model_from_tensors, save_checkpoint
from tfcli.errors import TfcliError
from tfcli.fsutil import (
    artifact_kind,
    atomic_write_json,
    atomic_write_text,
    describe_write_error,
    fsync_dir,
    fsync_file,
    held_temp_file,
    held_temp_folder,
    place_folder,
    prepare_output_dir,
    remove_abandoned_temps,
    set_default_mode,
)
from tfcli.gguf.layout import (
    EXTRA_TENSORS,
    IMPORT_ARCHS,
    config_from_gguf,
    export_arch,
    export_notes,
    extra_tensors,
    hyperparameters,
    permute_heads,
    tensor_layout,
    unpermute_heads,
    window_as_context,
)
from tfcli.gguf.reader import READABLE_TYPES, GgufFile, read_gguf, refused_type
from tfcli.gguf.vocab import Vocab, end_of_generation_keys, llama_cpp_only_ends_note, tokenizer_metadata
from tfcli.loader import load_run
from tfcli.meta_device import on_meta_device
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.quant.formats import quantize, scales_finite
from tfcli.quant.mix import gguf_format, plan
from tfcli.quant.tensors import read_quantized
from tfcli.rundir import CONFIG_FILE, WEIGHTS_FILE, read_run_config, refuse_other_artifacts
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer

if TYPE_CHECKING:
    import numpy as np

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock
    fcntl = None

TYPES = ("f32", "f16", "q8_0", "bf16", "q4_0", "q4_k_m")
# general.file_type (llama.cpp's LLAMA_FTYPE_ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16, MOSTLY_Q4_0, MOSTLY_Q4_K_M)
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32, "q4_0": 2, "q4_k_m": 15}
BLOCK_TYPES = ("bf16", "q4_0", "q4_k_m")  # written with tfcli.quant's formats, as llama-quantize mixes them; and any block type from a quantized run
# Keys outside the architecture's and the tokenizer's namespaces that import reads or that only describe
GENERAL_PREFIXES = ("general.", "quantize.imatrix.")


@dataclasses.dataclass
class Exported:
    arch: str
    tensors: int
    bytes: int
    tokenizer_model: str
    notes: list[str] = dataclasses.field(default_factory=list)  # what llama.cpp computes otherwise than tfcli, for the CLI to print
    removed: list[Path] = dataclasses.field(default_factory=list)  # temp files a killed export of the same file left


@dataclasses.dataclass
class Imported:
    config: ModelConfig
    arch: str
    parameters: int
    types: dict[str, int]  # tensors read, by GGUF type
    removed: list[Path] = dataclasses.field(default_factory=list)  # staging folders a killed import to the same place left
    notes: list[str] = dataclasses.field(default_factory=list)  # what llama.cpp's loader tolerates and tfcli did with it, for the CLI to print


def _stored(tensor: torch.Tensor, kind: str) -> tuple[np.ndarray, Any]:
    """A tensor as the writer stores it: norms and biases (1-D) stay f32, matrices take `kind` (q8_0 falls
    back to f16 for rows that are not a multiple of its block of 32, as llama.cpp's converter does)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    values = tensor.detach().to("cpu").float().numpy()
    if values.ndim == 1 or kind == "f32":
        return values, GGMLQuantizationType.F32
    if kind == "q8_0" and values.shape[-1] % 32 == 0:
        return quantize(values, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
    return values.astype("float16"), GGMLQuantizationType.F16


def gguf_path(run_dir: Path, output: str | Path) -> Path:
    """Where `export --to gguf -o OUTPUT` writes: OUTPUT, or OUTPUT/<run name>.gguf where OUTPUT is a folder that
    exists (llama.cpp's converter names the file in a folder given as --outfile too) or ends in "/" (made).
    Example: gguf_path("runs/mine", "out/") -> Path("out/mine.gguf")"""
    text = str(output)
    if not text.endswith(("/", os.sep)) and not Path(text).is_dir():
        return Path(text)
    kind = artifact_kind(Path(text)) if Path(text).is_dir() else None
    if kind is not None:  # a run, shard or tokenizer folder holds its own files only
        raise TfcliError(f"{text} is {kind}; the GGUF file would be written into it", hint="pass a file path such as model.gguf, or another folder, with -o")
    return Path(text) / f"{Path(run_dir).resolve().name or 'model'}.gguf"


# the file type a quantized run's blocks go out as, by the format most of its tensors hold (tfcli quantize's types)
TYPE_OF_FORMAT = {"q8_0": "q8_0", "q4_0": "q4_0", "q4_K": "q4_k_m", "q6_K": "q4_k_m", "bf16": "bf16"}


def default_type(run_dir: Path) -> str:
    """The type a run goes out in when --type is not given: f32, or a quantized run's own blocks (as they are),
    named by the format most of its tensors hold. Example: {"...qkv.weight": "q4_K", "lm_head.weight": "q6_K", ...} -> "q4_k_m"."""
    formats = list((read_run_config(run_dir).quantized or {}).values())
    if not formats:
        return "f32"
    return TYPE_OF_FORMAT.get(max(set(formats), key=formats.count), "f32")


@contextlib.contextmanager
def _sole_export(out_path: Path) -> Iterator[None]:
    """Hold .NAME.lock beside `out_path` while the file is made, so a second export to it at once is refused
    (both once wrote it and said so, the last one's file kept), and look again under the lock that it is not
    there. The lock file is removed at the end, while still held."""
    if fcntl is None:  # not a POSIX system: no lock
        yield
        return
    lock = out_path.parent / f".{out_path.name}.lock"
    try:
        handle = open(lock, "a")  # closed by the with below
    except OSError as exc:
        raise TfcliError(f"could not write {out_path}: {describe_write_error(exc)}", hint="check the folder's permissions, or choose another -o") from exc
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise TfcliError(f"another process is exporting to {out_path}", hint="wait for it to finish, or export to another path with -o") from None
        try:
            if out_path.exists():
                raise TfcliError(f"{out_path} already exists", hint="export to another path with -o, or delete that file first")
            yield
        finally:
            lock.unlink(missing_ok=True)


def export_gguf(run_dir: Path, out_path: Path, kind: str = "f32") -> Exported:
    """Write the run as one GGUF file (an adapter run is merged first) at `out_path` (see `gguf_path` for a folder)."""
    import gguf

    if kind not in TYPES:
        raise TfcliError(f"unknown GGUF type {kind!r}", hint=f"use one of {', '.join(TYPES)}")
    out_path = Path(out_path)
    if out_path.exists():
        raise TfcliError(f"{out_path} already exists", hint="export to another path with -o, or delete that file first")
    if out_path.parent.exists() and not out_path.parent.is_dir():
        raise TfcliError(f"{out_path.parent} is not a folder", hint="pass a file path with -o")
    read_run_config(run_dir)
    checkpoint = load_run(run_dir, "export-gguf")
    config, window_note = window_as_context(checkpoint.config.model)
    arch = export_arch(config)
    tokenizer_config = _tokenizer_config(checkpoint.tokenizer)
    vocab = tokenizer_metadata(checkpoint.tokenizer, config.vocab_size, tokenizer_config)
    end_keys, end_note = end_of_generation_keys(checkpoint.tokenizer, vocab["tokenizer.ggml.tokens"], tokenizer_config)
    vocab.update(end_keys)
    only_ends_note = llama_cpp_only_ends_note(checkpoint.tokenizer, vocab, tokenizer_config)
    state = checkpoint.model.state_dict()
    formats, held, quantized_note = _export_formats(Path(run_dir), checkpoint, state, kind)
    name, renamed = _general_name(Path(run_dir).resolve().name, vocab["tokenizer.ggml.tokens"])
    notes = export_notes(config, arch) + [note for note in (window_note, renamed, quantized_note, end_note, only_ends_note) if note]
    folder = prepare_output_dir(out_path.parent if str(out_path.parent) else Path("."), "export")
    with _sole_export(out_path):  # two exports to one file at once: the second is refused
        removed = remove_abandoned_temps(out_path)
        try:
            with held_temp_file(out_path) as tmp:
                writer = gguf.GGUFWriter(str(tmp), arch)
                try:
                    writer.add_name(name)
                    writer.add_type("model")
                    writer.add_file_type(FILE_TYPES[kind])
                    if kind in ("q8_0", "q4_0", "q4_k_m"):
                        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
                    for key, value in hyperparameters(config, arch).items():
                        _add(writer, f"{arch}.{key}", value)
                    for key, value in vocab.items():
                        _add(writer, key, value)
                    count = 0
                    for name, values in extra_tensors(config, arch).items():  # rope_freqs, rope_factors_*: f32, as the converter writes them
                        writer.add_tensor(name, values.numpy())
                        count += 1
                    for entry in tensor_layout(config, arch):
                        if entry.ours in formats:  # block formats (tfcli.quant): a quantized run's own bytes, or quantized now
                            values, raw_type = _block_tensor(entry, state, formats, held, kind)
                            writer.add_tensor(entry.name, values, raw_dtype=raw_type)
                            count += 1
                            continue
                        tensor = state[entry.ours]
                        if entry.stop:
                            tensor = tensor[entry.start : entry.stop]
                        if entry.heads:
                            tensor = permute_heads(tensor, entry.heads)
                        values, raw_type = _stored(tensor, kind)
                        writer.add_tensor(entry.name, values, raw_dtype=raw_type)
                        count += 1
                    writer.write_header_to_file()
                    writer.write_kv_data_to_file()
                    writer.write_tensors_to_file()
                except OSError as exc:
                    raise _with_cause(exc, tmp) from exc
                finally:
                    with contextlib.suppress(OSError):  # a full disk fails the last flush too
                        writer.close()
                set_default_mode(tmp)
                fsync_file(tmp)
                os.replace(tmp, out_path)
        except OSError as exc:
            raise TfcliError(
                f"could not write {out_path}: {describe_write_error(exc)}", hint="check the free space and the folder's permissions, or choose another -o"
            ) from exc
        fsync_dir(folder)
    return Exported(arch, count, out_path.stat().st_size, vocab["tokenizer.ggml.model"], notes, removed)


def _export_formats(run_dir: Path, checkpoint, state: dict[str, torch.Tensor], kind: str) -> tuple[dict[str, str], dict[str, Any], str | None]:
    """Which of the run's tensors go out in a block format (name -> format), the block bytes a quantized run holds
    (written as they are), and a note where --type does not decide the formats. f32, f16 and q8_0 from an f32 run
    keep their own writing (`_stored`)."""
    held_formats = checkpoint.config.quantized or {}
    if held_formats and kind not in ("f32", "f16"):
        tied = checkpoint.config.model.tie_embeddings
        expected = {n: tuple(t.shape) for n, t in state.items() if not (tied and n == "lm_head.weight")}
        held = {n: t for n, t in read_quantized(run_dir / WEIGHTS_FILE, expected, held_formats, run_dir / CONFIG_FILE).items() if n in held_formats}
        mine = ", ".join(sorted(set(held_formats.values())))
        return (
            dict(held_formats),
            held,
            f"wrote the run's own {mine} blocks as they are (--type picks the formats of an f32 run's export; --type f32 writes these dequantized)",
        )
    if held_formats:
        mine = ", ".join(sorted(set(held_formats.values())))
        return {}, {}, f"wrote the run's {mine} weights dequantized, as {kind} (--type {kind}; without --type they go out in their own blocks)"
    if kind not in BLOCK_TYPES:
        return {}, {}, None
    config = checkpoint.config.model
    shapes = {n: tuple(t.shape) for n, t in state.items() if not (config.tie_embeddings and n == "lm_head.weight")}
    return plan(shapes, kind, config.decoder_layers, config.tie_embeddings), {}, None


def _block_tensor(entry, state: dict[str, torch.Tensor], formats: dict[str, str], held: dict[str, Any], kind: str) -> tuple[np.ndarray, Any]:
    """One GGUF tensor in its block format: rows start:stop of the run's tensor (llama.cpp's row order inside
    each head where it has one): cut from the held bytes (rows are whole blocks), or quantized now."""
    from gguf.constants import GGMLQuantizationType

    blocks = held.get(entry.ours)
    source = blocks.data if blocks is not None else state[entry.ours]
    if entry.stop:
        source = source[entry.start : entry.stop]
    if entry.heads:
        source = permute_heads(source, entry.heads)
    columns = state[entry.ours].shape[1]
    fmt = formats[entry.ours] if blocks is not None else gguf_format(kind, formats[entry.ours], entry.name, bool(entry.stop), columns)
    data = source.contiguous().numpy() if blocks is not None else quantize(source.detach().float().contiguous().numpy(), fmt)
    return data, GGMLQuantizationType[fmt.upper()]


# llama.cpp's vocabulary loader gives a model whose general.name holds "phi3" or "phi-3" Phi-3's own token
# attributes, looking these tokens up without checking they exist (llama_vocab::impl::load: an exception, and
# the file does not load, when one is missing)
PHI3_NAMES, PHI3_TOKENS = ("phi-3", "phi3"), ("</s>", "<unk>", "<s>", "<|endoftext|>")


def _general_name(name: str, tokens: list[str]) -> tuple[str, str | None]:
    """general.name: the run folder's name, unless llama.cpp would take it for Phi-3's vocabulary, which this
    tokenizer is not; then with a space before the '3', and a note saying why."""
    if not any(part in name.lower() for part in PHI3_NAMES) or set(PHI3_TOKENS) <= set(tokens):
        return name, None
    written = re.sub(r"(?i)(phi)-?(3)", r"\1 \2", name)
    return written, (
        f"general.name is {written!r}, not {name!r}: llama.cpp gives a model named phi3 Phi-3's token attributes "
        f"and does not load one whose vocabulary lacks {', '.join(PHI3_TOKENS)}"
    )


def _with_cause(exc: OSError, tmp: Path) -> OSError:
    """The error itself, or for numpy's report of a short write ("16384 requested and 8696 written", which
    drops the system's reason: a full disk, a quota) the reason, found by writing on at the file's end."""
    if exc.errno is not None:
        return exc
    try:
        with open(tmp, "ab", buffering=0) as handle:
            for _ in range(2):  # the first write may take what room is left
                handle.write(bytes(1 << 16))
    except OSError as cause:
        return cause
    return exc


def _add(writer, key: str, value: Any) -> None:
    """One metadata key with the type llama.cpp's converter gives it: counts and ids u32, floats f32, lists
    of ints i32 (token types), of floats f32 (scores), of strings (tokens, merges)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, value)


def _tokenizer_config(tokenizer: TextTokenizer) -> dict[str, Any]:
    path = tokenizer.path.parent / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _check_keys(metadata: dict[str, Any], arch: str, where: str) -> None:
    """Every key is the architecture's, the tokenizer's or descriptive; a split file is refused."""
    if metadata.get("split.count", 1) != 1:
        raise TfcliError(
            f"{where} is one part of a split model (metadata split.count)", hint="merge the parts first: llama-gguf-split --merge FIRST.gguf OUT.gguf"
        )
    for key in metadata:
        if key.startswith((f"{arch}.", "tokenizer.", *GENERAL_PREFIXES)) or key in ("split.count", "split.no", "split.tensors.count"):
            continue
        raise TfcliError(f"{where}: metadata {key} is not something tfcli can express", hint=f"tfcli reads {arch}'s, the tokenizer's and general keys")


def _unknown_architecture(arch: Any, metadata: dict[str, Any], where: str) -> TfcliError:
    if arch == "bert":
        return TfcliError(
            f"{where} is a BERT encoder (general.architecture 'bert'), which tfcli does not import from GGUF; it imports the decoders {', '.join(IMPORT_ARCHS)}",
            hint="import BERT from its Hugging Face folder: tfcli import FOLDER -o RUN",
        )
    return TfcliError(f"{where}: metadata general.architecture is {arch!r}; tfcli imports {', '.join(IMPORT_ARCHS)}")


# the GGUF tensor types tfcli decodes natively (tfcli.quant's block formats): kept in their blocks on import
NATIVE = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_K": "q4_K", "Q6_K": "q6_K", "BF16": "bf16"}
FUSED = {"qkv": "q/k/v", "fc": "gate/up"}  # tfcli's matrices that llama.cpp's files may hold in parts


def _kept_types(file: GgufFile, layout: list, config: ModelConfig) -> tuple[dict[str, str], list[str]]:
    """tfcli tensor -> block format, for the matrices whose GGUF tensors are all of one type tfcli decodes natively
    (NATIVE) and that tfcli holds quantized (the token embedding and the linear layers' weights); and the fused
    matrices left out because their parts differ in type (Q4_K_M's attn_q and attn_k in Q4_K, attn_v in Q6_K, which
    tfcli holds as one q/k/v matrix: blocks concatenate only within one type, so that one is dequantized)."""
    with on_meta_device():
        model = Transformer(config)
    sources: dict[str, set[str]] = {}
    for entry in layout:
        sources.setdefault(entry.ours, set()).add(file.tensors[entry.name].kind.name if entry.name in file.tensors else "")
    kept, mixed = {}, []
    for ours, kinds in sources.items():
        module, _, leaf = ours.rpartition(".")
        if leaf != "weight" or not (ours == "tok_emb.weight" or isinstance(model.get_submodule(module), torch.nn.Linear)):
            continue
        if not kinds <= set(NATIVE):
            continue
        if len(kinds) > 1:
            mixed.append(ours)
            continue
        kept[ours] = NATIVE[kinds.pop()]
    return kept, mixed


def _stored_note(file: GgufFile, layout: list, kept: dict[str, str], mixed: list[str], state: dict[str, torch.Tensor]) -> str | None:
    """One line naming the types kept in their blocks and those widened to f32 (every other type but F32, and the
    fused matrices whose parts differ in type), and what the run holds against the file's tensors."""
    kinds = {entry.name: file.tensors[entry.name].kind.name for entry in layout}
    kept_kinds = sorted({kinds[e.name] for e in layout if e.ours in kept})
    wide_kinds = sorted({kinds[e.name] for e in layout if e.ours not in kept and e.ours not in mixed and kinds[e.name] != "F32"})
    if not kept_kinds and not wide_kinds and not mixed:
        return None
    stored = sum(info.nbytes for info in file.tensors.values())
    held = sum(t.numel() * t.element_size() for t in state.values())
    cost = f"{held / stored:.1f}x the file's {stored:,} bytes of tensors ({held:,} bytes) in memory and on disk"
    if not kept_kinds and not mixed:
        return f"dequantized the {', '.join(wide_kinds)} tensors to f32: the run holds f32 weights, {cost}"
    widened = []
    if wide_kinds:
        widened.append(f"the {', '.join(wide_kinds)} tensors")
    if mixed:
        fused = sorted({FUSED.get(name.rsplit(".", 2)[-2], name.rsplit(".", 2)[-2]) for name in mixed})
        parts = sorted({f"{e.name.split('.')[-2]} {kinds[e.name]}" for e in layout if e.ours in mixed})
        widened.append(
            f"{len(mixed)} fused {' and '.join(fused)} {'matrix' if len(mixed) == 1 else 'matrices'} whose parts differ in type "
            f"({', '.join(parts)}: tfcli holds each as one matrix, and blocks join only within one type)"
        )
    kept_text = f"kept the {', '.join(kept_kinds)} tensors in their blocks" if kept_kinds else "kept no tensor in its blocks"
    widened_text = f"; dequantized {' and '.join(widened)} to f32" if widened else ""
    return f"{kept_text}{widened_text}: the run holds {cost}"


def _held(folder: Path) -> str:
    """What a folder with a config.json or model.safetensors holds: a tfcli run, or a model of another tool (a
    Hugging Face folder)."""
    try:
        read_run_config(folder)
    except TfcliError:
        return "a model"
    return "a tfcli run"


def import_gguf(src: Path, run_dir: Path) -> Imported:
    """Read a GGUF file (nothing in it is executed) and save it as a tfcli run directory."""
    src, run_dir = Path(src), Path(run_dir)
    if (run_dir / CONFIG_FILE).exists() or (run_dir / WEIGHTS_FILE).exists():
        raise TfcliError(f"{run_dir} already holds {_held(run_dir)}", hint="import into another folder with -o, or delete that one first")
    refuse_other_artifacts(run_dir, "imported run")
    file = read_gguf(src)
    where = str(src)
    arch = file.metadata.get("general.architecture")
    if arch not in IMPORT_ARCHS:
        raise _unknown_architecture(arch, file.metadata, where)
    _check_keys(file.metadata, arch, where)
    vocab = Vocab(file.metadata, where)
    for info in file.tensors.values():
        if info.kind not in READABLE_TYPES:
            raise refused_type(src, info)
    config, notes = config_from_gguf(file.metadata, arch, len(vocab.tokens), file.tensors, file.read, where)
    with on_meta_device():
        expected = {name: tuple(t.shape) for name, t in Transformer(config).state_dict().items()}
    layout = tensor_layout(config, arch)
    known = {entry.name for entry in layout} | set(EXTRA_TENSORS.get(arch, ()))
    unknown = sorted(set(file.tensors) - known)
    if unknown:
        raise TfcliError(f"{where}: tensor {unknown[0]} is not part of tfcli's {arch} model", hint=f"tfcli imports plain {', '.join(IMPORT_ARCHS)} models")
    kept, mixed = _kept_types(file, layout, config)
    parts: dict[str, list[torch.Tensor]] = {}
    types: dict[str, int] = {}
    for entry in layout:
        want = expected[entry.ours]
        want = (entry.stop - entry.start, *want[1:]) if entry.stop else want
        info = file.tensors.get(entry.name)
        if info is None:
            raise TfcliError(f"{where} lacks the tensor {entry.name}", hint=f"the file is incomplete, or not a plain {arch} model")
        if info.shape != want:
            raise TfcliError(f"{where}: tensor {entry.name} has shape {list(info.shape)}, but the metadata implies {list(want)}")
        if entry.ours in kept:  # the block bytes as they are: rows are whole blocks, so llama.cpp's row order undoes row by row
            tensor = file.read_blocks(entry.name)
            finite = scales_finite(tensor.numpy(), kept[entry.ours])
        else:
            tensor = file.read(entry.name)
            finite = bool(tensor.isfinite().all())
        if not finite:
            raise TfcliError(f"{where}: tensor {entry.name} holds non-finite values")
        parts.setdefault(entry.ours, []).append(unpermute_heads(tensor, entry.heads) if entry.heads else tensor)
        types[info.kind.name] = types.get(info.kind.name, 0) + 1
    state = {name: torch.cat(chunks) if len(chunks) > 1 else chunks[0] for name, chunks in parts.items()}
    del parts
    stored = _stored_note(file, layout, kept, mixed, state)
    notes = vocab.notes + notes + ([stored] if stored else [])
    if kept:
        with on_meta_device():
            model = Transformer(config)  # its config only: the tensors saved are `state`'s
        parameters = sum(math.prod(shape) for shape in expected.values()) - (math.prod(expected[TIED_KEY]) if config.tie_embeddings else 0)
    else:
        model = model_from_tensors(config, state)
        parameters = model.parameter_count()
    tokenizer_text = vocab.tokenizer_json()
    if run_dir.exists() and not run_dir.is_dir():
        raise TfcliError(f"run path {run_dir} is a file, not a folder", hint="pass a folder path with -o")
    target = run_dir.absolute()
    prepare_output_dir(target.parent, "run")
    removed = remove_abandoned_temps(target)
    with held_temp_folder(target) as staged:  # the run is made whole here, then put in place
        atomic_write_text(staged / TOKENIZER_FILE, tokenizer_text)
        atomic_write_json(staged / TOKENIZER_CONFIG_FILE, vocab.tokenizer_config(config.block_size))
        tokenizer = TextTokenizer.load(staged / TOKENIZER_FILE)
        save_checkpoint(staged, model, tokenizer, source=str(src), quantized=(kept, state) if kept else None)
        place_folder(staged, target, last=(WEIGHTS_FILE, CONFIG_FILE))  # a folder holds a run once they are there
    return Imported(config, arch, parameters, types, removed, notes)
