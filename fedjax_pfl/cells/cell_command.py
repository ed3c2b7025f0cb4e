"""A table cell as a training command: its arguments, its configuration and the state of its run folder.

`cell_argv` is the command line that trains one cell (``python -m
fedjax_pfl.train`` with the setting's preset, the row's method, the seed and
the overrides; rounds and checkpoints last), `build_config` the validated run
it builds (runs/experiment.py's `ValidRun`, no data read), `cell_state` what its run folder holds
for it (new, finished, resumable, to run again), and `batchable` /
`seeds_argv` whether and how a cell's seeds share one ``--seeds`` program
(runs/sweep.py). Used by the table command (reproduce.py) and its run plan
(plan_command.py).
"""

from __future__ import annotations

import math
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.papers.table_spec import Cell
from fedjax_pfl.runs import config as config_lib


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def base_argv(cell: Cell, extra: list[str] = ()) -> list[str]:
    """The training command's arguments that define the cell (no rounds, output or checkpoints)."""
    config = ["--config", display_path(cell.setting.config)] if cell.setting.config else []
    return [*config, "--method", cell.method.method, "--seed", str(cell.seed), *cell.overrides, *extra]


def checkpoint_every(rounds: int) -> int:
    """Cells checkpoint every tenth of their rounds, so an interrupted cell loses at most that."""
    return max(1, math.ceil(rounds / 10))


def build_config(argv: list[str]):
    """The validated run (`ValidRun`) the training command builds from ``argv`` (its `settle`), no data read."""
    from fedjax_pfl.commands import train as cli  # (imports JAX: not with this module)

    args, overrides = cli.parse_args(argv)
    return cli.settle(cli.config_from_args(args, overrides))


def paper_rounds(cell: Cell, extra: list[str] = ()) -> int:
    return build_config(base_argv(cell, extra)).checked.train.rounds


def cell_argv(cell: Cell, folder: Path, rounds: int, extra: list[str] = (), data_dir: str | None = None) -> list[str]:
    """The full training command line of a cell."""
    data = ["--data-dir", data_dir] if data_dir else []
    # as overrides, last: they win over the table's and the user's overrides
    return [*base_argv(cell, extra), "--out", str(folder), *data, f"train.rounds={rounds}",
            f"checkpoint_every={checkpoint_every(rounds)}"]


def cell_state(folder: Path, cfg: config_lib.RunConfig) -> str:
    """'new', 'finished' (skip), 'resume' (checkpoint) or 'rerun' (unfinished, no checkpoint) for ``cfg`` in ``folder``.

    UserError when the folder holds a run of another configuration.
    """
    if not run_folder.is_run(folder):
        return "new"
    saved = run_folder.read_config(folder)
    new = config_lib.to_dict(cfg)
    changed = config_lib.resume_differences(saved, new)
    if saved.get("train", {}).get("rounds") != cfg.train.rounds:
        changed.append(f"train.rounds: {saved.get('train', {}).get('rounds')!r} -> {cfg.train.rounds!r}")
    if changed:
        raise UserError(f"{folder} holds a run of another configuration ({'; '.join(changed)}); "
                        "pass another --out, or remove that folder")
    summary = run_folder.read_summary(folder) or {}
    records = run_folder.read_records(folder)
    if summary.get("status") in ("finished", "failed") or (records and records[-1]["round"] == cfg.train.rounds):
        return "finished"  # (the second: killed after its last evaluation, before summary.json)
    from fedjax_pfl.engine import checkpoint  # (imports jax: not at module level)

    return "resume" if checkpoint.exists(checkpoint.checkpoint_path(folder)) else "rerun"


def fixed_sizes(cfg: config_lib.RunConfig) -> bool:
    """Whether every client's train and test sizes are fixed, so each seed's own partition has the same shapes."""
    p = cfg.partition
    return p.scheme != "natural" and bool(p.train_per_client) and bool(p.test_per_client)


def batchable(cfg: config_lib.RunConfig) -> bool:
    """Whether the seeds of this setting can share one program: they share one partition (the setting fixes
    ``data_seed``: the seed changes the training only) or every client's sizes are fixed (each seed draws its
    own, ``vary_data_with_seed``)."""
    return cfg.data_seed is not None or fixed_sizes(cfg)


def seeds_argv(argv: list[str], seeds: list[int], folder: Path, cfg: config_lib.RunConfig) -> list[str]:
    """A cell's command turned into one ``--seeds`` run writing ``folder``/seed<k>; with each seed's own partition
    unless ``cfg`` fixes ``data_seed`` (then every seed's run is the single run ``--seed k`` exactly)."""
    at = argv.index("--seed")
    rest = [a for i, a in enumerate(argv) if i not in (at, at + 1)]
    out = rest.index("--out")
    rest[out + 1] = str(folder)
    vary = [] if cfg.data_seed is not None else ["vary_data_with_seed=true"]
    return [*rest, "--seeds", ",".join(map(str, seeds)), *vary]


def consecutive_groups(cells: list[Cell], key=lambda c: c.group_name) -> list[list[Cell]]:
    """Runs of consecutive cells of one (method, setting), or of one ``key``, in the given order (table order:
    one run each)."""
    groups: list[list[Cell]] = []
    for cell in cells:
        if groups and key(groups[-1][0]) == key(cell):
            groups[-1].append(cell)
        else:
            groups.append([cell])
    return groups
