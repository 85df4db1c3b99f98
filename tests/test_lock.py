"""The lock (`requirements/test.txt`, made by `scripts/lock.sh`) matches `pyproject.toml`, and this machine
runs the versions it pins: what CI passed is what a fresh machine tests."""

from __future__ import annotations

import importlib.metadata
import re
import sys

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the lock itself is for 3.11 and newer
    import tomli as tomllib

LOCK = REPO / "requirements" / "test.txt"
NOT_LOCKED = {"torch"}  # installed first, on its own: the CPU pin here, a CUDA build on a GPU machine
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def locked() -> list[tuple[str, Version, Marker | None]]:
    """Each pin of the lock: the package, its version and the marker under which it is installed (a universal
    lock may pin one package twice, a version for each range of Pythons or platforms)."""
    pins = []
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        found = PIN.match(line)
        if found:
            name, version, marker = found.groups()
            pins.append((canonicalize_name(name), Version(version), Marker(marker) if marker else None))
    return pins


def pinned_here() -> dict[str, Version]:
    """The versions the lock installs on this machine: one per package."""
    here: dict[str, Version] = {}
    for name, version, marker in locked():
        if applies(marker):
            assert name not in here, f"the lock pins {name} twice for this machine"
            here[name] = version
    return here


def declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["test"]]


def applies(marker: Marker | None) -> bool:
    return marker is None or marker.evaluate({"extra": "test"})


def test_the_lock_pins_what_pyproject_asks_for():
    pins = locked()
    names = {name for name, _, _ in pins}
    assert len(names) > 100 and "pytest" in names and "torch" not in names
    wrong = []
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name in NOT_LOCKED:
            continue
        versions = [version for pinned, version, _ in pins if pinned == name]
        if not versions and applies(requirement.marker):
            wrong.append(f"{requirement} is not in the lock")
        wrong += [f"{requirement} but the lock pins {version}" for version in versions if not requirement.specifier.contains(version, prereleases=True)]
    assert not wrong, "requirements/test.txt no longer matches pyproject.toml (refresh it: bash scripts/lock.sh): " + "; ".join(wrong)


def test_every_pin_has_a_hash_and_the_lock_says_how_it_was_made():
    text = LOCK.read_text(encoding="utf-8")
    assert "bash scripts/lock.sh" in text.splitlines()[1]
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    pinned = [entry for entry in entries if PIN.match(entry.splitlines()[0])]
    assert len(pinned) == len(locked())
    assert all("--hash=sha256:" in entry for entry in pinned)


def test_this_machine_runs_the_locked_versions():
    """The README's test command installs the lock; a tool at another version here means this run is not
    testing what CI passed."""
    if sys.version_info < (3, 11):
        pytest.skip("the lock is for Python 3.11 and newer")
    differ = []
    for name, version in pinned_here().items():
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            differ.append(f"{name} is not installed")
            continue
        if installed != version:
            differ.append(f"{name} {installed} (the lock pins {version})")
    assert not differ, "install the lock (the README's test command): " + "; ".join(differ)
