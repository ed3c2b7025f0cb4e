"""Orbax checkpoints (checkpoint.py) on small trees: the latest round kept, meta and round back, a
different tree or shape refused in one line, the padded client axis re-padded and nothing else, and
any changed, cut or missing file of a saved round refused by its digests."""

import shutil
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_pfl.engine import checkpoint
from fedjax_pfl.core.errors import UserError


def _state(padded=4, real=3, width=2):
    """(server, clients) with ``real`` clients and zero rows up to ``padded``."""
    rows = jnp.arange(real * width, dtype=jnp.float32).reshape(real, width) + 1
    clients = {"w": jnp.concatenate([rows, jnp.zeros((padded - real, width))]), "steps": jnp.zeros(padded, jnp.int32)}
    return {"b": jnp.ones(width), "flag": jnp.array(True)}, clients


def test_save_keeps_the_latest_round_and_restore_gives_state_round_and_meta(tmp_path):
    """... also when a later save was killed before its rename, and the next save removes its leftovers."""
    path = checkpoint.checkpoint_path(tmp_path)
    assert not checkpoint.exists(path)
    for t in range(3):
        checkpoint.save(path, _state(), t, {"seconds": 1.5 * t})
    assert checkpoint.exists(path) and sorted(p.name for p in path.iterdir()) == ["2"]
    (path / "3.orbax-checkpoint-tmp-7" / "state").mkdir(parents=True)  # a save of round 3 killed midway
    state, t, meta = checkpoint.restore(path, _state())
    assert (t, meta) == (2, {"seconds": 3.0})
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state())):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    checkpoint.save(path, _state(), 3)
    assert sorted(p.name for p in path.iterdir()) == ["3"]


@pytest.mark.parametrize("padded", [3, 6])  # fewer devices (fewer empty rows) / more devices
def test_client_axis_is_re_padded_to_the_template(tmp_path, padded):
    checkpoint.save(tmp_path / "c", _state(padded=4), 0)
    (server, clients), _, _ = checkpoint.restore(tmp_path / "c", _state(padded=padded), num_clients=3)
    np.testing.assert_array_equal(clients["w"], _state(padded=padded)[1]["w"])
    assert clients["steps"].shape == (padded,)
    with pytest.raises(UserError, match=r"leaf \[1\]\['steps'\] has shape \(4,\), expected \(3,\)"):
        checkpoint.restore(tmp_path / "c", _state(padded=3))  # without num_clients: shapes must agree


@pytest.mark.parametrize("template,message", [
    (({"b": jnp.ones(2)}, {"w": jnp.zeros((4, 2))}), "written by a different method or model"),
    (_state(width=3), r"leaf \[0\]\['b'\] has shape \(2,\), expected \(3,\)"),  # server leaves never resize
    (_state(padded=2, real=2), r"\[1\]\['steps'\] has shape \(4,\), expected \(2,\)"),  # would cut a real client
])
def test_other_trees_and_shapes_are_one_line_user_errors(tmp_path, template, message):
    checkpoint.save(tmp_path / "c", _state(), 0)
    with pytest.raises(UserError, match=message):
        checkpoint.restore(tmp_path / "c", template, num_clients=3)


def test_same_leaves_in_other_containers_is_a_one_line_user_error(tmp_path):
    """GPFL's optimizer state gained an empty stage (sgd -> chain(decay, sgd)): the leaves and their paths
    are equal, the tree is not; the error says so rather than calling the files damaged."""
    params = {"w": jnp.ones(2)}
    checkpoint.save(tmp_path / "c", (params, optax.sgd(0.1).init(params)), 0)
    grown = (params, optax.chain(optax.add_decayed_weights(0.1), optax.sgd(0.1)).init(params))
    with pytest.raises(UserError, match="holds a state of another structure than this run's"):
        checkpoint.restore(tmp_path / "c", grown)
    state, _, _ = checkpoint.restore(tmp_path / "c", (params, optax.sgd(0.1).init(params)))
    np.testing.assert_array_equal(state[0]["w"], params["w"])


def test_no_checkpoint_and_a_damaged_one_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no checkpoint"):
        checkpoint.restore(tmp_path / "none", _state())
    checkpoint.save(tmp_path / "c", _state(), 0)
    (meta,) = (tmp_path / "c").glob("0/meta/metadata")
    meta.write_text("{")
    with pytest.raises(UserError, match="truncated or corrupted"):
        checkpoint.restore(tmp_path / "c", _state())


