"""The README's figures are the benchmarks page's: every number in its Figures table stands on
docs/benchmarks.md, where each has its command, date and machine (one source, not two copies that drift)."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_every_readme_figure_is_on_the_benchmarks_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Figures\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| what", "|---"))]
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert len(rows) >= 8
    missing = []
    for row in rows:
        measured = row.rstrip(" |").rsplit("|", 1)[1]
        numbers = re.findall(r"\d[\d,]*\.\d+|\d+(?:\.\d+)?%", measured)
        assert numbers, row
        missing += [f"{number} ({row.split('|')[1].strip()})" for number in numbers if number not in page]
    assert not missing, "README figures that docs/benchmarks.md does not show: " + "; ".join(missing)
