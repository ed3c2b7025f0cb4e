"""Checkpoints of a run's state (server, clients, round) as one .npz file.

Written atomically (temporary file, then rename), so a crash while saving
keeps the previous checkpoint. Restoring needs a template with the same tree
structure (a freshly initialised state); leaves are checked by path and shape.
Round keys are derived from the run key and the round index, so a resumed run
continues exactly as an uninterrupted one. ``meta`` (JSON-serialisable, e.g.
the seconds already spent) travels with the state. A truncated or corrupted
file is a `UserError`, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from fedjax_pfl.errors import UserError
from fedjax_pfl.run_output import atomic_write


def _paths_and_leaves(tree):
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(path) for path, _ in flat], [leaf for _, leaf in flat]


def save(path: Path, state, round_index: int, meta: dict | None = None) -> None:
    """Save ``state`` (any pytree of arrays) after round ``round_index``."""
    names, leaves = _paths_and_leaves(state)
    arrays = {f"leaf_{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    with atomic_write(Path(path), "wb") as f:
        np.savez(f, __paths__=np.array(names), __round__=np.int64(round_index),
                 __meta__=np.array(json.dumps(meta or {})), **arrays)


def _read(path: Path, count: int):
    """(paths, leaves, round, meta) from the file, or UserError if it cannot be read."""
    try:
        with np.load(path) as f:
            saved = list(f["__paths__"])
            values = [f[f"leaf_{i}"] for i in range(count)] if len(saved) == count else []
            round_index = int(f["__round__"])
            meta = json.loads(str(f["__meta__"])) if "__meta__" in f.files else {}
    except Exception as e:  # zip, pickle, EOF, key and value errors of a damaged file
        raise UserError(f"checkpoint {path} is truncated or corrupted ({type(e).__name__}); it cannot be "
                        "resumed: start the run afresh in a new --out") from None
    return saved, values, round_index, meta


def _like(value: np.ndarray, leaf):
    """``value`` with the dtype and placement (e.g. client-axis sharding) of the template's ``leaf``."""
    value = value.astype(leaf.dtype)
    return jax.device_put(value, leaf.sharding) if isinstance(leaf, jax.Array) else jax.numpy.asarray(value)


def restore(path: Path, template):
    """-> (state, round_index, meta) read from ``path`` into the structure of ``template``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; run without --resume to start afresh")
    names, leaves = _paths_and_leaves(template)
    saved, values, round_index, meta = _read(path, len(names))
    if saved != names:
        raise UserError(f"checkpoint {path} was written by a different method or model; "
                        "resume with the configuration that wrote it")
    for name, value, leaf in zip(names, values, leaves):
        if value.shape != np.shape(leaf):
            raise UserError(f"checkpoint leaf {name} has shape {value.shape}, expected {np.shape(leaf)}")
    treedef = jax.tree.structure(template)
    restored = [_like(v, leaf) for v, leaf in zip(values, leaves)]
    return jax.tree.unflatten(treedef, restored), round_index, meta
