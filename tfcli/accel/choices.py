"""Which candidate does each kind of work on this machine: timed on first use, checked against PyTorch,
remembered.

Each kind of work (a linear layer's product in one direction for one class of shapes, the loss over the
vocabulary, a decoding step) has candidates, PyTorch's own first. On first use the candidates run on inputs
of that shape; one whose result differs from PyTorch's is dropped, the others are timed in turns, and the
fastest is kept, but another candidate replaces PyTorch's only when it takes at most MARGIN of its time, so
noise never turns a tie into a slow-down. Decisions go into one small JSON file per processor and torch
version, beside the compiled C code; each decision's name holds the thread count it was measured at.
A file that cannot be read is set aside with a note and the decisions are measured again. Processes share
the file: one measures a decision while holding its lock (`choices-*.lock`), and one that wanted the same
decision meanwhile reads it from the file instead of measuring it again; each write is atomic and adds to
what the file holds then. Each decision records how busy the machine was while it was timed (`Load`): a
decision measured while other work held the cores may have kept a slower path, and `forget` removes
decisions (all, those measured busy, or a kind of work) so that the next runs measure them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tfcli.accel.build import exclusive, kernel_folder
from tfcli.accel.machine import machine_digest, processor_name
from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_json
from tfcli.jsontext import loads_json
from tfcli.schema import JsonRecord

VERSION = 1
MARGIN = 0.97  # another candidate replaces PyTorch's own only when it takes at most 97% of its time
BUDGET_S = 0.05  # each candidate is timed at least 3 times and until it has run this long (at most 20 times)
LOCK_WAIT_S = 120  # how long to wait for another process's measurement before measuring as well
BUSY_WAITED = 0.10  # measured on a busy machine: the timing's threads waited for a core more than 10% of their time
BUSY_PER_CORE = 1.25  # where the system does not say how long they waited: a load average above 1.25 per core
COUNTED_ENOUGH_NS = 20_000_000  # a timing whose threads ran and waited less than 20 ms together is too short to tell (Linux counts at ticks)
KINDS = {  # the kinds of work `forget` names, and how their decisions' names start (each made where the work is)
    "products": ("linear ",),  # products.py
    "loss": ("loss ",),  # fused_loss.py
    "decoding": ("decoder-step ", "compiled-step ", "compiled-rows"),  # decode_step.py, compiled_step.py
    "quantized": ("quant ", "quant-int8 ", "quant-bf16 "),  # quant.py
    "peak": ("peak matmul ",),  # tfcli/train/flops.py
}
ALL, BUSY = "all", "busy"  # what else `forget` takes: every decision, or those measured on a busy machine


@dataclasses.dataclass
class Load(JsonRecord):
    """How busy the machine was while a decision's candidates were timed."""

    waited: float | None = None  # the share of this process's threads' time spent waiting for a core (Linux's run delay); None where not known
    per_core: float | None = None  # the 1-minute load average over the logical cores when the timing ended; None where not known

    def busy(self) -> bool:
        """Whether other work held the cores: the timing waited for them, or (not known) the load average says so."""
        if self.waited is not None:
            return self.waited > BUSY_WAITED
        return self.per_core is not None and self.per_core > BUSY_PER_CORE


@dataclasses.dataclass
class Decision(JsonRecord):
    choice: str  # the candidate that does this work
    seconds: dict[str, float]  # each candidate's best time on the measured shape
    note: str = ""  # candidates left out, and why
    compile_seconds: float = 0.0  # a compiled candidate: how long compiling it took when it was measured
    load: Load | None = None  # how busy the machine was during the timing (None: measured by a tfcli that did not record it)

    def measured_busy(self) -> bool:
        return self.load is not None and self.load.busy()


@dataclasses.dataclass
class ChoicesFile(JsonRecord):
    version: int
    processor: str
    torch: str
    decisions: dict[str, Decision]


@dataclasses.dataclass
class _FileOnDisk(JsonRecord):
    """The file as `ChoicesFile`, each decision read on its own (`Choices._on_disk`)."""

    version: int
    processor: str
    torch: str
    decisions: dict[str, dict[str, Any]]


def measure(
    candidates: dict[str, Callable[[], Any]], same: Callable[[Any, Any], bool], *, sync: Callable[[], None] = lambda: None, budget_s: float = BUDGET_S
) -> Decision:
    """Run each candidate once and compare its result with the first's, then time the ones that agree in
    turns and keep the fastest. The first candidate is the default (PyTorch's own, for products): another
    replaces it only when it takes at most MARGIN of its time."""
    notes: list[str] = []
    usable: dict[str, Callable[[], Any]] = {}
    reference: Any = None
    for name, run in candidates.items():
        try:
            result = run()
            sync()
        except Exception as error:  # a candidate that fails is simply not used
            notes.append(f"{name} failed ({type(error).__name__}: {error})")
            continue
        if not usable:
            reference = result
        elif not same(reference, result):
            notes.append(f"{name} disagreed with PyTorch")
            continue
        usable[name] = run
    if not usable:
        raise RuntimeError("no candidate ran: " + "; ".join(notes))
    best = dict.fromkeys(usable, math.inf)
    spent = dict.fromkeys(usable, 0.0)
    threads_before = thread_times()
    for turn in range(20):
        for name, run in usable.items():
            sync()
            started = time.perf_counter()
            run()
            sync()
            elapsed = time.perf_counter() - started
            best[name], spent[name] = min(best[name], elapsed), spent[name] + elapsed
        if min(spent.values()) >= budget_s and (turn >= 2 or min(spent.values()) >= 1.0):
            break  # three turns, or one for work that takes a second a run
    load = machine_load(threads_before)
    baseline = next(iter(usable))
    choice = min(usable, key=best.__getitem__)
    if best[choice] > MARGIN * best[baseline]:
        choice = baseline
    return Decision(choice, {name: float(f"{seconds:.6g}") for name, seconds in best.items()}, "; ".join(notes), load=load)


