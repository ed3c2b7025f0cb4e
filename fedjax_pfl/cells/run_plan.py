"""A run plan: a table's missing cells, most wanted first, packed into device commands for a time budget.

A budget (a lent device's window, a cluster job's walltime) holds a few
commands of at most the device kind's ``command_limit_seconds`` (600 s)
each, and what runs when it ends is lost. The plan:

1. **Order** (`priority`): the first seed of every cell before any further
   seed; the headline row's cells in the headline's group of settings (the
   paper's own row across its column block) first; then among the settings,
   the table's ``headline`` settings first, then those of the same group,
   then the others, each in table order; within a setting, the headline row
   first, then the rows whose published numbers lie nearest its own (the
   cells that decide its rank), rows without a published number last.
   Without a ``headline``: column by column, settings and rows in table
   order. Resumable cells go before all (plan_command.py).
2. **Programs** (`pack`): the cells a program may hold are queued: a method's
   new cells (cells/reproduce.py: rows of one program, engine/rows.py),
   in that order, the queues in the order of their first cell (so a method's
   further seeds go with its first ones), or a cell alone (resumable, or
   --one-by-one). Each command,
   queue by queue in order, takes the longest head of the queue whose program
   fits what the command has left: its ``cell_start`` (clients, compiling,
   checkpoints) and its rounds times the program's estimated seconds per round
   (cells/round_seconds.py: for the cells together, not k times one); so the
   headline method's cells come first and later queues fill the time. Each
   command spends its ``command_start`` margin (Python, JAX, the data), and
   ``stop`` + ``pack`` are kept free at its end. What no command holds is left
   for a later plan, one step a queue. Programs without an estimate are never
   planned.
3. **Commands** (`script`): every command of the budget runs the same list,
   the planned programs in plan order and then those left (standby):
   ``reproduce --cells`` (``;`` between programs) skips the finished cells,
   resumes a cut one, and is stopped by SIGINT at the command's deadline
   (after the round in flight, with a checkpoint), so a wrong estimate only
   moves where a command stops.

Nothing here runs anything or imports JAX: the states and estimates come in.
"""

from __future__ import annotations

import dataclasses
import math
import shlex

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.cells import plan_log
from fedjax_pfl.papers.table_spec import Cell, TableSpec

STANDBY_CELLS = 40  # at most this many steps left over are listed after the planned ones
MIN_PART_SECONDS = 60.0  # a command's leftover shorter than this is not worth starting a step in
CALL_SLACK = 10.0  # seconds of a command's limit left to whatever starts it (SECONDS = the limit - 10)


@dataclasses.dataclass(frozen=True)
class Margins:
    """Seconds a command spends outside the rounds (the record's ``margins_seconds``, its ``why``); ``pack``:
    kept free at the end for packing or copying what the runs wrote."""

    command_start: float
    cell_start: float
    stop: float
    pack: float

    @property
    def outside(self) -> float:
        """A command's seconds outside its steps: the call's slack, start-up, stop and packing."""
        return CALL_SLACK + self.command_start + self.stop + self.pack


@dataclasses.dataclass(frozen=True, eq=False)  # (eq=False: a step is itself, hashed by identity)
class Step:
    """One program to run: a cell, or cells of one method as rows of one program."""

    cells: tuple[Cell, ...]
    state: str  # 'new', 'resume' (from its checkpoint) or 'rerun' (unfinished, no checkpoint)
    rounds: int  # rounds it has to run
    seconds_per_round: float | None  # the program's (all its cells together); None: unknown
    source: str  # where the estimate comes from

    @property
    def label(self) -> str:
        first = self.cells[0]
        if len(self.cells) == 1:
            return first.folder_name
        return f"{first.method.name}: {len(self.cells)} cells as rows of one program"

    def seconds(self, margins: Margins) -> float | None:
        """Its start plus its rounds."""
        if self.seconds_per_round is None:
            return None
        return margins.cell_start + self.rounds * self.seconds_per_round


@dataclasses.dataclass
class Command:
    """One device command of the plan: its seconds and the (step, seconds of it) expected in it."""

    seconds: float
    parts: list = dataclasses.field(default_factory=list)

    def estimate(self, margins: Margins) -> float:
        return margins.outside + sum(seconds for _, seconds in self.parts)


