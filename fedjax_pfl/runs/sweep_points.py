"""A sweep's runs: every combination of its listed values (``cfg.sweep``) times its seeds, each a plain
single-run configuration writing its own folder under ``cfg.out`` (runs/sweep.py runs them as one program)."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.runs import config as config_lib


def expand(cfg: config_lib.RunConfig, allowed: tuple[str, ...]) -> list[tuple[config_lib.RunConfig, dict, str]]:
    """The points of a sweep config with its output folder set: grid (``cfg.sweep``) x seeds (``cfg.seeds`` or
    ``seed``), each as (its config, its traced values: 'lr' or an option name -> float, its grid folder's name:
    '' without a grid, else e.g. 'lr0.05_mu0.01'). ``allowed``: the names the method's round takes as values
    (`Algorithm.hyperparameter_names`)."""
    names = {key: config_lib.hyperparameter_name(key) for key in cfg.sweep}
    for key, name in names.items():
        if name not in allowed:
            raise UserError(f"{key} cannot be a list for method {cfg.method_name!r}: only {', '.join(allowed)} "
                            "vary inside one program; run other settings one by one")
        values = cfg.sweep[key]
        if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise UserError(f"{key} must be a non-empty list of numbers, got {values!r}")
    seeds = list(cfg.seeds) or [cfg.seed]
    data_seed = config_lib.drawn_data_seed(cfg.seed, cfg.data_seed)
    root = Path(cfg.out)
    single = copy.copy(cfg)  # each point copies this one, without the list of every seed (a copy per point)
    single.seeds, single.sweep = (), {}
    points = []
    for combo in itertools.product(*cfg.sweep.values()):
        values = {names[k]: float(v) for k, v in zip(cfg.sweep, combo)}
        grid_name = "_".join(f"{n}{v:g}" for n, v in values.items())
        for seed in seeds:
            point = copy.deepcopy(single)
            point.seed = seed
            point.data_seed, point.vary_data_with_seed = seed if cfg.vary_data_with_seed else data_seed, False
            for key, v in zip(cfg.sweep, combo):
                section, name = key.split(".", 1)
                config_lib.apply_mapping(point, {section: {name: v}})
            point.out = str(root / grid_name / f"seed{seed}") if grid_name else str(root / f"seed{seed}")
            points.append((point, values, grid_name))
    return points

