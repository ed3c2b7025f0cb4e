"""Every committed table under reproductions/ is what `reproduce --table-only` writes from its committed runs.

Each table.md names the command that made it (its "Command:" line); run with ``--table-only`` on a copy
of the table's folder (table.md, table.csv, runs/), it must give table.md and table.csv byte for byte.
So the committed records hold everything the tables were computed from, in a layout today's readers
read, and a change to the table code or to the records that moves any committed number fails here.
"""

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from fedjax_pfl.cells import reproduce

REPRODUCTIONS = Path(__file__).resolve().parents[1] / "reproductions"
TABLES = sorted(p.parent.relative_to(REPRODUCTIONS.parent) for p in REPRODUCTIONS.rglob("table.md"))
PREFIX = "Command: `python -m fedjax_pfl.reproduce "


def recorded_command(table_md: Path) -> list[str]:
    """The reproduce arguments the table's "Command:" line records."""
    lines = [line for line in table_md.read_text().splitlines() if line.startswith(PREFIX)]
    assert len(lines) == 1, f"{table_md} has {len(lines)} Command lines"
    return shlex.split(lines[0][len(PREFIX):].rstrip(".").rstrip("`"))


def test_the_committed_tables_are_found():
    assert len(TABLES) >= 7 and Path("reproductions/fedpac_table1") in TABLES


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_a_committed_table_re_renders_identically_from_its_records(table, tmp_path, monkeypatch, data_dir, capsys):
    committed = REPRODUCTIONS.parent / table
    copy = tmp_path / table
    copy.mkdir(parents=True)
    for name in ("table.md", "table.csv", "run_plan.json"):  # a run plan beside a table is part of its notes
        if (committed / name).is_file():
            shutil.copy(committed / name, copy / name)
    if (committed / "runs").is_dir():
        shutil.copytree(committed / "runs", copy / "runs")
    monkeypatch.chdir(tmp_path)  # the recorded --out (or the default reproductions/NAME) is relative
    argv = recorded_command(committed / "table.md")
    assert reproduce.main([*argv, "--table-only", "--no-progress", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "; rerun: " not in out and "; resume: " not in out  # every cell with a run folder counts as finished
    for name in ("table.md", "table.csv"):
        assert (copy / name).read_text() == (committed / name).read_text(), f"{table}/{name} differs"


def test_the_overview_counts_are_the_tables_counts():
    """reproductions/README.md's overview block is what papers/overview.py computes from every table.csv."""
    from fedjax_pfl.papers import overview

    readme = (REPRODUCTIONS / "README.md").read_text(encoding="utf-8")
    assert readme == overview.with_overview(readme, overview.overview_table(REPRODUCTIONS)), (
        "reproductions/README.md's overview is stale: run python -m fedjax_pfl.papers.overview")


def test_the_overview_counts_cells_run_seeds_and_flags(tmp_path):
    table = tmp_path / "t" / "table.csv"
    table.parent.mkdir()
    table.write_text("runs,paper,flag\n3,0.9,False\n1,0.8,True\n0,0.7,False\n2,,False\n", encoding="utf-8")
    from fedjax_pfl.papers import overview

    assert overview.table_counts(table) == (4, 3, 1, 2, 1)
    with pytest.raises(ValueError, match="no"):
        overview.with_overview("no block here", "x")


def test_the_committed_records_stay_under_5_mb():
    """reproductions/ holds the compact records that re-render the tables, not every probe ever run:
    the files git tracks there (their bytes, as a clone holds them) stay under 5 MB."""
    listed = subprocess.run(["git", "ls-files", "-z", "reproductions"], cwd=REPRODUCTIONS.parent,
                            capture_output=True, check=True).stdout.split(b"\0")
    files = [REPRODUCTIONS.parent / name.decode() for name in listed if name]
    assert len(files) > 100, "git lists no records: run the tests from a clone"
    total = sum(f.stat().st_size for f in files)
    assert total < 5_000_000, f"reproductions/ tracks {total / 1e6:.2f} MB"