@dataclasses.dataclass
class Plan:
    commands: list[Command]
    left: list[Step]  # not planned in this budget (no time, or no estimate), in order

    @property
    def planned(self) -> list[Step]:
        return list(dict.fromkeys(step for c in self.commands for step, _ in c.parts))

    def run_list(self) -> list[Step]:
        """What every command of the plan runs, in order: the planned steps, then standby."""
        return self.planned + self.left[:STANDBY_CELLS]


def _rival_key(spec: TableSpec, row: str, setting: str, index: int) -> tuple:
    """Rank of a row within a setting: the headline row, then nearest published number, then none."""
    if spec.headline_row is None:
        return (0, 0, 0.0, index)
    own, ref = spec.paper_value(row, setting), spec.paper_value(spec.headline_row, setting)
    distance = abs(own.mean - ref.mean) if own is not None and ref is not None else 0.0
    return (row != spec.headline_row, own is None, distance, index)


def _setting_key(spec: TableSpec, name: str, index: int) -> tuple:
    groups = {s.group for s in spec.settings if s.name in spec.headline_settings and s.group}
    group = next(s.group for s in spec.settings if s.name == name)
    return (0 if name in spec.headline_settings else 1 if group in groups else 2, index)


def priority(spec: TableSpec, cells: list[Cell]) -> list[Cell]:
    """``cells`` in the order a plan runs them (module docstring, 1)."""
    first_seed = cells[0].seed if cells else 0
    setting_index = {s.name: i for i, s in enumerate(spec.settings)}
    row_index = {m.name: i for i, m in enumerate(spec.methods)}

    def key(c: Cell) -> tuple:
        setting = _setting_key(spec, c.setting.name, setting_index[c.setting.name])
        own_row = c.method.name == spec.headline_row and setting[0] <= 1
        return (c.seed != first_seed, not own_row, setting,
                _rival_key(spec, c.method.name, c.setting.name, row_index[c.method.name]), c.seed)

    return sorted(cells, key=key)


def windows(budget_seconds: float, limit: float) -> list[float]:
    """The budget cut into the fewest equal commands of at most ``limit`` seconds each."""
    count = max(1, math.ceil(budget_seconds / limit))
    return [math.floor(budget_seconds / count)] * count


def check_budget(budget_seconds, margins: Margins) -> None:
    """UserError (one line) for a --plan-for-seconds that is no number or holds no command worth running."""
    least = margins.outside + margins.cell_start + MIN_PART_SECONDS
    if not isinstance(budget_seconds, (int, float)) or not math.isfinite(budget_seconds) or budget_seconds < least:
        raise UserError(f"--plan-for-seconds must be the budget's seconds for commands, at least {least:.0f} (one "
                        f"command's start, stop and packing margins and one step's start and a minute); got "
                        f"{budget_seconds!r}")


def pack(queues: list[list[Cell]], step_of, budget_seconds: float, limit: float, margins: Margins) -> Plan:
    """The queues' cells laid into the budget's commands as programs (module docstring, 2): ``step_of(cells)``
    is the `Step` of a program of those cells; commands left empty at the end are dropped."""
    commands = [Command(w) for w in windows(budget_seconds, limit)]
    queues = [list(q) for q in queues if q]
    for command in commands:
        for queue in queues:
            free = command.seconds - command.estimate(margins)
            for count in range(len(queue), 0, -1):  # the longest head that fits
                step = step_of(queue[:count])
                seconds = step.seconds(margins)
                if seconds is not None and seconds <= free:
                    command.parts.append((step, seconds))
                    del queue[:count]
                    break
    while len(commands) > 1 and not commands[-1].parts:  # commands the plan does not need
        commands.pop()
    return Plan(commands, [step_of(q) for q in queues if q])


