"""The table command's lease modes: plan the next lease, pack a lease's records there, land them here.

``--plan-for-seconds S`` reads every chosen cell's state here (finished,
resumable, new; a cell an earlier table keeps counts as finished), estimates
each cell's seconds per round on ``--device-kind`` (papers/round_seconds.py),
orders and packs the missing ones (papers/run_plan.py) and writes, beside
the table: lease_plan.md (for people), lease_plan.sh (what each device
command runs: ``bash OUT/lease_plan.sh SECONDS``) and lease_plan.json (the
plan as data, and what made it). Every cell of the plan runs with
``train.client_mapping=vmap`` unless the command sets a mapping: `auto`
would time its candidates in every cell (35-55 s each on an H200,
benchmarks/RESULTS.md), and at 20 clients it chose vmap.

On the lent machine the script trains the listed cells in runs/lease/NAME
(ignored by git, so the machine keeps it between calls while it stays warm,
and a cut cell's checkpoint with it) and ``--pack-records`` packs their records into $OUT/records.tar.gz
(papers/run_records.py). Here ``--bring-back`` lands them in the table's
runs/, then the table and the plan are written again.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.papers import round_seconds, run_plan, run_records
from fedjax_pfl.papers.cell_command import (batchable, build_config, cell_argv, cell_state, consecutive_groups,
                                            display_path)
from fedjax_pfl.papers.table_spec import NO_DATA, Cell, TableSpec
from fedjax_pfl.runs import config as config_lib

LEASE_MAPPING = "train.client_mapping=vmap"
PLAN_FILES = ("lease_plan.md", "lease_plan.sh", "lease_plan.json")


def lease_overrides(extra: list[str]) -> list[str]:
    """``extra`` with the lease's client mapping, unless it sets one."""
    return list(extra) if any(o.startswith("train.client_mapping=") for o in extra) else [*extra, LEASE_MAPPING]


def without_lease_mapping(extra: list[str]) -> list[str]:
    """``extra`` without the lease's client mapping (it changes no number: the table's header leaves it out)."""
    return [o for o in extra if o != LEASE_MAPPING]


def _kept_seeds(kept: dict) -> set[tuple[str, str, int]]:
    """(row, setting, seed) of the cells an earlier table keeps finished (paper_table.kept_cells)."""
    return {(row, setting, int(seed)) for (row, setting), found in kept.items()
            for seed in found["seeds"].split(", ") if seed.isdigit()}


def cell_inputs(cells: list[Cell], out: Path, rounds: dict, extra: list[str], data_dir: str | None,
                no_data: dict, kept: dict, one_by_one: bool, kind: dict, record: dict) -> tuple:
    """(states, rounds left, estimates, together) of ``cells`` for `run_plan.plan_steps`."""
    runs = round_seconds.run_anchors(out / "runs", kind["machine"])
    recorded = round_seconds.record_anchors(kind)
    finished_elsewhere = _kept_seeds(kept)
    states, rounds_left, estimates, together = {}, {}, {}, set()
    for group in consecutive_groups(cells):
        used = rounds[group[0].setting.name][0]
        configs = [build_config(cell_argv(c, out / "runs" / c.folder_name, used, extra, data_dir)) for c in group]
        for cell, cfg in zip(group, configs):
            folder = out / "runs" / cell.folder_name
            state = cell_state(folder, cfg)
            if (cell.method.name, cell.setting.name, cell.seed) in finished_elsewhere:
                state = "finished"
            if cell.setting.name in no_data and state != "finished":
                state = NO_DATA
            records = run_folder.read_records(folder) if state == "resume" else []
            states[cell.folder_name] = state
            rounds_left[cell.folder_name] = used - (records[-1]["round"] if records else 0)
        if group[0].group_name not in estimates:
            estimates[group[0].group_name] = round_seconds.estimate(config_lib.to_dict(configs[0]), runs, recorded,
                                                                     record["work"])
        if batchable(configs[0]) and not one_by_one:
            together.add(group[0].group_name)
    return states, rounds_left, estimates, together


def checked_kind(args) -> tuple[dict, dict, run_plan.Margins, float]:
    """(record, kind, margins, command limit) for --device-kind; UserError for an unknown kind or a
    --plan-for-seconds that holds no command (before any cell is looked at)."""
    record = round_seconds.load_record()
    kind = round_seconds.kind_record(record, args.device_kind)
    margins = run_plan.margins_of(kind)
    limit = float(kind.get("command_limit_seconds", 600))
    run_plan.check_budget(args.plan_for_seconds, margins)
    return record, kind, margins, limit


