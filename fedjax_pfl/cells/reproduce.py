"""A paper's table in one command: ``python -m fedjax_pfl.reproduce NAME [options] [key.sub=value ...]``.

Runs every cell (row x setting x seed) of the table configs/tables/NAME.yaml
(`fedjax_pfl.papers.table_spec`) through the training command, in this process
(``commands.train.main``, so JAX starts once), printing each cell's
equivalent shell command, and writes the table (`fedjax_pfl.papers.paper_table`:
per cell ours as mean ± std over seeds, the paper's number, the difference,
flagged beyond 1.5 points):

    reproductions/NAME/table.md, table.csv, runs/<method>-<setting>/seed<k>/

The new seeds of a cell run as ONE program (``--seeds``, runs/sweep.py, each
seed with its own partition: ``vary_data_with_seed``) when the setting fixes
every client's train and test sizes, so the seeds' arrays have one shape;
otherwise, or with ``--one-by-one``, one run per seed. Either way each seed
writes the same run folder (numbers equal within float tolerance).

Resumable: a cell whose run folder holds a run of the same configuration
with summary.json status ``finished`` (or ``failed``: a diverged run fails
again; remove its folder to retry) is skipped; an interrupted or killed one
continues with ``--resume`` from its checkpoint (cells checkpoint every tenth
of their rounds), or starts over when it has none. A folder holding a run of
another configuration (other rounds or overrides) is an error: use another
``--out``. ``--rounds`` / ``--seeds`` scale down (the table says "reduced"),
``--methods`` / ``--settings`` pick a subset, ``--dry-run`` only prints the
commands, ``--table-only`` writes the table from the runs already there (the
others show as not run, unless the table already there gives their finished
result: `paper_table` keeps cells whose run folders are on another machine;
nothing trains), ``--compact`` first makes every stopped run folder under
the output folder (the cells', and others such as checks/) a compact record
(outputs/compact_record.py: config.json, summary.json and the accuracy series
the table reads, the form reproductions/ commits) and then does what
``--table-only`` does, ``--list`` shows the tables.
Overrides after NAME apply to every cell (e.g. ``data.name=cifar10`` with
``--settings``). A setting whose dataset
files are not found (e.g. CIFAR-100 where only other files are at hand) is not
run: its cells show "no data", the table's notes and stderr say which file is
missing in one line, and the exit status is what the other cells make it (0
when they all finished); supply the files and run the same command again. Bad
input: one line, exit 2; a cell that fails is reported and the others still
run (exit 1); Ctrl-C (or SIGTERM) stops after the round in flight, writes the table so
far, exit 130 (143). ``--jobs N`` trains N cells at a time, each in its own process
(cells/parallel_cells.py; its output in OUT/logs/), for a device one cell
does not fill. ``--cells A,B,...`` runs exactly those cells
(``<method>-<setting>/seed<k>``), in that order; its table shows the rows x
settings x seeds they span.

A time budget (cells/plan_command.py): ``--plan-for-seconds S`` plans the
cells not finished into device commands that fit S seconds (a lent GPU's
window, a cluster job's walltime), most wanted first, and writes
run_plan.md, run_plan.sh and run_plan.json beside the table, and the table
with the plan in its notes; each command runs ``bash OUT/run_plan.sh
[SECONDS [WORK]]``, which calls this command with ``--cells``
(``--device-kind`` names the device whose measured seconds the plan uses,
default nvidia-h200, in ``--device-record``). ``--require-data`` makes
missing dataset files an
error (one line, exit 2) instead of cells shown as "no data".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs.compact_record import compact_runs
from fedjax_pfl.commands.command import INTERRUPTED, TERMINATED, Command, OneLineParser, seed_list, split_overrides
from fedjax_pfl.outputs.output_folder import check_writable
from fedjax_pfl.process.stop_request import StopRequest
from fedjax_pfl.cells.cell_command import (base_argv, batchable, build_config, cell_argv, cell_state,
                                            consecutive_groups, display_path, paper_rounds, seeds_argv)
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.cells import plan_command, plan_log
from fedjax_pfl.papers import weight_notes
from fedjax_pfl.cells.collect import collect_cell
from fedjax_pfl.cells.data_check import missing_data
from fedjax_pfl.papers.earlier_table import read_earlier
from fedjax_pfl.papers.paper_table import kept_cells, write_table
from fedjax_pfl.cells.parallel_cells import Job, run_side_by_side
from fedjax_pfl.papers.table_spec import NO_DATA, TABLES_DIR, Cell, TableSpec, find_table, load_table, parse_list, table_names

TRAIN = "python -m fedjax_pfl.train"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m fedjax_pfl.reproduce", usage="%(prog)s NAME [options] [key.sub=value ...]",
                description="Run the cells of a paper's table and write table.md / table.csv beside their runs.")
    p.add_argument("name", nargs="?", help="table name (see --list)")
    p.add_argument("--list", action="store_true", help="list the tables and exit")
    p.add_argument("--table-file", help="a table YAML file instead of a NAME from configs/tables/")
    p.add_argument("--out", help="output folder (default reproductions/NAME)")
    p.add_argument("--rounds", type=int, help="rounds per run (default: each preset's, the paper's)")
    p.add_argument("--seeds", help="comma-separated seeds (default: the table file's)")
    p.add_argument("--methods", help="comma-separated subset of the table's methods")
    p.add_argument("--settings", help="comma-separated subset of the table's settings")
    p.add_argument("--data-dir", help="folder with dataset files (else $FEDJAX_PFL_DATA_DIR, then the cache)")
    p.add_argument("--dry-run", action="store_true", help="print each cell's command and state; run nothing")
    p.add_argument("--table-only", action="store_true",
                   help="write table.md / table.csv from the finished runs already there; run nothing")
    p.add_argument("--compact", action="store_true",
                   help="make every finished or failed run folder under the output folder a compact record "
                        "(config.json, summary.json, metrics.jsonl.xz), then write the table as --table-only; "
                        "run nothing")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--one-by-one", action="store_true", help="never run cells as rows of one program")
    p.add_argument("--jobs", type=int, default=1,
                   help="cells trained at once, each its own process with its output in OUT/logs/ (e.g. 4-5 on "
                        "one large GPU); 1 (default): one after another in this process")
    p.add_argument("--cells", help="comma-separated cells to run, in this order (<method>-<setting>/seed<k>, as "
                                   "their run folders): what a run plan's commands pass")
    p.add_argument("--plan-for-seconds", type=float, metavar="S",
                   help="plan the cells not finished, most wanted first, into device commands for S seconds of "
                        "commands; writes OUT/run_plan.md, .sh, .json and the table; runs nothing")
    p.add_argument("--device-kind", default="nvidia-h200",
                   help="the device the plan is for (its measured seconds in --device-record)")
    p.add_argument("--device-record", metavar="FILE",
                   help="the measured seconds of device kinds the plan reads (default: this repository's "
                        "benchmarks/seconds_per_round.json, whose form a record of your own follows)")
    p.add_argument("--work", metavar="DIR",
                   help="with --plan-for-seconds: where the plan's cells run (default: the table's folder; for a "
                        "background kind such as cpu, the user cache's cells/NAME, outside the repository)")
    p.add_argument("--collect-into", metavar="DIR",
                   help="copy each cell that finished into DIR/runs/ as a compact record and write DIR's table, "
                        "and log each cell's start and end in OUT/plan_log.jsonl (what a background plan passes)")
    p.add_argument("--require-data", action="store_true",
                   help="a setting whose dataset files are missing is an error (exit 2), not cells shown as no data")
    return p


def run_cell(argv: list[str], state: str, folder: Path, progress: bool, observe=None) -> int:
    """Train one cell (continuing or restarting it per ``state``); the training command's exit status.

    A crash (not a user error) is one line here, its traceback in the cell's error.log, and
    counts as a failed cell, so one broken method does not stop the rest of a long table.
    """
    from fedjax_pfl.commands import train as cli  # (imports JAX: only when a cell runs)

    cell = Command("interrupted")
    cell.folder = folder
    return cell.run(lambda: cli.main([*argv, *cell_flags(state, progress)], observe=observe))


def cell_flags(state: str, progress: bool) -> list[str]:
    """The training command's flags for a cell in ``state``: --resume to continue, --start-over for an unfinished
    run of this very cell without a checkpoint, --no-progress."""
    flags = {"resume": ["--resume"], "rerun": ["--start-over"]}.get(state, [])
    return flags + ([] if progress else ["--no-progress"])


def pick_seeds(text: str | None, spec: TableSpec) -> list[int]:
    """``--seeds`` (distinct whole numbers >= 0), else the table file's seeds."""
    if text is None:
        return list(spec.seeds)
    seeds = seed_list(text)
    if len(set(seeds)) != len(seeds) or max(seeds) > config_lib.MAX_WHOLE:
        raise UserError(f"--seeds must be distinct whole numbers from 0 to {config_lib.MAX_WHOLE}; got {text!r}")
    return seeds