def sequence(queues: list[list[Cell]], step_of, budget_seconds: float, margins: Margins) -> Plan:
    """A background plan (one command of ``budget_seconds``): every queue's cells one program each, in order,
    without fitting; a cell cut by the budget's end resumes in the next plan (it checkpoints as it goes). The
    command's parts are the steps expected to start within the budget, the last with the seconds it gets."""
    command = Command(budget_seconds)
    steps = [step_of([cell]) for queue in queues for cell in queue]
    left = []
    for step in steps:
        free = command.seconds - command.estimate(margins)
        seconds = step.seconds(margins)
        if seconds is None or free < MIN_PART_SECONDS:
            left.append(step)
            continue
        command.parts.append((step, min(seconds, free)))
    return Plan([command], left)


def _step_line(step: Step, seconds: float | None, margins: Margins) -> str:
    rate = "?" if step.seconds_per_round is None else f"{step.seconds_per_round:.2f}"
    total = step.seconds(margins)
    part = "" if seconds is None or total is None or abs(seconds - total) < 0.5 else f" (of {total:.0f})"
    spent = "?" if seconds is None else f"{seconds:.0f}{part}"
    return f"| {step.label} | {step.state} | {step.rounds} | {rate} | {spent} | {step.source} |"


def markdown(spec: TableSpec, plan: Plan, budget_seconds: float, kind: str, margins: Margins, command: str,
             script_path: str, restarted: list[str] = (), work: str | None = None) -> str:
    """The plan for people: what each command is expected to run, what waits, and how to run it; ``work``: the
    work folder of a background plan (None: a device's commands)."""
    heads = ["| step | state | rounds | s/round | seconds | estimate from |", "|---|---|---|---|---|---|"]
    programs = ("one cell a program, cut by the budget's end where it must (it resumes in the next plan)"
                if work is not None else "a method's cells as rows of one program")
    if work is not None:
        how = [f"Run: `bash {script_path} [SECONDS [WORK]]` from the folder the table's configs are found from, with "
               "FEDJAX_PFL_DATA_DIR naming the dataset files: it starts the plan in the background at low priority "
               "on one core (CORE=k picks it) and returns; SECONDS (default the plan's) later the cell in flight "
               f"stops after its round, with a checkpoint. The cells run in WORK (default {work}, outside the "
               "repository: every clone finds them); each finished cell is copied into this table's runs/ as a "
               f"compact record and the table written again, to commit. Its output: WORK/{plan_log.OUTPUT}; its "
               f"log, which the next plan reads: WORK/{plan_log.NAME}. Plan again to continue: resumable cells go "
               "first.", ""]
    else:
        how = [f"Run: `bash {script_path} [SECONDS [WORK]]` once per command, one right after another, from the "
               "folder the table's configs are found from, with FEDJAX_PFL_DATA_DIR naming the dataset files (the "
               "command refuses in one line, exit 2, before training when they are missing). SECONDS: the "
               f"command's limit minus {CALL_SLACK:.0f} (default: the first command's); WORK: where the runs go "
               "(default: this table's folder; elsewhere, copy its finished run folders into runs/ here and write "
               "the table again with --table-only). A cut cell resumes from its checkpoint in WORK.", ""]
    lines = [f"# Run plan: {spec.name} on {kind}", "",
             f"Made by `{command}` from the cells not finished when it ran, in the order of "
             "fedjax_pfl/cells/run_plan.py (the headline setting first, then the rows nearest the headline "
             f"row's published number, resumable cells first), {programs}. Seconds are estimates of each "
             "program, its cells together (cells/round_seconds.py); margins per command: "
             f"start {margins.command_start:.0f}, stop {margins.stop:.0f}, packing {margins.pack:.0f}; per step: "
             f"start {margins.cell_start:.0f} (benchmarks/seconds_per_round.json says why, and what the model's "
             "step law is fitted to).", "",
             f"{len(plan.commands)} command(s) for {budget_seconds:.0f} s; {len(plan.planned)} step(s) planned "
             f"({sum(len(s.cells) for s in plan.planned)} cells), {len(plan.left)} left for a later plan.", "",
             *how, *([f"- {note}" for note in restarted] + [""] if restarted else [])]
    for i, command in enumerate(plan.commands, 1):
        lines += [f"## Command {i}: {command.seconds:.0f} s, estimated {command.estimate(margins):.0f} s", "",
                  f"    bash {script_path} {command.seconds - CALL_SLACK:.0f}", "", *heads,
                  *[_step_line(step, seconds, margins) for step, seconds in command.parts], "",
                  *[f"- {step.label}: {', '.join(c.folder_name for c in step.cells)}" for step, _ in command.parts
                    if len(step.cells) > 1], ""]
    if plan.left:
        shown = plan.left[:STANDBY_CELLS]
        lines += [f"## Left for a later plan ({len(plan.left)} steps; the first {len(shown)} run as standby when "
                  "a command has time left)", "", *heads, *[_step_line(s, s.seconds(margins), margins) for s in shown],
                  ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def script(spec: TableSpec, plan: Plan, margins: Margins, table_args: list[str], run_args: list[str], made_by: str,
           script_path: str, out: str) -> str:
    """The bash script every device command of the plan runs (module docstring, 4): ``table_args`` name the
    table (NAME or --table-file FILE), ``run_args`` the options and overrides of its cells, ``out`` the table's
    folder (the default work folder)."""
    programs = ";".join(",".join(c.folder_name for c in step.cells) for step in plan.run_list())
    table = shlex.join(["-m", "fedjax_pfl.reproduce", *table_args])
    run = shlex.join([*run_args, "--no-progress", "--require-data"])
    keep = margins.stop + margins.pack
    default = plan.commands[0].seconds - CALL_SLACK
    usage = f"bash {script_path} [SECONDS [WORK]] (SECONDS: the command's limit minus {CALL_SLACK:.0f}, default {default:.0f})"
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# One device command of the run plan for {spec.name}: trains the cells below in order (finished ones",
        "# skipped, a cut one resumed from its checkpoint) into WORK (default: the table's folder) and stops them",
        "# (SIGINT: after the round in flight, with a checkpoint) SECONDS minus the stop and packing margins after",
        "# it starts. The dataset files come from FEDJAX_PFL_DATA_DIR: missing ones stop it before training (exit 2).",
        f"#   {usage}",
        f"# Written by: {made_by}",
        "set -uo pipefail",
        f"seconds=${{1:-{default:.0f}}}",
        f"work=${{2:-{shlex.quote(out)}}}",
        f"[[ $seconds =~ ^[0-9]+$ ]] || {{ echo \"error: SECONDS must be a whole number; usage: {usage}\" >&2; exit 2; }}",
        f"run_for=$((seconds - {keep:.0f}))",
        f"(( run_for > {margins.command_start + margins.cell_start:.0f} )) || {{ echo \"error: SECONDS too small "
        f"(at least {keep + margins.command_start + margins.cell_start + 1:.0f}); usage: {usage}\" >&2; exit 2; }}",
        "export PYTHONUNBUFFERED=1",
        "python=$(command -v python3 || command -v python)",
        "cells=" + shlex.quote(programs),
        f"timeout -s INT -k {margins.stop:.0f} \"$run_for\" \"$python\" {table} {run} --out \"$work\" --cells \"$cells\"",
        ""])


