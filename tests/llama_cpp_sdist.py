"""llama.cpp's own tokenizer test data, taken at test time from the llama-cpp-python source distribution the lock pins.

Provenance: the package llama-cpp-python, at the version requirements/test.txt pins (0.3.36 when this was written), whose
sdist (`pip download llama-cpp-python==VERSION --no-deps --no-binary :all:`, about 76 MB; CI downloads it anyway to
build llama.cpp) must have one of the lock's sha256 hashes (832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
for 0.3.36). It vendors llama.cpp (MIT licence, "Copyright (c) 2023-2026 The ggml authors", vendor/llama.cpp/LICENSE,
extracted beside the files): from its `models/` folder only the vocabulary-only GGUF files `ggml-vocab-*.gguf` with their
test vectors (`.inp`, `.out`, as llama.cpp's tests/test-tokenizer-0.cpp reads them), and its own converter
(convert_hf_to_gguf.py with conversion/ and gguf-py/, into converter/) are extracted, once per test cache
folder (`TFCLI_CACHE_DIR`, which the pytest-xdist workers of one run share), under a file lock, so one worker downloads
while the others wait. Nothing of it is committed.

`converted` turns a vocabulary into a Hugging Face tokenizer folder with transformers' own GGUF converter, once per cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "llama-cpp-python"
LOCK = Path(__file__).resolve().parents[1] / "requirements" / "test.txt"
# what is extracted from the sdist, relative to its vendor/llama.cpp/
WANTED = re.compile(r"models/ggml-vocab-[\w.-]+|LICENSE")
# llama.cpp's own HF-to-GGUF converter and the modules it imports (conversion/, gguf-py/), kept in their folders
CONVERTER = re.compile(r"convert_hf_to_gguf\.py|conversion/[\w/.-]+\.py|gguf-py/gguf/[\w/.-]+\.(?:py|json)")
DONE = ".complete"  # written last: a folder without it is an interrupted extraction


class Unavailable(Exception):
    """The sdist cannot be had here (no pip, no registry): the tests that need it skip, or fail under CI."""


def pinned() -> tuple[str, tuple[str, ...]]:
    """The version of llama-cpp-python the lock pins and its sha256 hashes."""
    text = LOCK.read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(PACKAGE)}==(\S+)((?:\s*\\\n\s*--hash=sha256:[0-9a-f]{{64}})+)", text, re.MULTILINE)
    assert match, f"{LOCK} pins no {PACKAGE} with hashes"
    return match.group(1), tuple(re.findall(r"sha256:([0-9a-f]{64})", match.group(2)))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` while the block runs (the other workers wait)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _download(version: str, hashes: tuple[str, ...], into: Path) -> Path:
    """The sdist, fetched by pip with the lock's hashes required (pip refuses any other bytes)."""
    requirement = into / "requirement.txt"
    requirement.write_text(f"{PACKAGE}=={version} " + " ".join(f"--hash=sha256:{h}" for h in hashes) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes", "--quiet"]
    command += ["--disable-pip-version-check", "-r", str(requirement), "-d", str(into)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"pip download {PACKAGE}=={version} failed: {exc}") from None
    found = sorted(into.glob("*.tar.gz"))
    assert "DO NOT MATCH THE HASHES" not in done.stderr, f"the registry's {PACKAGE}=={version} is not the one the lock pins: {done.stderr}"
    if done.returncode != 0 or len(found) != 1:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise Unavailable(f"pip download {PACKAGE}=={version} (the sdist) failed: {last}")
    return found[0]


def _extract(sdist: Path, folder: Path) -> None:
    """The vocabularies and LICENSE into FOLDER, the converter into FOLDER/converter/ (in its own folders)."""
    with tarfile.open(sdist, "r|gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            inside = "/".join(parts[3:]) if parts[1:3] == ["vendor", "llama.cpp"] else ""
            if not member.isfile():
                continue
            if WANTED.fullmatch(inside):
                target = folder / Path(inside).name
            elif CONVERTER.fullmatch(inside):
                target = folder / "converter" / inside
                target.parent.mkdir(parents=True, exist_ok=True)
            else:
                continue
            source = archive.extractfile(member)
            assert source is not None
            with open(target, "wb") as out:
                shutil.copyfileobj(source, out)


def models_folder(cache: Path) -> Path:
    """llama.cpp's vocabulary files (models/ggml-vocab-*) and its LICENSE, from the pinned sdist, made once per cache
    (its converter beside them, in converter/)."""
    version, hashes = pinned()
    folder = cache / f"llama.cpp-files-{PACKAGE}-{version}"
    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache / f"{folder.name}.lock"):
        if (folder / DONE).exists():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".sdist-") as scratch:
            sdist = _download(version, hashes, Path(scratch))
            digest = sha256(sdist)
            assert digest in hashes, f"{sdist.name}: sha256 {digest} is not one the lock has for {PACKAGE}=={version}"
            staged = Path(scratch) / "models"
            staged.mkdir()
            _extract(sdist, staged)
            (staged / DONE).write_text(f"{PACKAGE}=={version} sha256:{digest}\n", encoding="utf-8")
            os.replace(staged, folder)
    return folder