def list_tables(folder: Path = TABLES_DIR) -> str:
    """One line per table: name, paper, table, cells, rounds (the presets'), datasets."""
    lines = ["| name | paper | table | cells | rounds | data |", "|---|---|---|---|---|---|"]
    for name in table_names(folder):
        spec = load_table(Path(folder) / f"{name}.yaml")
        configs = [config_lib.build(s.config, s.overrides) for s in spec.settings]
        rounds = ", ".join(dict.fromkeys(str(c.train.rounds) for c in configs))
        data = ", ".join(dict.fromkeys(c.data.name for c in configs))
        running = len({spec.run_row(m).name for m in spec.methods})
        shared = f" ({running} with runs of their own)" if running < len(spec.methods) else ""
        cells = f"{len(spec.methods)} rows{shared} x {len(spec.settings)} settings x {len(spec.seeds)} seeds"
        lines.append(f"| {name} | {spec.paper} | {spec.table} | {cells} | {rounds} | {data} |")
    return "\n".join(lines) + "\n"


def first_cells(cells: list[Cell]) -> dict[str, Cell]:
    """Setting name -> its first cell, in table order."""
    first: dict[str, Cell] = {}
    for c in cells:
        first.setdefault(c.setting.name, c)
    return first


def settings_without_data(cells: list[Cell], extra: list[str], data_dir: str | None) -> dict[str, str]:
    """Setting name -> why its dataset cannot be loaded (cells/data_check.py), for the settings of ``cells``."""
    data = ["--data-dir", data_dir] if data_dir else []
    first = first_cells(cells)
    reasons = {name: missing_data(build_config(base_argv(c, [*extra, *data])).config) for name, c in first.items()}
    return {name: r for name, r in reasons.items() if r}


