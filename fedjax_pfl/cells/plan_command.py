"""The table command's time budget: ``reproduce TABLE --plan-for-seconds S``.

Reads every chosen cell's state here (finished, resumable, new; a cell an
earlier table keeps counts as finished), estimates each cell's seconds per
round on ``--device-kind`` (cells/round_seconds.py), orders and packs the
missing ones into device commands that fit S seconds (cells/run_plan.py)
and writes, beside the table: run_plan.md (for people), run_plan.sh (what
each device command runs: ``bash OUT/run_plan.sh [SECONDS [WORK]]``) and
run_plan.json (the plan as data, and what made it). A method's new cells
are rows of one program (cells/reproduce.py), and every cell runs with the
kind's client mapping (``packed`` unless the kind's record names another)
unless the command sets a mapping (the rows share the lanes; `auto` would
time its candidates in every lone cell, 35-55 s each on an H200,
benchmarks/RESULTS.md). Resumable cells come first (what a cut command had
half done).

A kind whose record has ``background`` (the CPU: slices of hours at low
priority beside other work, not a lent device's 600 s commands) plans one
cell a program (``cells_per_program``: a cell finishes, and can be committed,
before the next starts), runs its cells in a work folder outside the
repository (``--work``, default the user cache's cells/TABLE:
cells/plan_log.py) whose finished cells the command copies into the table's
folder as compact records (cells/collect.py), and its run_plan.sh starts
the command in the background and returns. The plan reads the work folder:
its runs' seconds (finished or not) calibrate the estimate, and its log
names the cells that ran before but whose checkpoints are gone (they start
again, and the plan says so).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.cells import plan_log, round_seconds, run_plan
from fedjax_pfl.cells.cell_command import build_config, cell_argv, cell_state, display_path
from fedjax_pfl.papers.table_spec import NO_DATA, Cell, TableSpec

PLAN_FILES = ("run_plan.md", "run_plan.sh", "run_plan.json")


def kind_overrides(kind: dict) -> list[str]:
    """The overrides a kind's plan runs its cells with: its client mapping (default packed) and its own
    (e.g. the CPU's ``devices.cpu=1``: one core)."""
    return [f"train.client_mapping={kind.get('client_mapping', 'packed')}", *kind.get("overrides", ())]


def plan_overrides(extra: list[str], kind: dict) -> list[str]:
    """``extra`` with the kind's overrides, each unless ``extra`` sets its key."""
    keys = {o.split("=", 1)[0] for o in extra}
    return [*extra, *(o for o in kind_overrides(kind) if o.split("=", 1)[0] not in keys)]


def without_plan_overrides(extra: list[str], kind: dict) -> list[str]:
    """``extra`` without the kind's overrides (they change no number: the table's header leaves them out)."""
    return [o for o in extra if o not in kind_overrides(kind)]


def is_background(kind: dict) -> bool:
    return bool(kind.get("background"))


def work_folder(args, table: str, out: Path, kind: dict) -> Path:
    """Where the plan's cells run: ``--work``, else the user cache for a background kind, else the table's
    folder."""
    if getattr(args, "work", None):
        return Path(args.work)
    return plan_log.default_work_folder(table) if is_background(kind) else Path(out)


def _kept_seeds(kept: dict) -> set[tuple[str, str, int]]:
    """(row, setting, seed) of the cells an earlier table keeps finished (paper_table.kept_cells)."""
    return {(row, setting, int(seed)) for (row, setting), found in kept.items()
            for seed in found["seeds"].split(", ") if seed.isdigit()}


def program_queues(cells: list[Cell], out: Path, rounds: dict, extra: list[str], args, no_data: dict, kept: dict,
                   kind: dict, record: dict, work: Path | None = None) -> tuple[list[list[Cell]], dict, object]:
    """(queues, states, step_of) of ``cells`` (in plan order) for `run_plan.pack`: a method's new cells one queue
    (one program may hold them as rows), each resumable cell, and with --one-by-one or a kind of one cell a
    program every cell, a queue of its own; resumable cells' queues first; ``step_of(cells)`` the
    `run_plan.Step` of a program of them, estimated by `round_seconds.program_seconds`. States are read in
    ``work`` (default ``out``), a cell finished in ``out`` (the table's folder) counting as finished."""
    work = Path(out if work is None else work)
    law, sizes, model = round_seconds.lane_law(kind), round_seconds.ClientSizes(), record["work"]
    if law is None:
        raise UserError(f"benchmarks/seconds_per_round.json gives device kind {args.device_kind!r} no "
                        "lane_step_seconds; plan for a kind that has them")
    one_lane = kind.get("client_mapping") == "map"
    measured = round_seconds.measured_programs(work / "runs", kind["machine"], is_background(kind))
    if Path(out).resolve() != work.resolve():  # the table's own runs, each cell once (its copy in work counted)
        in_work = frozenset(f"{f.parent.name}/{f.name}" for f in (work / "runs").glob("*/seed*"))
        measured += round_seconds.measured_programs(Path(out) / "runs", kind["machine"], skip=in_work)
    factor, source = round_seconds.calibration(measured, law, model, sizes, one_lane)
    alone = args.one_by_one or int(kind.get("cells_per_program", 0)) == 1
    finished_elsewhere = _kept_seeds(kept)
    configs, states, rounds_left, queues, of_method = {}, {}, {}, [], {}
    for cell in cells:
        used = rounds[cell.setting.name][0]
        folder = work / "runs" / cell.folder_name
        cfg = configs[cell.folder_name] = build_config(cell_argv(cell, folder, used, extra, args.data_dir)).config
        state = cell_state(folder, cfg)
        if (cell.method.name, cell.setting.name, cell.seed) in finished_elsewhere or _finished_in(out, cell, work):
            state = "finished"
        if cell.setting.name in no_data and state != "finished":
            state = NO_DATA
        records = run_folder.read_records(folder) if state == "resume" else []
        states[cell.folder_name], rounds_left[cell.folder_name] = state, used - (records[-1]["round"] if records else 0)
        if state == "new" and not alone:
            if cell.method.name not in of_method:
                of_method[cell.method.name] = len(queues)
                queues.append([])
            queues[of_method[cell.method.name]].append(cell)
        elif state in ("new", "resume", "rerun"):
            queues.append([cell])
    queues.sort(key=lambda q: states[q[0].folder_name] != "resume")  # (stable: plan order otherwise)

    def step_of(program: list[Cell]) -> run_plan.Step:
        first = program[0].folder_name
        seconds = factor * round_seconds.program_seconds([configs[c.folder_name] for c in program], law, model, sizes,
                                                         one_lane)
        return run_plan.Step(tuple(program), states[first], rounds_left[first], seconds, source)

    return queues, states, step_of


def _finished_in(out: Path, cell: Cell, work: Path) -> bool:
    """Whether the table's folder ``out`` (when it is not the work folder) holds the cell's finished run."""
    folder = Path(out) / "runs" / cell.folder_name
    return (Path(out).resolve() != work.resolve() and run_folder.is_run(folder)
            and (run_folder.read_summary(folder) or {}).get("status") == "finished")


def restarted_notes(states: dict, work: Path) -> list[str]:
    """The cells the work folder's log saw run that start again now: their checkpoints are gone."""
    started = plan_log.started_cells(work)
    return [plan_log.gone_note(cell, started[cell]) for cell, state in states.items()
            if state in ("new", "rerun") and started.get(cell, {}).get("rounds", 0) > 0]


def checked_kind(args) -> tuple[dict, dict, run_plan.Margins, float]:
    """(record, kind, margins, command limit) for --device-kind; UserError for an unknown kind or a
    --plan-for-seconds that holds no command (before any cell is looked at)."""
    record = round_seconds.load_record(args.device_record and Path(args.device_record))
    kind = round_seconds.kind_record(record, args.device_kind)
    margins = run_plan.margins_of(kind)
    limit = float(kind.get("command_limit_seconds", 600))
    run_plan.check_budget(args.plan_for_seconds, margins)
    return record, kind, margins, limit


def write_plan(spec: TableSpec, cells: list[Cell], out: Path, rounds: dict, args, extra: list[str],
                    no_data: dict, kept: dict, table_args: list[str], made_by: str) -> run_plan.Plan:
    """Plan ``cells`` for ``args.plan_for_seconds`` and write the three plan files into ``out``; returns the plan."""
    record, kind, margins, limit = checked_kind(args)
    work = work_folder(args, spec.name, out, kind)
    queues, states, step_of = program_queues(run_plan.priority(spec, cells), out, rounds, extra, args, no_data, kept,
                                             kind, record, work)
    if is_background(kind):
        plan = run_plan.sequence(queues, step_of, args.plan_for_seconds, margins)
    else:
        plan = run_plan.pack(queues, step_of, args.plan_for_seconds, limit, margins)
    if not plan.planned:  # before any file is written: an empty plan would replace the one there
        raise UserError(f"nothing to plan for {spec.name}: {why_empty(queues, states, no_data, step_of, margins)}")
    restarted = restarted_notes(states, work)
    script_path = f"{display_path(out)}/run_plan.sh"
    run_args = [*(["--rounds", str(args.rounds)] if args.rounds else []), *(["--one-by-one"] if args.one_by_one else []),
                *extra]
    out.mkdir(parents=True, exist_ok=True)
    if is_background(kind):
        script = run_plan.background_script(spec, plan, margins, table_args, run_args, made_by, script_path,
                                            display_path(out), str(work), kind["background"])
    else:
        script = run_plan.script(spec, plan, margins, table_args, run_args, made_by, script_path, display_path(out))
    texts = {"run_plan.md": run_plan.markdown(spec, plan, args.plan_for_seconds, args.device_kind, margins,
                                                  made_by, script_path, restarted,
                                                  str(work) if is_background(kind) else None),
             "run_plan.sh": script,
             "run_plan.json": json.dumps({**run_plan.as_json(spec, plan, args.plan_for_seconds, args.device_kind,
                                                                  margins, extra), "made_by": made_by,
                                          "work": str(work), "background": is_background(kind),
                                          "restarted": restarted}, indent=1) + "\n"}
    for name, text in texts.items():
        with atomic_write(out / name) as f:
            f.write(text)
    (out / "run_plan.sh").chmod(0o755)
    return plan


def why_empty(queues: list, states: dict, no_data: dict, step_of, margins: run_plan.Margins) -> str:
    """Why a plan holds no program, in words that say what to do."""
    if any(state == NO_DATA for state in states.values()):
        reasons = "; ".join(dict.fromkeys(no_data.values()))
        return (f"the dataset files of {len(no_data)} setting(s) are missing ({reasons}); set FEDJAX_PFL_DATA_DIR or "
                "pass --data-dir, and plan again")
    if not queues:
        return "every chosen cell is finished"
    shortest = min(step_of(q[:1]).seconds(margins) for q in queues)
    return f"no program fits the budget (one cell alone needs {shortest:.0f} s besides the commands' margins)"


def saved_plan(out: Path) -> dict | None:
    """OUT/run_plan.json, or None."""
    path = Path(out) / "run_plan.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not a run plan ({e}); remove it, or plan again with --plan-for-seconds") from None