def _flip_middle_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _saved_files(folder):
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != checkpoint.MANIFEST)


def test_any_changed_byte_of_a_saved_round_is_refused_not_restored(tmp_path):
    """Orbax restores some damaged array files without complaint (a flipped byte in the data of a
    run's checkpoint resumed it with wrong weights); the sizes and SHA-256 digests written beside
    each saved round catch every changed file before Orbax reads it."""
    index = 0
    while True:  # each file in turn; Orbax names (and may split) its data files afresh at each save
        checkpoint.save(tmp_path / "d", _state(), 0)
        files = _saved_files(tmp_path / "d" / "0")
        if index >= len(files):
            break
        damaged = files[index]
        _flip_middle_byte(damaged)
        with pytest.raises(UserError, match=f"truncated or corrupted .*{damaged.name}: its SHA-256 differs"):
            checkpoint.restore(tmp_path / "d", _state())
        damaged.write_bytes(damaged.read_bytes()[:-1])
        with pytest.raises(UserError, match=f"truncated or corrupted .*{damaged.name}: .* bytes, saved"):
            checkpoint.restore(tmp_path / "d", _state())
        shutil.rmtree(tmp_path / "d")
        index += 1
    assert index >= 3  # array data, array metadata, the meta record at least


def test_a_missing_file_is_refused_and_a_round_without_digests_is_never_read(tmp_path):
    """Deleting a round's digests.json must not turn its check off: with no round that has its digests the
    checkpoint is refused in one line (Orbax never reads it, so no absl warning or traceback either)."""
    checkpoint.save(tmp_path / "c", _state(), 0)
    data = next(p for p in _saved_files(tmp_path / "c" / "0") if p.parent.name == "d")
    kept = data.read_bytes()
    data.unlink()
    with pytest.raises(UserError, match=f"truncated or corrupted.*{data.name}.*missing"):
        checkpoint.restore(tmp_path / "c", _state())
    data.write_bytes(kept)
    (tmp_path / "c" / "0" / checkpoint.MANIFEST).unlink()
    with pytest.raises(UserError, match="holds round 0 without its digests.json .* cannot be checked against damage"):
        checkpoint.restore(tmp_path / "c", _state())
    for file in _saved_files(tmp_path / "c"):  # every file of the round deleted, its folder left
        file.unlink()
    with pytest.raises(UserError, match="holds round 0 without its digests.json"):
        checkpoint.restore(tmp_path / "c", _state())


def test_a_save_cut_short_before_its_digests_restores_the_round_before(tmp_path):
    """The older round is deleted only once the newer one has its digests: a kill between Orbax's rename and
    the digests leaves both, the one with digests restores, and the next save replaces the other."""
    path = tmp_path / "c"
    checkpoint.save(path, _state(), 1, {"seconds": 1.0})
    kept = tmp_path / "kept"
    shutil.copytree(path / "1", kept)
    checkpoint.save(path, _state(width=3), 2, {"seconds": 2.0})
    (path / "2" / checkpoint.MANIFEST).unlink()
    shutil.copytree(kept, path / "1")  # as it stood before round 2's digests were written
    _, t, meta = checkpoint.restore(path, _state())
    assert (t, meta) == (1, {"seconds": 1.0})
    checkpoint.save(path, _state(), 2, {"seconds": 2.5})  # the rerun round saves again over the leftover
    _, t, meta = checkpoint.restore(path, _state())
    assert (t, meta) == (2, {"seconds": 2.5}) and sorted(p.name for p in path.iterdir()) == ["2"]


def test_refusing_a_damaged_round_starts_no_background_work_that_could_outlive_the_error(tmp_path, monkeypatch):
    """A CheckpointManager cleans leftover temporary folders on a thread of its own; a process that
    exits on the one-line error while that thread runs printed its 'cannot schedule new futures after
    shutdown' traceback after the error (seen once in a CI run). The digests are checked before
    Orbax is touched, so the refusal starts no thread."""
    checkpoint.save(tmp_path / "d", _state(), 0)
    _flip_middle_byte(_saved_files(tmp_path / "d" / "0")[0])
    started = []
    original_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda thread: (started.append(thread.name),
                                                                   original_start(thread))[1])
    with pytest.raises(UserError, match="its SHA-256 differs"):
        checkpoint.restore(tmp_path / "d", _state())
    assert started == []