class Program(NamedTuple):
    """One program to run: a cell, a cell's seeds (``argv`` with --seeds), or cells as rows (``rows``: each
    cell's training command line, run together by `runs.sweep.run_federations`)."""

    label: str
    cells: list
    argv: list
    state: str
    folder: Path
    rows: list | None = None


def plan_cells(cells: list[Cell], out: Path, rounds: dict, args, extra: list[str], no_data: dict,
               programs: list[list[Cell]] | None = None) -> list[Program]:
    """The programs to run, in the cells' order: the new cells of one method that follow one another (within
    one of ``programs``, the --cells groups) and differ only in seed, partition or participation as rows of
    one program; else a cell's new seeds as one program where they can share it (`batchable`); else one
    program a cell; cells whose dataset is missing in state 'no data'."""
    from fedjax_pfl.runs.sweep import pooled_difference  # (imports JAX: only when cells are planned)

    argvs = {c.folder_name: cell_argv(c, out / "runs" / c.folder_name, rounds[c.setting.name][0], extra,
                                      args.data_dir) for c in cells}
    configs = {name: build_config(a).config for name, a in argvs.items()}
    states = {c.folder_name: cell_state(out / "runs" / c.folder_name, configs[c.folder_name]) for c in cells}
    for c in cells:
        if c.setting.name in no_data and states[c.folder_name] != "finished":
            states[c.folder_name] = NO_DATA
    together = not args.one_by_one and args.jobs == 1
    plans = []
    for part in programs or [cells]:
        for run in consecutive_groups(part, key=lambda c: c.method.name):
            new = [c for c in run if states[c.folder_name] == "new"]
            rows = (together and len({c.setting.name for c in new}) > 1
                    and pooled_difference([configs[c.folder_name] for c in new]) is None)
            if rows:
                plans.append(Program(f"{new[0].method.name}: {len(new)} cells as rows of one program", new, [],
                                     "new", out / "runs", [argvs[c.folder_name] for c in new]))
            for group in consecutive_groups([c for c in run if not (rows and c in new)]):
                plans += _seed_programs(group, argvs, configs, states, out, together)
    return plans