def background_script(spec: TableSpec, plan: Plan, margins: Margins, table_args: list[str], run_args: list[str],
                      made_by: str, script_path: str, out: str, work: str, background: dict) -> str:
    """The bash script of a background plan (a CPU's): checks the dataset files, then starts the table command
    on the planned cells (``--cells``, one a program) at ``background['nice']`` on one core, in WORK, copying
    each finished cell into ``out`` (``--collect-into``), stopped by SIGINT SECONDS later; and returns."""
    cells = ";".join(c.folder_name for step in plan.run_list() for c in step.cells)  # (";": a program each)
    table = shlex.join(["-m", "fedjax_pfl.reproduce", *table_args])
    run = shlex.join([*run_args, "--no-progress", "--require-data"])
    keep = margins.stop + margins.pack
    default = plan.commands[0].seconds - CALL_SLACK
    cache = '${FEDJAX_PFL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fedjax_pfl}'
    usage = (f"bash {script_path} [SECONDS [WORK]] (SECONDS: how long the plan may run, default {default:.0f}; "
             f"WORK: where its cells run, default {cache}/cells/{spec.name}; CORE=k: the core, default the last)")
    nice = int(background.get("nice", 19))
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# The background run plan for {spec.name}: starts the cells below (finished ones skipped, a cut one resumed",
        f"# from its checkpoint) at nice {nice} on one core, in WORK (outside the repository: every clone finds them),",
        f"# and returns. Each finished cell is copied into {out}/runs/ as a compact record and the table written",
        "# again (commit them). SECONDS after the start the cell in flight stops after its round, with a checkpoint;",
        f"# output in WORK/{plan_log.OUTPUT}, the log the next plan reads in WORK/{plan_log.NAME}.",
        f"#   {usage}",
        f"# Written by: {made_by}",
        "set -uo pipefail",
        f"seconds=${{1:-{default:.0f}}}",
        f'work=${{2:-{cache}/cells/{spec.name}}}',
        f"[[ $seconds =~ ^[0-9]+$ ]] || {{ echo \"error: SECONDS must be a whole number; usage: {usage}\" >&2; exit 2; }}",
        f"run_for=$((seconds - {keep:.0f}))",
        f"(( run_for > {margins.command_start + margins.cell_start:.0f} )) || {{ echo \"error: SECONDS too small "
        f"(at least {keep + margins.command_start + margins.cell_start + 1:.0f}); usage: {usage}\" >&2; exit 2; }}",
        'core=${CORE:-$(( $(nproc) - 1 ))}',
        'mkdir -p "$work"',
        'if [[ -f "$work/runner.pid" ]] && kill -0 "$(cat "$work/runner.pid")" 2>/dev/null; then',
        '  echo "error: a plan already runs in $work (pid $(cat "$work/runner.pid")); let it finish, or stop it after '
        'its round with: kill -INT $(cat "$work/runner.pid")" >&2; exit 2',
        "fi",
        "export PYTHONUNBUFFERED=1",
        "python=$(command -v python3 || command -v python)",
        "cells=" + shlex.quote(cells),
        f'"$python" {table} {run} --out "$work" --cells "$cells" --dry-run > /dev/null || exit $?  # missing data: one line',
        'pin=(); command -v taskset > /dev/null && pin=(taskset -c "$core")',
        f'nohup nice -n {nice} "${{pin[@]}}" timeout -s INT -k {margins.stop:.0f} "$run_for" "$python" {table} {run} '
        f'--out "$work" --collect-into {shlex.quote(out)} --cells "$cells" >> "$work/{plan_log.OUTPUT}" 2>&1 < /dev/null &',
        'echo $! > "$work/runner.pid"',
        f'echo "started {spec.name}\'s plan in the background (pid $!, core $core, nice {nice}, $seconds s): output in '
        f'$work/{plan_log.OUTPUT}; finished cells are copied into {out}/runs/"',
        ""])