def thread_times() -> dict[str, tuple[int, int]]:
    """Each thread of this process: (nanoseconds it ran on a core, nanoseconds it waited for one), as Linux
    counts them in /proc/self/task/*/schedstat; empty where the system does not say."""
    times: dict[str, tuple[int, int]] = {}
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return times
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/schedstat", encoding="ascii") as stat:
                ran, waited = stat.read().split()[:2]
            times[thread] = (int(ran), int(waited))
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return times


def machine_load(before: dict[str, tuple[int, int]]) -> Load:
    """How busy the machine was since `before` (`thread_times()`): the share of this process's threads' time
    spent waiting for a core (near 0 when it had the cores to itself; None when not known, or over too short
    a timing to tell), and the load average per core now.
    Example: threads that ran 80 ms and waited 20 ms -> Load(waited=0.2, per_core=...)"""
    ran = waited = 0
    for thread, (ran_now, waited_now) in thread_times().items():
        ran_before, waited_before = before.get(thread, (0, 0))  # a thread started meanwhile counts from its start
        if ran_now < ran_before:  # the id of a thread that ended, taken by a new one
            ran_before = waited_before = 0
        ran, waited = ran + ran_now - ran_before, waited + waited_now - waited_before
    share = float(f"{waited / (ran + waited):.3g}") if before and ran + waited >= COUNTED_ENOUGH_NS else None
    try:
        per_core: float | None = float(f"{os.getloadavg()[0] / (os.cpu_count() or 1):.3g}")
    except (OSError, AttributeError):  # a system without a load average
        per_core = None
    return Load(share, per_core)


class Choices:
    """This process's decisions: those in the machine's file, and those measured since (added to it)."""

    def __init__(self, path: Path | None, torch_version: str) -> None:
        self.path, self.torch_version = path, torch_version
        self.decisions: dict[str, Decision] = {}
        self.notes: list[str] = []
        self._lock = threading.RLock()
        self._held = 0  # how deep this process is in `decide` calls that hold the file's lock (a measurement decides others)
        if path is None:
            self.notes.append("no private cache folder: decisions are measured for this process only")
        else:
            self.decisions = self._read()

    def _read(self) -> dict[str, Decision]:
        try:
            return self._on_disk()
        except TfcliError as problem:
            assert self.path is not None
            self.notes.append(f"{self.path.name} could not be used ({problem}); measuring again")
            return {}

    def _on_disk(self) -> dict[str, Decision]:
        """The decisions in the file now; TfcliError where it cannot be used. A decision this version cannot
        read (one another version of tfcli wrote, with a key this one does not know) is left out with a note,
        to be measured again if this version needs it; the file's other decisions are used, and `_write`
        keeps that one as it was: versions sharing the file never erase each other's measurements."""
        if self.path is None or not self.path.exists():
            return {}
        record = _FileOnDisk.load(self.path)
        if record.version != VERSION or record.torch != self.torch_version:
            raise TfcliError(f"it was written for torch {record.torch}, format {record.version}")
        readable = {}
        for key, data in record.decisions.items():
            try:
                readable[key] = Decision.from_json(data, where=f"decision {key!r}")
            except TfcliError as problem:
                note = f"{problem} (written by another version of tfcli?): measured again here if needed"
                if note not in self.notes:
                    self.notes.append(note)
        return readable

    def get(self, key: str, allowed: tuple[str, ...]) -> Decision | None:
        decision = self.decisions.get(key)
        return decision if decision is not None and decision.choice in allowed else None

    def decide(self, key: str, candidates: dict[str, Callable[[], Any]], same: Callable[[Any, Any], bool], *, sync: Callable[[], None] = lambda: None) -> str:
        """The candidate for `key`: the remembered one if it is still a candidate, else one another process
        has measured since this one read the file, else measured now."""
        with self._lock:
            known = self.get(key, tuple(candidates))
            if known is not None:
                return known.choice
            with self._measuring():
                with contextlib.suppress(TfcliError):
                    for name, decision in self._on_disk().items():
                        self.decisions.setdefault(name, decision)
                known = self.get(key, tuple(candidates))
                if known is not None:
                    return known.choice
                decision = measure(candidates, same, sync=sync)
                self.decisions[key] = decision
                self._write(key, decision)
                return decision.choice

    def record(self, key: str, decision: Decision) -> None:
        """Keep a decision measured outside `decide` (an explicit tuning, `compiled_step.tune`), in the file too."""
        with self._lock, self._measuring():
            self.decisions[key] = decision
            self._write(key, decision)

    @contextlib.contextmanager
    def _measuring(self):
        """Hold the file's lock: the outermost `decide` of this process takes it, a nested one has it."""
        outermost = self._held == 0 and self.path is not None
        with exclusive(self.path.with_suffix(".lock"), wait_s=LOCK_WAIT_S) if outermost else contextlib.nullcontext():
            self._held += 1
            try:
                yield
            finally:
                self._held -= 1

    def _write(self, key: str, decision: Decision) -> None:
        """Add the decision to the file as it is on disk now (another process may have added others)."""
        if self.path is None:
            return
        on_disk = {}
        if self.path.exists():
            try:  # every decision kept as it is, those this version cannot read too (see `_on_disk`)
                on_disk = {k: v for k, v in loads_json(self.path.read_text()).get("decisions", {}).items() if isinstance(v, dict)}
            except (OSError, ValueError, AttributeError):
                on_disk = {}
        on_disk[key] = decision.to_json()
        record = {"version": VERSION, "processor": processor_name(), "torch": self.torch_version, "decisions": on_disk}
        try:
            atomic_write_json(self.path, record)
        except OSError as error:
            self.notes.append(f"could not save the decisions to {self.path} ({error})")