def _seed_programs(group: list[Cell], argvs: dict, configs: dict, states: dict, out: Path,
                   together: bool) -> list[Program]:
    """The programs of one (method, setting)'s cells: their new seeds as one where they can share it."""
    new = [c for c in group if states[c.folder_name] == "new"]
    first = configs[group[0].folder_name]
    plans = []
    if together and len(new) > 1 and batchable(first):
        folder = out / "runs" / group[0].group_name
        plans.append(Program(f"{group[0].group_name} seeds {','.join(str(c.seed) for c in new)} (one program)", new,
                             seeds_argv(argvs[new[0].folder_name], [c.seed for c in new], folder, first), "new",
                             folder))
        group = [c for c in group if c not in new]
    return plans + [Program(c.folder_name, [c], argvs[c.folder_name], states[c.folder_name],
                            out / "runs" / c.folder_name) for c in group]


def run_rows(program: Program, progress: bool, observe=None) -> tuple[int, list[str]]:
    """Train a rows program's cells as one program (`runs.sweep.run_federations`) -> (exit status, the cells that
    failed). Where their method cannot run as rows exactly (the engine's one-line reason), each cell runs on
    its own instead."""
    from fedjax_pfl.engine.rows import CannotPool  # (these two import JAX: only when cells run)
    from fedjax_pfl.runs.sweep import run_federations

    stop, failed = StopRequest(), []

    def body() -> int:
        summaries = run_federations([build_config(a) for a in program.rows], progress, observe, stop)
        failed.extend(c.folder_name for c, s in zip(program.cells, summaries) if s.get("status") == "failed")
        return stop.exit_status if stop.requested else 0

    command = Command("interrupted")
    command.folder = program.folder
    try:
        return command.run(body), failed
    except CannotPool as e:
        print(f"note: {e}; running its {len(program.cells)} cells one by one", file=sys.stderr, flush=True)
    for cell, argv in zip(program.cells, program.rows):
        rc = run_cell(argv, "new", program.folder / cell.folder_name, progress, observe)
        if rc in (INTERRUPTED, TERMINATED):
            return rc, failed
        failed += [cell.folder_name] if rc else []
    return 0, failed


def check_modes(args) -> None:
    """One-line UserErrors for options that do not go together."""
    chosen = [flag for flag, on in (("--dry-run", args.dry_run), ("--table-only", args.table_only),
                                    ("--compact", args.compact),
                                    ("--plan-for-seconds", args.plan_for_seconds is not None)) if on]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(chosen)} do different things (--dry-run writes nothing, --table-only and "
                        "--compact write the table, --plan-for-seconds plans runs): give one of them")
    if args.cells is not None and (args.methods or args.settings or args.seeds):
        raise UserError("--cells names the cells itself: give it without --methods, --settings and --seeds")
    if args.work and args.plan_for_seconds is None:
        raise UserError("--work names where a plan's cells run: give it with --plan-for-seconds (to run cells "
                        "elsewhere, pass --out)")
    if args.collect_into and (chosen and chosen != ["--dry-run"] or args.jobs > 1):
        raise UserError("--collect-into copies cells as they finish: give it without --table-only, --compact, "
                        "--plan-for-seconds and --jobs")
    if args.collect_into and args.out and Path(args.collect_into).resolve() == Path(args.out).resolve():
        raise UserError("--collect-into must name another folder than --out (the cells run in --out)")


