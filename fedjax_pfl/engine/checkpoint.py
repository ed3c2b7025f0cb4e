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
renames it when all processes are done; the older rounds are deleted once the
new one has its digests (below): a crash while saving keeps the previous
checkpoint (its leftover temporary folder is removed by the next save).

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
and SHA-256 of every file there; only then are the older rounds deleted (by
this module: Orbax keeps them all). `restore` reads the newest round that has
its `MANIFEST` and checks every file before Orbax reads a byte: a changed,
truncated or missing file is refused. A round without one is never read: a
newer one is a save cut short between Orbax's rename and the digests (the
round before it restores, and the next save removes it); when no round has
digests (deleted, or saved by a version before them) the checkpoint is
refused, since its files cannot be checked.

Orbax is imported on first use (it costs a noticeable fraction of a second).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import resource
import shutil
from pathlib import Path

import jax
from jax.experimental import multihost_utils
import numpy as np

from fedjax_pfl.core.errors import UserError

FOLDER = "checkpoint"
MANIFEST = "digests.json"  # in each saved round's folder: {relative path: [size, sha256]} of its other files


def checkpoint_path(out: Path) -> Path:
    """Where the run in folder ``out`` keeps its checkpoint."""
    return Path(out) / FOLDER


def exists(path: Path) -> bool:
    """Whether ``path`` holds a saved round (a round's folder, not a temporary one; `restore` checks it)."""
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
    import orbax.checkpoint as ocp  # (about a second to import: only a run that checkpoints pays it)

    options = ocp.CheckpointManagerOptions(max_to_keep=None, enable_async_checkpointing=False, create=saving,
                                           cleanup_tmp_directories=saving)
    return ocp.CheckpointManager(Path(path).absolute(), options=options)


def _round_folders(path: Path) -> list[int]:
    """The completed rounds saved in ``path``: its digit-named folders (temporary ones have other names)."""
    path = Path(path)
    return [int(p.name) for p in path.iterdir() if p.name.isdigit() and p.is_dir()] if path.is_dir() else []


def _checked_rounds(path: Path) -> list[int]:
    """The saved rounds of ``path`` that have their `MANIFEST`, oldest first."""
    return sorted(t for t in _round_folders(path) if (Path(path) / str(t) / MANIFEST).is_file())


def latest_round(path: Path) -> int | None:
    """The round `restore` would read from ``path`` (the newest with its digests), read from the folder names
    alone (a resume checks its records against it before loading data), or None."""
    checked = _checked_rounds(path)
    return checked[-1] if checked else None


def _remove_rounds(path: Path, keep: int | None) -> None:
    """Delete the round folders of ``path`` but ``keep`` (process 0 only)."""
    for t in _round_folders(path):
        if t != keep:
            shutil.rmtree(Path(path) / str(t), ignore_errors=True)


def _all_processes_reach(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


ROOM = 1 << 18  # bytes a saved round takes beyond its arrays (metadata, digests), with room to spare


def check_room(path: Path, state) -> None:
    """OSError ENOSPC (before Orbax writes a byte) when the disk holding ``path`` has less room than the arrays of
    ``state`` take, or they exceed the file-size limit: Orbax's own failure on a full disk comes with a traceback
    from each of its threads."""
    need = ROOM + sum(int(np.prod(np.shape(leaf), dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
                      for leaf in jax.tree.leaves(state))
    folder = next(p for p in (Path(path).absolute(), *Path(path).absolute().parents) if p.exists())
    free = shutil.disk_usage(folder).free
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if need > free:
        raise OSError(errno.ENOSPC, f"No space left on device: the checkpoint needs about {need} bytes, {free} free",
                      str(path))
    if limit != resource.RLIM_INFINITY and need > limit:
        raise OSError(errno.EFBIG, f"File too large: the checkpoint needs about {need} bytes, past the file-size "
                      f"limit of {limit}", str(path))


@contextlib.contextmanager
def _orbax_quiet():
    """Orbax's threads log each failure of theirs (with its traceback) through absl before the error reaches the
    caller, which reports it once: their logs are held back to critical ones while Orbax works."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def save(path: Path, state, round_index: int, meta: dict | None = None) -> None:
    """Save ``state`` (any pytree of arrays) after round ``round_index``; every process calls it. Only the new
    round is kept once it has its digests. A disk without room for it: OSError (`check_room`), nothing written."""
    import orbax.checkpoint as ocp  # (as in `_manager`)

    check_room(path, state)
    names, leaves = _paths_and_leaves(state)
    record = {"paths": names, "shapes": [list(np.shape(leaf)) for leaf in leaves],
              "nodes": jax.tree_util.tree_structure(state).num_nodes, "meta": meta or {}}
    if jax.process_index() == 0:  # a round without digests (a save cut short) or from a later, abandoned run:
        checked = _checked_rounds(path)  # Orbax would skip saving at or before it
        for t in _round_folders(path):
            if t >= round_index or t not in checked:
                shutil.rmtree(Path(path) / str(t), ignore_errors=True)
    _all_processes_reach(f"fedjax_pfl checkpoint {round_index}")
    with _orbax_quiet(), _manager(path, saving=True) as manager:
        manager.save(round_index, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                          meta=ocp.args.JsonSave(record)), force=True)
    if jax.process_index() == 0:  # Orbax's save returns once every process's files are in place
        _write_manifest(Path(path) / str(round_index))
        _remove_rounds(path, keep=round_index)


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
    import orbax.checkpoint as ocp  # (as in `_manager`)

    path = Path(path)
    if not exists(path):
        raise UserError(f"no checkpoint at {path}; run without --resume to start afresh")
    checked = _checked_rounds(path)
    if not checked:
        saved = max(_round_folders(path))
        raise UserError(f"checkpoint {path} holds round {saved} without its {MANIFEST} (deleted, or saved by a "
                        "version before checkpoints recorded their digests), so its files cannot be checked against "
                        "damage; it cannot be resumed: start the run afresh (in place with --start-over, or in a new "
                        "--out)")
    names, leaves = _paths_and_leaves(template)
    nodes = jax.tree_util.tree_structure(template).num_nodes
    try:
        round_index = checked[-1]
        _check_manifest(path, path / str(round_index))  # before Orbax reads a byte or starts a thread
        with _orbax_quiet(), _manager(path, saving=False) as manager:
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
