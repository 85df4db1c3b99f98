"""What the bench commands share: the machine line beside every table, the table of trainers side by side and
its verdict, tfcli.accel's choices, the scratch folder (their options are in cli/options.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import platform
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tfcli.cli.common import counted, print_table, stdout_console


def machine_line() -> str:
    """The processor as lscpu names it, its vector extensions, cores, Python and torch: beside every table."""
    import os

    from tfcli.accel.machine import processor_name, vector_extensions

    torch_version = ""
    try:
        from importlib.metadata import version

        torch_version = f", torch {version('torch')}"
    except Exception:  # no metadata: leave it out
        pass
    return (
        f"{processor_name()} ({' '.join(vector_extensions()) or 'no vector extensions listed'}), {counted(os.cpu_count() or 0, 'core')}, "
        f"Python {platform.python_version()}{torch_version}"
    )


def print_comparison(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], summary: str) -> None:
    """Print a table of the jobs compared (the first column names each, left; the figures right) and under it
    the line that compares them, to stdout."""
    from rich.table import Table

    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    out = stdout_console()
    print_table(out, table)
    out.print(summary)


def verdict(met: bool) -> str:
    """How a bench's summary line says whether its target was met."""
    return "ok" if met else "MISSED"


def accel_summary() -> str:
    """What tfcli.accel chose on this machine so far, kind by kind (`tfcli info --device` lists each)."""
    from collections import Counter

    from tfcli.accel import enabled, report

    if not enabled():
        return "none (TFCLI_ACCEL=0: plain PyTorch)"
    counts: Counter = Counter()
    for key, decision in report()["decisions"].items():
        counts[(key.split()[0], decision["choice"])] += 1
    kinds = {}
    for (kind, choice), count in sorted(counts.items()):
        kinds.setdefault(kind, []).append(f"{choice} {count}")
    return "; ".join(f"{kind}: {', '.join(parts)}" for kind, parts in kinds.items()) or "nothing measured yet"


def scratch_folder(workdir: Path | None, name: str = "") -> Path:
    """Where a bench writes: a new temporary folder, or --workdir (made if need be); `scratch` removes a temporary one afterwards."""
    import tempfile

    from tfcli.fsutil import prepare_output_dir

    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="tfcli-bench-"))
    return prepare_output_dir(workdir / name if name else workdir, "scratch", option="--workdir")


@contextlib.contextmanager
def scratch(workdir: Path | None, name: str = "") -> Iterator[Path]:
    """The scratch folder for a `with` block: a new temporary one, removed afterwards, or --workdir, kept."""
    import shutil

    folder = scratch_folder(workdir, name)
    try:
        yield folder
    finally:
        if workdir is None:
            shutil.rmtree(folder, ignore_errors=True)


# what each bench measures beside tfcli, and how to install it: (the module to find, what it is, the pip command)
PEERS = {
    "transformers": ("transformers", "Hugging Face transformers", "pip install 'tfcli[hf]'"),
    "llama.cpp": ("llama_cpp", "llama.cpp (llama-cpp-python)", "pip install llama-cpp-python"),
    "lm-eval": ("lm_eval", "EleutherAI's lm-evaluation-harness", "pip install 'tfcli[eval]'"),
    "sae-lens": ("sae_lens", "SAELens", "pip install 'tfcli[sae]'"),
    "gensim": ("gensim", "gensim's Word2Vec", "pip install 'tfcli[word2vec]'"),
}


def installed(module: str) -> bool:
    """Whether `module` can be imported here, found without importing it (transformers or SAELens take seconds).
    A module set to None in sys.modules counts as missing, as Python's import treats it."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_peer(command: str, peer: str) -> None:
    """Every bench compares tfcli with a peer; without the peer there is nothing to compare, so it stops before any
    work, in one line that says what to install. Example: require_peer("bench sae", "sae-lens") raises
    TfcliError("bench sae compares tfcli with SAELens, which is not installed; pip install 'tfcli[sae]'")."""
    from tfcli.errors import TfcliError

    module, name, install = PEERS[peer]
    if not installed(module):
        raise TfcliError(f"{command} compares tfcli with {name}, which is not installed", hint=install)