def listed_cells(text: str, spec: TableSpec) -> list[list[Cell]]:
    """``--cells``: folder names ``<method>-<setting>/seed<k>`` of the table's cells, in the given order, ``;``
    ending a program (cells one program may hold as rows: `plan_cells`)."""
    groups = {c.group_name: c for c in spec.cells(seeds=[0])}
    programs = []
    for part in text.split(";"):
        cells = []
        for name in [t.strip() for t in part.split(",") if t.strip()]:
            group, _, seed = name.partition("/seed")
            if group not in groups or not seed.isdigit() or int(seed) > config_lib.MAX_WHOLE:
                raise UserError(f"--cells: {name!r} is not a cell of {spec.name} (give <method>-<setting>/seed<k>, "
                                f"e.g. {next(iter(groups))}/seed0)")
            cell = groups[group]
            cells.append(Cell(cell.method, cell.setting, int(seed)))
        programs += [cells] if cells else []
    flat = [c for cells in programs for c in cells]
    if not flat or len({c.folder_name for c in flat}) != len(flat):
        raise UserError(f"--cells must name distinct cells, got {text!r}")
    return programs


def reproduce(args, extra: list[str], command: Command, observe=None) -> int:
    """Run (or, with --dry-run, print) the chosen cells and write the table; the exit status. With
    --plan-for-seconds (cells/plan_command.py), plan them for a time budget instead.

    ``command.folder`` is set to the output folder (for error.log)."""
    if args.table_file and args.name:
        raise UserError("give a table NAME or --table-file, not both")
    if not (args.table_file or args.name):
        raise UserError("name a table (see --list), or pass --table-file FILE")
    check_modes(args)
    if not 1 <= args.jobs <= 256:
        raise UserError(f"--jobs must be a whole number from 1 to 256 (cells trained at once), got {args.jobs}")
    spec = load_table(args.table_file) if args.table_file else find_table(args.name)
    if args.rounds is not None and not 1 <= args.rounds <= config_lib.MAX_WHOLE:
        raise UserError(f"--rounds must be a whole number from 1 to {config_lib.MAX_WHOLE}, got {args.rounds}")
    kind = None
    if args.plan_for_seconds is not None:  # a bad --plan-for-seconds or --device-kind: before anything is read or written
        kind = plan_command.checked_kind(args)[1]
    out = Path(args.out or Path("reproductions") / spec.name)
    if not args.dry_run:
        check_writable(out)
    command.folder = out
    if args.compact:
        args.table_only = True
        print(compacted_line(compact_runs(out), out), flush=True)
    table_extra = extra
    planning = args.plan_for_seconds is not None
    if planning:
        extra = plan_command.plan_overrides(extra, kind)
    if args.cells is not None:
        programs = listed_cells(args.cells, spec)
        cells = [c for part in programs for c in part]
        seeds = sorted({c.seed for c in cells})
        table_cells = spec.cells({c.method.name for c in cells}, {c.setting.name for c in cells}, seeds)
    else:
        methods = parse_list(args.methods, [m.name for m in spec.methods], "method(s)")
        settings = parse_list(args.settings, [s.name for s in spec.settings], "setting(s)")
        seeds = pick_seeds(args.seeds, spec)
        cells = table_cells = spec.cells(methods, settings, seeds)
        programs = None
    published = {name: paper_rounds(c, extra) for name, c in first_cells(cells).items()}
    rounds = {name: (args.rounds or r, r) for name, r in published.items()}
    no_data = settings_without_data(cells, extra, args.data_dir)
    if args.require_data and no_data:
        raise UserError(f"dataset files missing for {', '.join(no_data)} ({'; '.join(dict.fromkeys(no_data.values()))}); "
                        "set FEDJAX_PFL_DATA_DIR or pass --data-dir")
    if planning:
        kept = kept_cells(spec, cells, out / "runs", read_earlier(out), rounds, seeds)
        table_args = [args.name] if args.name else ["--table-file", args.table_file]
        plan = plan_command.write_plan(spec, cells, out, rounds, args, extra, no_data, kept, table_args,
                                     plan_command.made_by(table_command(args, table_extra), args))
        print((out / "run_plan.md").read_text(), end="")
        print(f"wrote {out}/run_plan.md, run_plan.sh, run_plan.json ({len(plan.planned)} step(s) planned)")
        write_and_print(spec, table_cells, out, rounds, seeds, args, plan_command.without_plan_overrides(extra, kind),
                        no_data, write_table, show=False)
        return 0
    plans = plan_cells(cells, out, rounds, args, extra, no_data, programs)
    left = {p.cells[0].setting.name for p in plans if p.state == NO_DATA}
    no_data = {name: reason for name, reason in no_data.items() if name in left}  # finished cells need no files
    failed, status, side_by_side = [], 0, []
    lines = sum(len(p.rows) if p.rows else 1 for p in plans)  # a line a program, a line a row of one
    shown = 0
    for program in plans:
        state = program.state
        for j, argv in enumerate(program.rows or [program.argv]):
            shown += 1
            command = shlex.join([*TRAIN.split(), *argv, *cell_flags(state, True)])
            label = program.cells[j].folder_name if program.rows else program.label
            what = f"{state}, row {j + 1} of {len(program.rows)} in one program" if program.rows else state
            if args.table_only and state not in ("finished", NO_DATA):
                print(f"[{shown}/{lines}] {label}: not run (--table-only; {what}: {command})", flush=True)
            else:
                print(f"[{shown}/{lines}] {label}: {'skipped (done)' if state == 'finished' else what}"
                      f"{'' if state == 'finished' else ': ' + command}", flush=True)
        if args.table_only and state not in ("finished", NO_DATA):
            continue
        if args.collect_into and not args.dry_run and state == "finished":
            collect(spec, program, out, Path(args.collect_into), args)
        if args.dry_run or state in ("finished", NO_DATA):
            continue
        if args.jobs > 1:  # started below, side by side
            side_by_side.append((Job(program.label, [*program.argv, *cell_flags(state, False)]), program.cells))
            continue
        if program.rows:
            rc, bad = run_rows(program, not args.no_progress, observe)
            failed += bad
            if args.collect_into and rc == 0:
                collect(spec, program, out, Path(args.collect_into), args)
        else:
            log_cells(program, out, "started", args)
            rc = run_cell(program.argv, state, program.folder, not args.no_progress, observe)
            failed += [c.folder_name for c in program.cells] if rc not in (0, INTERRUPTED, TERMINATED) else []
            log_cells(program, out, {0: "finished", INTERRUPTED: "stopped", TERMINATED: "stopped"}.get(rc, "failed"),
                      args)
            if args.collect_into and rc == 0:
                collect(spec, program, out, Path(args.collect_into), args)
        if rc in (INTERRUPTED, TERMINATED):
            status = rc
            print("interrupted: the table below holds the cells run so far; run the same command again to continue",
                  file=sys.stderr)
            break
    if side_by_side:
        cells_of = {job.label: cells_ for job, cells_ in side_by_side}
        bad, status = run_side_by_side([job for job, _ in side_by_side], args.jobs, out / "logs")
        failed += [c.folder_name for label in bad for c in cells_of[label]]
        if status in (INTERRUPTED, TERMINATED):
            print("interrupted: the table below holds the cells run so far; run the same command again to continue",
                  file=sys.stderr)
    for reason, names in _by_value(no_data).items():
        print(f"note: not run, dataset files missing ({', '.join(names)}): {reason}", file=sys.stderr)
    if args.dry_run:
        return 0
    write_and_print(spec, table_cells, out, rounds, seeds, args, extra, no_data, write_table)  # (--cells: the rows x
    # settings x seeds they span, so that every (row, setting) shown has its line)
    if failed:
        print(f"{len(failed)} cell(s) failed: {', '.join(failed)} (their errors are above)", file=sys.stderr)
        return status or 1
    return status