def converter_folder(cache: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py with conversion/ and gguf-py/ beside it, as the pinned sdist has them, from
    the one extraction `models_folder` makes (`python FOLDER/convert_hf_to_gguf.py HF_FOLDER --outfile F.gguf` runs
    it, on the gguf-py beside it)."""
    return models_folder(cache) / "converter"


def converted(models: Path, name: str, cache: Path) -> Path:
    """The vocabulary `ggml-vocab-NAME.gguf` as transformers reads a GGUF's tokenizer (its own converter,
    `convert_gguf_tokenizer`, picked by the file's tokenizer model and architecture), saved by `save_pretrained`:
    tokenizer.json and tokenizer_config.json. Once per cache, under a lock.

    The tokenizer class is `PreTrainedTokenizerFast`, whose from_pretrained(gguf_file=...) calls that converter
    directly; `AutoTokenizer` calls the same converter after reading the whole file a second time for the model's
    config (gguf's reader, seconds a vocabulary), which a tokenizer does not need."""
    import transformers

    folder = cache / f"hf-{transformers.__version__}" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with locked(folder.parent / f"{name}.lock"):
        if (folder / DONE).exists():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{name}-") as scratch:
            verbosity = transformers.logging.get_verbosity()
            transformers.logging.set_verbosity_error()  # the converter's notes on added tokens
            try:
                tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(models), gguf_file=f"ggml-vocab-{name}.gguf")
            finally:
                transformers.logging.set_verbosity(verbosity)
            staged = Path(scratch) / name
            tokenizer.save_pretrained(str(staged))
            (staged / DONE).write_text(f"ggml-vocab-{name}.gguf by transformers {transformers.__version__}\n", encoding="utf-8")
            os.replace(staged, folder)
    return folder


def vectors(models: Path, name: str) -> tuple[list[str], list[list[int]]] | None:
    """llama.cpp's inputs and expected ids for `ggml-vocab-NAME.gguf`, split as tests/test-tokenizer-0.cpp splits
    them (each input followed by a "\\n__ggml_vocab_test__\\n" line; one line of ids an input); None where it has none."""
    path = models / f"ggml-vocab-{name}.gguf"
    inp, out = path.with_name(path.name + ".inp"), path.with_name(path.name + ".out")
    if not inp.exists():
        return None
    separator = "\n__ggml_vocab_test__\n"
    raw = inp.read_bytes().decode("utf-8")
    inputs: list[str] = []
    pos = 0
    while pos < len(raw):
        end = raw.find(separator, pos)
        if end < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:end])
        pos = end + len(separator)
    lines = out.read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":  # getline gives no line after the last newline
        lines.pop()
    expected = [[int(token) for token in line.strip().split(" ") if token] for line in lines]
    assert len(inputs) == len(expected), f"{path.name}: {len(inputs)} inputs but {len(expected)} expected outputs"
    return inputs, expected