def as_json(spec: TableSpec, plan: Plan, budget_seconds: float, kind: str, margins: Margins, extra: list[str]) -> dict:
    """The plan as data: what made it (to make it again later), the commands, the standby steps (the first
    `STANDBY_CELLS` of those left) and the run list."""
    def step(s: Step, seconds: float | None) -> dict:
        return {"cells": [c.folder_name for c in s.cells], "state": s.state, "rounds": s.rounds,
                "seconds_per_round": s.seconds_per_round, "seconds": seconds, "seconds_whole": s.seconds(margins),
                "estimate_from": s.source}

    return {"table": spec.name, "kind": kind, "plan_for_seconds": budget_seconds, "overrides": list(extra),
            "margins_seconds": dataclasses.asdict(margins),
            "commands": [{"seconds": c.seconds, "estimate": c.estimate(margins),
                          "steps": [step(s, sec) for s, sec in c.parts]} for c in plan.commands],
            "left_steps": len(plan.left), "standby": [step(s, s.seconds(margins)) for s in plan.left[:STANDBY_CELLS]],
            "run_list": [c.folder_name for s in plan.run_list() for c in s.cells]}


def margins_of(kind: dict) -> Margins:
    """The record's margins of a device kind."""
    raw = kind.get("margins_seconds") or {}
    try:
        return Margins(*(float(raw[k]) for k in ("command_start", "cell_start", "stop", "pack")))
    except (KeyError, TypeError, ValueError):
        raise UserError("the seconds-per-round record's margins_seconds needs command_start, cell_start, stop and "
                        "pack (seconds)") from None