_choices: Choices | None = None
_choices_lock = threading.Lock()


def choices_path() -> Path | None:
    """The decisions file for this processor and torch version, or None where no private folder can hold it."""
    folder = kernel_folder()
    return None if folder is None else folder / f"choices-{machine_digest(torch.__version__)}.json"


def choices() -> Choices:
    """This process's decisions (read from the machine's file the first time)."""
    global _choices
    with _choices_lock:
        if _choices is None:
            _choices = Choices(choices_path(), torch.__version__)
        return _choices


def kind_of(key: str) -> str:
    """The kind of work a decision's name says (`KINDS`), else the name's first word.
    Example: kind_of("linear forward t2 512x512x256") -> "products" """
    return next((kind for kind, starts in KINDS.items() if key.startswith(starts)), key.split(" ", 1)[0])


FORGET_HINT = f"name {ALL}, {BUSY}, a kind of work ({', '.join(KINDS)}), or the start of a decision's name as `tfcli info --device` lists it"


def forget(path: Path, what: Sequence[str]) -> list[str]:
    """Remove decisions from the file at `path` so that the next runs measure them again; the names removed.
    `what`: ALL, BUSY (those measured on a busy machine), kinds of work (`KINDS`), or the starts of names as
    `tfcli info --device` lists them. Done under the file's lock (no measurement writes meanwhile) in one
    atomic write (a process reading the file sees it whole, before or after); processes running now keep
    the decisions they have read."""
    if not what or not all(item.strip() for item in what):
        raise TfcliError("nothing named to forget", hint=FORGET_HINT)
    lock = path.with_suffix(".lock")
    with exclusive(lock, wait_s=LOCK_WAIT_S) as held:
        if not held:
            raise TfcliError(f"could not take {lock} within {LOCK_WAIT_S} s (another tfcli process is measuring)", hint="run this again when it is done")
        if not path.exists():
            _chosen({}, what)  # a word that names nothing is still refused
            return []
        try:
            record = _FileOnDisk.load(path)
        except TfcliError as problem:
            raise TfcliError(
                f"{path} cannot be used ({problem}): every decision is measured again anyway, and the file replaced when one is saved",
                hint="nothing to forget; delete the file to be rid of it now",
            ) from None
        gone = _chosen(record.decisions, what)
        if gone:
            remaining = {key: decision for key, decision in record.decisions.items() if key not in gone}
            atomic_write_json(path, {"version": record.version, "processor": record.processor, "torch": record.torch, "decisions": remaining})
        return gone


def _chosen(decisions: dict[str, dict[str, Any]], what: Sequence[str]) -> list[str]:
    """The names of the decisions `what` selects (see `forget`); a word that is none of those refused."""
    chosen: set[str] = set()
    for item in what:
        if item == ALL:
            chosen.update(decisions)
        elif item == BUSY:
            chosen.update(key for key, data in decisions.items() if _measured_busy(data))
        elif item in KINDS:
            chosen.update(key for key in decisions if kind_of(key) == item)
        else:
            named = [key for key in decisions if key.startswith(item)]
            if not named:
                raise TfcliError(f"no decision is {item!r}, and none has a name starting with it", hint=FORGET_HINT)
            chosen.update(named)
    return sorted(chosen)


def _measured_busy(data: dict[str, Any]) -> bool:
    """A decision as the file holds it: measured on a busy machine? (One this version cannot read: not known, no.)"""
    try:
        return Decision.from_json(data).measured_busy()
    except TfcliError:
        return False
