"""The one-screen overview of every committed paper table: how many cells ran and how many meet the paper.

Counts come from each table's table.csv (the file `reproduce` writes), so the overview in
reproductions/README.md cannot drift from the tables: `python -m fedjax_pfl.papers.overview` rewrites
its block, and tests/test_reproductions.py checks it.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from fedjax_pfl.papers.paper_numbers import FLAG_POINTS

BEGIN = "<!-- overview: written by python -m fedjax_pfl.papers.overview -->"
END = "<!-- end of overview -->"
HEADER = ("table", "cells", "run", "3 seeds", "with the paper's number", f"within {FLAG_POINTS:g} points")


def table_counts(table_csv: Path) -> tuple[int, int, int, int, int]:
    """(cells, cells run, cells with three or more seeds, run cells with a paper number, those not flagged)."""
    with table_csv.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    run = [r for r in rows if int(r["runs"] or 0) > 0]
    with_paper = [r for r in run if r["paper"]]
    return (len(rows), len(run), sum(int(r["runs"]) >= 3 for r in run), len(with_paper),
            sum(r["flag"] == "False" for r in with_paper))


def overview_table(root: Path) -> str:
    """Markdown table of `table_counts` for every ``root/*/table.csv``, one row a table (linked), sorted."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for table_csv in sorted(root.glob("*/table.csv")):
        name = table_csv.parent.name
        counts = table_counts(table_csv)
        lines.append(f"| [{name}]({name}/table.md) | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(lines)


def with_overview(readme: str, table: str) -> str:
    """``readme`` with the text between BEGIN and END replaced by ``table``."""
    head, found, rest = readme.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(root: str = "reproductions") -> None:
    readme = Path(root) / "README.md"
    readme.write_text(with_overview(readme.read_text(encoding="utf-8"), overview_table(Path(root))),
                      encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