def plan_note(out: Path) -> list[str]:
    """The table's note on the planned runs, from OUT/run_plan.json (none without one)."""
    plan = saved_plan(out)
    if plan is None:
        return []
    steps = [step for command in plan["commands"] for step in command["steps"]]
    whole = [step for step in steps if step.get("seconds_whole") is None or step["seconds"] >= step["seconds_whole"] - 1]
    cells = list(dict.fromkeys(c for step in whole for c in step["cells"]))
    cut = list(dict.fromkeys(c for step in steps if step not in whole for c in step["cells"]))
    shown = ", ".join(cells[:12]) + (f" and {len(cells) - 12} more" if len(cells) > 12 else "")
    shown += f"; cut by the budget's end, to resume: {', '.join(cut)}" if cut else ""
    if plan.get("background"):
        how = (f"a background command of {plan['plan_for_seconds']:.0f} s at low priority "
               f"(`bash {display_path(out)}/run_plan.sh`), its cells in {plan['work']}")
    else:
        how = f"{len(plan['commands'])} device command(s), one right after another: " + "; ".join(
            f"`bash {display_path(out)}/run_plan.sh {c['seconds'] - run_plan.CALL_SLACK:.0f}` (a command "
            f"of {c['seconds']:.0f} s, estimated {c['estimate']:.0f} s)" for c in plan["commands"])
    return [f"Planned runs ({plan['kind']}; {display_path(out)}/run_plan.md, made by `{plan['made_by']}`): "
            f"{how}. Expected to finish {len(cells)} cell(s): {shown or 'none'}; "
            f"{plan['left_steps']} step(s) wait for a later plan."]


def made_by(table_command: str, args) -> str:
    """The planning command as the plan files name it."""
    kind = [] if args.device_kind == "nvidia-h200" else ["--device-kind", args.device_kind]
    return shlex.join([*shlex.split(table_command), "--plan-for-seconds", f"{args.plan_for_seconds:g}", *kind])
