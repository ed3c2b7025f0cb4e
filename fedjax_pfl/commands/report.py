"""``python -m fedjax_pfl.report RUN_DIR... [--out DIR] [--redraw]``: runs side by side (outputs/report.py).

The command's arguments and exit status; what it writes is outputs/report.py's `report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedjax_pfl.outputs.output_folder import check_writable
from fedjax_pfl.outputs.report import report
from fedjax_pfl.outputs.results_writer import matplotlib_available
from fedjax_pfl.commands.command import Command, OneLineParser


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m fedjax_pfl.report",
                      description="Table and accuracy figure of runs; seeds of one setting grouped.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, or folders holding run folders")
    p.add_argument("--out", default="report", help="folder for report.md, report.csv, accuracy.png (default: report)")
    p.add_argument("--redraw", action="store_true", help="also draw each run's own plots/ from its files")
    return p


def main(argv=None) -> int:
    """The command's exit status (commands/command.py): 0, 2 on bad input, 1 on an internal error."""
    command = Command("interrupted; the report was not written", own_process=argv is None)

    def body() -> int:
        args = build_parser().parse_args(argv)
        check_writable(Path(args.out))
        command.folder = Path(args.out)
        print(report(args.runs, Path(args.out), args.redraw), end="")
        print(f"wrote {args.out}/ (report.md, report.csv{', accuracy.png' if matplotlib_available() else ''})")
        return 0

    return command.run(body)