REPRODUCE = "python -m fedjax_pfl.reproduce "
COMMAND_PREFIX = f"Command: `{REPRODUCE}"  # the line of table.md that records the command writing it


def log_cells(program: Program, out: Path, event: str, args) -> None:
    """With --collect-into (a background plan's command): one line per cell of ``program`` in OUT's plan log."""
    if not args.collect_into:
        return
    for cell in program.cells:
        folder = out / "runs" / cell.folder_name
        records = run_folder.read_records(folder) if run_folder.is_run(folder) else []
        plan_log.append(out, cell.folder_name, event, records[-1]["round"] if records else 0)


def collect(spec: TableSpec, program: Program, out: Path, into: Path, args) -> None:
    """Copy ``program``'s finished cells from ``out`` into ``into`` (cells/collect.py) and, when one was new
    there, write ``into``'s table (as ``--table-only`` would), saying so in one line."""
    copied = [c.folder_name for c in program.cells
              if collect_cell(out / "runs" / c.folder_name, into / "runs" / c.folder_name)]
    if not copied:
        return
    for name in copied:
        plan_log.append(out, name, "collected", run_folder.read_records(into / "runs" / name)[-1]["round"])
    with contextlib.redirect_stdout(io.StringIO()):
        status = main([*rewrite_argv(into, args), "--table-only", "--no-progress"])
    print(f"collected {', '.join(copied)} into {display_path(into)}/runs/ and wrote its table "
          f"({'exit ' + str(status) if status else 'table.md, table.csv'}): commit them", flush=True)


