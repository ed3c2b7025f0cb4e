"""Checkpoints of a run's state (server, clients) after a round, with Orbax.

A run folder's checkpoint is the folder `checkpoint_path(out)`, managed by
Orbax's `CheckpointManager` (orbax-checkpoint, the JAX ecosystem's checkpoint
library): one sub-folder per saved round, named by the number the caller
gives (the training command: rounds done, counted from 1), holding
``state`` (the arrays, Orbax's standard PyTree format: every process writes
the shards of its own devices, so state that spans processes is never
gathered into one) and ``meta`` (JSON: the leaf paths and shapes, and the
caller's ``meta``, e.g. the seconds already spent). Every process calls
`save` and `restore`. Orbax writes a round into a temporary folder and
renames it when all processes are done, then deletes the older rounds: a
crash while saving keeps the previous checkpoint (its leftover temporary
folder is removed by the next save).

Restoring needs a template with the same tree structure (a freshly
initialised state); leaves are checked by path and shape and placed like the
template's leaves (so a client-sharded state comes back sharded over the
devices of the resumed run, whatever their count was when saving). Round
keys are derived from the run key and the round index, so a resumed run
continues exactly as an uninterrupted one. A truncated or corrupted
checkpoint is a `UserError`, never a traceback, and so is one whose state has
the template's leaves in other containers (its node count, saved in ``meta``,
differs: e.g. a method whose optimizer state gained an empty stage).

Digests: Orbax restores some damaged array files without complaint (a byte
flipped in the data of a run's checkpoint resumed it with wrong weights), and
on others leaves reads running that print a traceback after the error. So
once a round is saved, process 0 writes `MANIFEST` into its folder: the size
and SHA-256 of every file there; `restore` checks them before Orbax reads a
byte and refuses a changed, truncated or missing file. A round saved before
the digests existed (no `MANIFEST`) restores as before.

Orbax is imported on first use (it costs a noticeable fraction of a second).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import jax
import numpy as np

from fedjax_pfl.core.errors import UserError

FOLDER = "checkpoint"
KEEP = 1  # saved rounds kept (Orbax deletes older ones only after the newest is complete)
MANIFEST = "digests.json"  # in each saved round's folder: {relative path: [size, sha256]} of its other files


def checkpoint_path(out: Path) -> Path:
    """Where the run in folder ``out`` keeps its checkpoint."""
    return Path(out) / FOLDER


def exists(path: Path) -> bool:
    """Whether ``path`` holds a completed checkpoint (a round's folder, not a temporary one)."""
    return bool(_round_folders(path))


def has_checkpoint(out: Path) -> bool:
    """Whether the run in folder ``out`` has a completed checkpoint."""
    return exists(checkpoint_path(out))


def _paths_and_leaves(tree):
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(path) for path, _ in flat], [leaf for _, leaf in flat]


def _manager(path: Path, saving: bool):
    """Orbax's manager; only a saving one creates the folder and cleans leftover temporary folders (on a
    thread of its own, which a process exiting on an error must not leave running)."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=KEEP, enable_async_checkpointing=False, create=saving,
                                           cleanup_tmp_directories=saving)
    return ocp.CheckpointManager(Path(path).absolute(), options=options)


def _round_folders(path: Path) -> list[int]:
    """The completed rounds saved in ``path``: its digit-named folders (temporary ones have other names)."""
    path = Path(path)
    return [int(p.name) for p in path.iterdir() if p.name.isdigit() and p.is_dir()] if path.is_dir() else []


def _latest_round(path: Path) -> int:
    """The newest completed round saved in ``path``."""
    return max(_round_folders(path))


def save(path: Path, state, round_index: int, meta: dict | None = None) -> None:
    """Save ``state`` (any pytree of arrays) after round ``round_index``; every process calls it."""
    import orbax.checkpoint as ocp

    names, leaves = _paths_and_leaves(state)
    record = {"paths": names, "shapes": [list(np.shape(leaf)) for leaf in leaves],
              "nodes": jax.tree_util.tree_structure(state).num_nodes, "meta": meta or {}}
    with _manager(path, saving=True) as manager:
        manager.save(round_index, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                          meta=ocp.args.JsonSave(record)))
    if jax.process_index() == 0:  # Orbax's save returns once every process's files are in place
        _write_manifest(Path(path) / str(round_index))


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digests(folder: Path) -> dict[str, list]:
    return {str(p.relative_to(folder)): [p.stat().st_size, _sha256(p)]
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def _write_manifest(folder: Path) -> None:
    """`MANIFEST` of ``folder``, written whole or not at all (a temporary file renamed)."""
    partial = folder / (MANIFEST + ".partial")
    partial.write_text(json.dumps(_digests(folder), indent=0))
    os.replace(partial, folder / MANIFEST)


def _check_manifest(path: Path, folder: Path) -> None:
    """UserError naming the first file of ``folder`` that is missing or differs from its `MANIFEST`."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return  # saved before the digests existed
    try:
        expected = json.loads(manifest.read_text())
    except ValueError as e:
        raise _damaged(path, e) from None
    for name, (size, sha256) in expected.items():
        file = folder / name
        if not file.is_file():
            problem = "missing"
        elif file.stat().st_size != size:
            problem = f"{file.stat().st_size} bytes, saved {size}"
        elif _sha256(file) != sha256:
            problem = "its SHA-256 differs from when it was saved"
        else:
            continue
        raise _damaged(path, f"{name}: {problem}")