def plan_next_lease(spec: TableSpec, cells: list[Cell], out: Path, rounds: dict, args, extra: list[str],
                    no_data: dict, kept: dict, table_args: list[str], made_by: str) -> run_plan.Plan:
    """Plan the next lease for ``cells`` and write the three plan files into ``out``; returns the plan."""
    record, kind, margins, limit = checked_kind(args)
    ordered = run_plan.priority(spec, cells)
    inputs = cell_inputs(ordered, out, rounds, extra, args.data_dir, no_data, kept, args.one_by_one, kind, record)
    plan = run_plan.pack(run_plan.plan_steps(ordered, *inputs), args.plan_for_seconds, limit, margins)
    script_path = f"{display_path(out)}/lease_plan.sh"
    run_args = [*(["--rounds", str(args.rounds)] if args.rounds else []), *(["--one-by-one"] if args.one_by_one else []),
                *extra]
    out.mkdir(parents=True, exist_ok=True)
    texts = {"lease_plan.md": run_plan.markdown(spec, plan, args.plan_for_seconds, args.device_kind, margins,
                                                  made_by, script_path),
             "lease_plan.sh": run_plan.script(spec, plan, margins, table_args, run_args, made_by, script_path),
             "lease_plan.json": json.dumps({**run_plan.as_json(spec, plan, args.plan_for_seconds, args.device_kind,
                                                                  margins, extra), "made_by": made_by},
                                           indent=1) + "\n"}
    for name, text in texts.items():
        with atomic_write(out / name) as f:
            f.write(text)
    (out / "lease_plan.sh").chmod(0o755)
    return plan


def saved_plan(out: Path) -> dict | None:
    """OUT/lease_plan.json, or None."""
    path = Path(out) / "lease_plan.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not a lease plan ({e}); remove it, or plan again with --plan-for-seconds") from None


def plan_note(out: Path) -> list[str]:
    """The table's note on the next lease, from OUT/lease_plan.json (none without one)."""
    plan = saved_plan(out)
    if plan is None:
        return []
    planned = [c for command in plan["commands"] for step in command["steps"] for c in step["cells"]]
    cells = list(dict.fromkeys(planned))
    shown = ", ".join(cells[:12]) + (f" and {len(cells) - 12} more" if len(cells) > 12 else "")
    calls = "; ".join(f"`bash {display_path(out)}/lease_plan.sh {c['seconds'] - run_plan.CALL_SLACK:.0f}` (timeout_s "
                      f"{c['seconds']:.0f}, "
                      f"estimated {c['estimate']:.0f} s)" for c in plan["commands"])
    return [f"Next lease ({plan['kind']}; {display_path(out)}/lease_plan.md, made by `{plan['made_by']}`): "
            f"{len(plan['commands'])} device command(s) with carry `.dev/data` (the dataset files), one right after "
            "another: "
            f"{calls}. Expected to finish {len(cells)} cell(s): {shown or 'none'}; "
            f"{plan['left_steps']} step(s) wait for later leases. Then land each command's records with "
            f"`python -m fedjax_pfl.reproduce {plan['table']} --bring-back FILES_AT/records.tar.gz`."]


def pack_command(out: Path, archive: str) -> int:
    """``--pack-records``: the records of every run under OUT/runs into ``archive``."""
    packed = run_records.pack(out / "runs", Path(archive))
    print(f"packed the records of {len(packed)} run(s) into {archive}: {', '.join(packed) or 'none'}")
    return 0


def land_command(paths: list[str], out: Path) -> None:
    """``--bring-back``: land the archives' finished runs in OUT/runs, saying what landed."""
    done = run_records.land([Path(p) for p in paths], out / "runs")
    print(run_records.summary_line(done))


def replan_args(args, extra: list[str], out: Path) -> list[str]:
    """After --bring-back: take the saved plan's seconds, device kind and overrides (none saved: write the table
    only); returns the overrides to use."""
    plan = saved_plan(out)
    if plan is None:
        args.table_only = True
        return extra
    args.plan_for_seconds, args.device_kind = plan["plan_for_seconds"], plan["kind"]
    return extra or list(plan.get("overrides") or [])


def made_by(table_command: str, args) -> str:
    """The planning command as the plan files name it."""
    kind = [] if args.device_kind == "nvidia-h200" else ["--device-kind", args.device_kind]
    return shlex.join([*shlex.split(table_command), "--plan-for-seconds", f"{args.plan_for_seconds:g}", *kind])
