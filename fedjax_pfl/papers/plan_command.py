"""The table command's time budget: ``reproduce TABLE --plan-for-seconds S``.

Reads every chosen cell's state here (finished, resumable, new; a cell an
earlier table keeps counts as finished), estimates each cell's seconds per
round on ``--device-kind`` (papers/round_seconds.py), orders and packs the
missing ones into device commands that fit S seconds (papers/run_plan.py)
and writes, beside the table: run_plan.md (for people), run_plan.sh (what
each device command runs: ``bash OUT/run_plan.sh [SECONDS [WORK]]``) and
run_plan.json (the plan as data, and what made it). A method's new cells
are rows of one program (papers/reproduce.py), and every cell runs with
``train.client_mapping=packed`` unless the command sets a mapping (the rows
share the lanes; `auto` would time its candidates in every lone cell, 35-55 s
each on an H200, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.papers import round_seconds, run_plan
from fedjax_pfl.papers.cell_command import build_config, cell_argv, cell_state, display_path
from fedjax_pfl.papers.table_spec import NO_DATA, Cell, TableSpec

PLAN_MAPPING = "train.client_mapping=packed"
PLAN_FILES = ("run_plan.md", "run_plan.sh", "run_plan.json")


def plan_overrides(extra: list[str]) -> list[str]:
    """``extra`` with the plan's client mapping, unless it sets one."""
    return list(extra) if any(o.startswith("train.client_mapping=") for o in extra) else [*extra, PLAN_MAPPING]


def without_plan_mapping(extra: list[str]) -> list[str]:
    """``extra`` without the plan's client mapping (it changes no number: the table's header leaves it out)."""
    return [o for o in extra if o != PLAN_MAPPING]


def _kept_seeds(kept: dict) -> set[tuple[str, str, int]]:
    """(row, setting, seed) of the cells an earlier table keeps finished (paper_table.kept_cells)."""
    return {(row, setting, int(seed)) for (row, setting), found in kept.items()
            for seed in found["seeds"].split(", ") if seed.isdigit()}


def program_queues(cells: list[Cell], out: Path, rounds: dict, extra: list[str], args, no_data: dict, kept: dict,
                   kind: dict, record: dict) -> tuple[list[list[Cell]], dict, object]:
    """(queues, states, step_of) of ``cells`` (in plan order) for `run_plan.pack`: a method's new cells one queue
    (one program may hold them as rows), each resumable cell, and with --one-by-one every cell, a queue of its own;
    ``step_of(cells)`` the `run_plan.Step` of a program of them, estimated by `round_seconds.program_seconds`."""
    law, sizes, work = round_seconds.lane_law(kind), round_seconds.ClientSizes(), record["work"]
    if law is None:
        raise UserError(f"benchmarks/seconds_per_round.json gives device kind {args.device_kind!r} no "
                        "lane_step_seconds; plan for a kind that has them")
    measured = round_seconds.measured_programs(out / "runs", kind["machine"])
    factor, source = round_seconds.calibration(measured, law, work, sizes)
    finished_elsewhere = _kept_seeds(kept)
    configs, states, rounds_left, queues, of_method = {}, {}, {}, [], {}
    for cell in cells:
        used = rounds[cell.setting.name][0]
        folder = out / "runs" / cell.folder_name
        cfg = configs[cell.folder_name] = build_config(cell_argv(cell, folder, used, extra, args.data_dir)).config
        state = cell_state(folder, cfg)
        if (cell.method.name, cell.setting.name, cell.seed) in finished_elsewhere:
            state = "finished"
        if cell.setting.name in no_data and state != "finished":
            state = NO_DATA
        records = run_folder.read_records(folder) if state == "resume" else []
        states[cell.folder_name], rounds_left[cell.folder_name] = state, used - (records[-1]["round"] if records else 0)
        if state == "new" and not args.one_by_one:
            if cell.method.name not in of_method:
                of_method[cell.method.name] = len(queues)
                queues.append([])
            queues[of_method[cell.method.name]].append(cell)
        elif state in ("new", "resume", "rerun"):
            queues.append([cell])

    def step_of(program: list[Cell]) -> run_plan.Step:
        first = program[0].folder_name
        seconds = factor * round_seconds.program_seconds([configs[c.folder_name] for c in program], law, work, sizes)
        return run_plan.Step(tuple(program), states[first], rounds_left[first], seconds, source)

    return queues, states, step_of


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
    queues, states, step_of = program_queues(run_plan.priority(spec, cells), out, rounds, extra, args, no_data, kept,
                                             kind, record)
    plan = run_plan.pack(queues, step_of, args.plan_for_seconds, limit, margins)
    if not plan.planned:  # before any file is written: an empty plan would replace the one there
        raise UserError(f"nothing to plan for {spec.name}: {why_empty(queues, states, no_data, step_of, margins)}")
    script_path = f"{display_path(out)}/run_plan.sh"
    run_args = [*(["--rounds", str(args.rounds)] if args.rounds else []), *(["--one-by-one"] if args.one_by_one else []),
                *extra]
    out.mkdir(parents=True, exist_ok=True)
    texts = {"run_plan.md": run_plan.markdown(spec, plan, args.plan_for_seconds, args.device_kind, margins,
                                                  made_by, script_path),
             "run_plan.sh": run_plan.script(spec, plan, margins, table_args, run_args, made_by, script_path,
                                            display_path(out)),
             "run_plan.json": json.dumps({**run_plan.as_json(spec, plan, args.plan_for_seconds, args.device_kind,
                                                                  margins, extra), "made_by": made_by},
                                           indent=1) + "\n"}
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
    planned = [c for command in plan["commands"] for step in command["steps"] for c in step["cells"]]
    cells = list(dict.fromkeys(planned))
    shown = ", ".join(cells[:12]) + (f" and {len(cells) - 12} more" if len(cells) > 12 else "")
    calls = "; ".join(f"`bash {display_path(out)}/run_plan.sh {c['seconds'] - run_plan.CALL_SLACK:.0f}` (a command "
                      f"of {c['seconds']:.0f} s, estimated {c['estimate']:.0f} s)" for c in plan["commands"])
    return [f"Planned runs ({plan['kind']}; {display_path(out)}/run_plan.md, made by `{plan['made_by']}`): "
            f"{len(plan['commands'])} device command(s), one right after another: "
            f"{calls}. Expected to finish {len(cells)} cell(s): {shown or 'none'}; "
            f"{plan['left_steps']} step(s) wait for a later plan."]


def made_by(table_command: str, args) -> str:
    """The planning command as the plan files name it."""
    kind = [] if args.device_kind == "nvidia-h200" else ["--device-kind", args.device_kind]
    return shlex.join([*shlex.split(table_command), "--plan-for-seconds", f"{args.plan_for_seconds:g}", *kind])