def _damaged(path: Path, error: Exception | str) -> UserError:
    """``error``: what Orbax raised, or which file differs from the round's `MANIFEST`."""
    if isinstance(error, str):
        return UserError(f"checkpoint {path} is truncated or corrupted ({error}); it cannot be resumed: start the "
                         "run afresh (in place with --start-over, or in a new --out)")
    return UserError(f"checkpoint {path} is truncated or corrupted, or (written before checkpoints recorded "
                     f"their structure) by another version of the code ({type(error).__name__}); it cannot be "
                     "resumed: start the run afresh (in place with --start-over, or in a new --out)")


def resizable(saved: tuple, wanted: tuple, num_clients: int) -> bool:
    """Whether a client leaf saved with shape ``saved`` can be restored as ``wanted``: only the
    (padded) client axis differs and both hold all ``num_clients`` real clients (the rows beyond are
    empty clients, zeros, so cutting or appending them changes nothing)."""
    return (len(saved) == len(wanted) >= 1 and saved[1:] == wanted[1:]
            and min(saved[0], wanted[0]) >= num_clients)


def _check_shapes(path: Path, saved_shapes, template, num_clients: int | None) -> None:
    """UserError unless every saved shape is the template's (client leaves: or `resizable` to it)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(template)
    for (keys, leaf), saved in zip(flat, saved_shapes):
        saved, wanted = tuple(saved), tuple(np.shape(leaf))
        client_leaf = num_clients is not None and keys[0].idx == 1  # template (server, clients)
        if saved != wanted and not (client_leaf and resizable(saved, wanted, num_clients)):
            name = jax.tree_util.keystr(keys)
            raise UserError(f"checkpoint {path} leaf {name} has shape {saved}, expected {wanted}; resume with "
                            "the configuration that wrote it")


def _target(leaf):
    """What Orbax restores ``leaf`` as: its shape, dtype and placement (e.g. client-axis sharding)."""
    sharding = leaf.sharding if isinstance(leaf, jax.Array) else None
    return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)


def restore(path: Path, template, num_clients: int | None = None):
    """-> (state, round_index, meta) of the latest round saved in ``path``, in the structure of ``template``.

    Every leaf comes back with the template's dtype and placement. With
    ``num_clients`` the template is ``(server, clients)`` and the client
    leaves may have been saved with another padded client count (another
    device count): their empty rows are cut or appended (`resizable`).
    """
    import orbax.checkpoint as ocp

    path = Path(path)
    if not exists(path):
        raise UserError(f"no checkpoint at {path}; run without --resume to start afresh")
    names, leaves = _paths_and_leaves(template)
    nodes = jax.tree_util.tree_structure(template).num_nodes
    try:
        round_index = _latest_round(path)
        _check_manifest(path, path / str(round_index))  # before Orbax reads a byte or starts a thread
        with _manager(path, saving=False) as manager:
            record = manager.restore(round_index, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            if record["paths"] != names:
                raise UserError(f"checkpoint {path} was written by a different method or model; "
                                "resume with the configuration that wrote it")
            if record.get("nodes", nodes) != nodes:  # same leaves, other containers (e.g. an optimizer's state)
                raise UserError(f"checkpoint {path} holds a state of another structure than this run's (written "
                                "by another version of the method or its optimizer); resume with the version "
                                "that wrote it, or start afresh (in place with --start-over, or in a new --out)")
            _check_shapes(path, record["shapes"], template, num_clients)
            target = jax.tree.map(_target, template)
            state = manager.restore(round_index, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target, strict=num_clients is None)))["state"]
    except UserError:
        raise
    except Exception as e:  # missing or damaged files: JSON, OCDBT, tensorstore and value errors
        raise _damaged(path, e) from None
    return state, int(round_index), record["meta"]
