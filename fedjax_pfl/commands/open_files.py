"""The files a sweep keeps open at once, against what the process may open (``ulimit -n``), before any work.

A sweep holds every point's run folder for the whole sweep (its lock file
open: outputs/folder_lock.py) and, while a chunk of points trains, each
point's metrics.jsonl (and TensorBoard's event file) open too. `ensure`
raises the process's own soft limit up to the hard one when that is enough,
and otherwise refuses in one line, saying how many runs fit, before a folder
is made or a sample read.
"""

from __future__ import annotations

import resource

from fedjax_pfl.core.errors import UserError

PER_RUN = 2  # the folder's lock and metrics.jsonl
RESERVED = 256  # the process's own: Python, JAX and XLA, dataset files, figures, the sweep's own folder


def needed(runs: int, tensorboard: bool = False) -> int:
    """Files open at once for a sweep of ``runs`` runs."""
    return runs * (PER_RUN + bool(tensorboard)) + RESERVED


def ensure(runs: int, tensorboard: bool = False) -> None:
    """Make room for a sweep of ``runs`` runs (raising the soft limit), or UserError when the hard limit is too low."""
    need = needed(runs, tensorboard)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    fit = max((hard - RESERVED) // (PER_RUN + bool(tensorboard)), 0)
    raise UserError(f"{runs} runs in one sweep keep about {need} files open at once (each run folder's lock and "
                    f"metrics.jsonl), more than this process may open ({hard}, ulimit -Hn); run at most {fit} seeds "
                    "or grid points at a time, or raise the limit (ulimit -n)")


def sweep_runs(cfg) -> int:
    """How many runs a sweep configuration (runs/config.py) expands into, grid x seeds, without expanding it."""
    runs = len(cfg.seeds) or 1
    for values in cfg.sweep.values():
        runs *= len(values) if isinstance(values, (list, tuple)) else 1
    return runs