def rewrite_argv(into: Path, args) -> list[str]:
    """The reproduce arguments that write ``into``'s table again: the command its table.md records (its seeds,
    methods and settings: a plan's slice of cells does not shrink the table), else the table's name, with
    ``--out into`` unless that is where the command writes."""
    recorded = [line for line in (into / "table.md").read_text(encoding="utf-8").splitlines()
                if line.startswith(COMMAND_PREFIX)] if (into / "table.md").is_file() else []
    argv = (shlex.split(recorded[0][len(COMMAND_PREFIX):].rstrip(".").rstrip("`")) if recorded
            else [args.name] if args.name else ["--table-file", args.table_file])
    if "--out" in argv:  # the recorded folder is where it was written from; the table is now in ``into``
        at = argv.index("--out")
        argv = argv[:at] + argv[at + 2:]
    default = Path("reproductions") / argv[0] if not argv[0].startswith("-") else None
    return argv if default and default.resolve() == Path(into).resolve() else [*argv, "--out", str(into)]


def write_and_print(spec: TableSpec, cells: list[Cell], out: Path, rounds: dict, seeds: list[int], args,
                    extra: list[str], no_data: dict, write_table, show: bool = True) -> None:
    """Write table.md / table.csv (with the planned runs' note when OUT holds a run plan) and print the table
    (``show``) or only where it went."""
    out.mkdir(parents=True, exist_ok=True)
    head_extra = [f"Command: `{table_command(args, extra)}`."]  # read back by `rewrite_argv`
    head_extra += [f"Overrides on every cell: {' '.join(extra)}."] if extra else []
    text = write_table(spec, cells, out, rounds, seeds, head_extra, no_data,
                       [*weight_notes.notes(cells, out / "runs"), *plan_command.plan_note(out)])
    print(text if show else "", end="")
    print(f"wrote {out}/ (table.md, table.csv, runs/)")


def compacted_line(found: dict[str, list[Path]], out: Path) -> str:
    """What --compact did under ``out`` (`compact_record.compact_runs`), in one line."""
    whole = found["whole"]
    return (f"compacted {len(found['compacted'])} run folder(s) under {out} ({len(found['already'])} compact "
            f"already; {len(whole)} left whole, not finished{': ' if whole else ''}"
            f"{', '.join(display_path(p) for p in whole)})")


def table_command(args, extra: list[str]) -> str:
    """The reproduce command that runs (or, once run, rewrites) this table's cells: the options that choose
    them, without the ones that only change what is printed (--table-only, --compact, --no-progress) or name
    this machine's folders (--data-dir)."""
    argv = [args.name] if args.name else ["--table-file", args.table_file]
    for flag, value in (("--out", args.out), ("--rounds", args.rounds), ("--seeds", args.seeds),
                        ("--methods", args.methods), ("--settings", args.settings)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--one-by-one"] if args.one_by_one else []
    return shlex.join([*REPRODUCE.split(), *argv, *extra])


def _by_value(mapping: dict) -> dict:
    """{key: value} -> {value: [keys]}, in first-seen order."""
    out: dict = {}
    for key, value in mapping.items():
        out.setdefault(value, []).append(key)
    return out


def main(argv=None, observe=None) -> int:
    """The command's exit status (commands/command.py); ``observe(rounds_done)`` is passed to every cell's run
    (commands/train.py)."""
    command = Command("interrupted; run the same command again to continue")

    def body() -> int:
        args, rest = build_parser().parse_known_args(argv)
        if args.name and "=" in args.name:  # an override, not a table name (with --table-file)
            args.name, rest = None, [args.name, *rest]
        extra = split_overrides(rest)
        if args.list:
            print(list_tables(), end="")
            return 0
        return reproduce(args, extra, command, observe)

    return command.run(body)
