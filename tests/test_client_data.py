"""Stacked padded client arrays: values, padding, counts, dtypes, helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.data import client_data
from fedjax_pfl.data.client_data import (ClientData, device_put, padded_arrays, padding_efficiency, select_clients,
                                         stack_clients, unpad)
from fedjax_pfl.core.errors import UserError

RNG = np.random.default_rng(0)
X = RNG.integers(1, 256, size=(50, 4, 4, 3), dtype=np.uint8)  # nonzero, so padding is visible
Y = RNG.integers(0, 10, size=50)
PARTS = [np.array([7, 3, 41]), np.arange(10, 20), np.array([], np.int64), np.array([0])]


def test_round_trip_padding_counts_dtypes():
    d = stack_clients(X, Y, PARTS)
    assert isinstance(d.x, jax.Array)
    assert d.x.shape == (4, 10, 4, 4, 3) and d.y.shape == (4, 10) and d.n.shape == (4,)
    assert d.x.dtype == jnp.uint8 and d.y.dtype == jnp.int32 and d.n.dtype == jnp.int32
    np.testing.assert_array_equal(d.n, [3, 10, 0, 1])
    for i, idx in enumerate(PARTS):
        x_i, y_i = unpad(d, i)
        np.testing.assert_array_equal(x_i, X[idx])  # index order kept
        np.testing.assert_array_equal(y_i, Y[idx])
        assert not np.asarray(d.x[i, len(idx):]).any()
        assert not np.asarray(d.y[i, len(idx):]).any()


def test_pad_to_and_float_features():
    xf = RNG.normal(size=(50, 6)).astype(np.float32)
    d = stack_clients(xf, Y, PARTS, pad_to=16)
    assert d.x.shape == (4, 16, 6) and d.x.dtype == jnp.float32
    with pytest.raises(UserError, match="pad_to"):
        stack_clients(xf, Y, PARTS, pad_to=5)


def test_blocks_of_clients_fill_the_same_arrays_as_one_gather(monkeypatch):
    """A temporary of a few rows at a time (not a gathered copy of the pool) gives the arrays of the plain gather."""
    parts = [RNG.choice(50, size=int(k), replace=False) for k in RNG.integers(0, 9, size=13)]
    whole = padded_arrays(X, Y, parts)
    monkeypatch.setattr(client_data, "GATHER_BYTES", X[:1].nbytes * 9)  # one client (n_max <= 8 rows) a block
    blocks = padded_arrays(X, Y, parts)
    for a, b in zip(whole, blocks):
        np.testing.assert_array_equal(a, b)
    n_max = max(len(p) for p in parts)
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(blocks[0][i, :len(p)], X[p])
        assert not blocks[0][i, len(p):].any() and blocks[0].shape[1] == n_max


def test_clients_lying_in_order_with_one_size_are_views_of_the_pool():
    labels = Y.astype(np.int32)
    x, y, n = padded_arrays(X, labels, [np.arange(10, 15), np.arange(15, 20), np.arange(20, 25)])
    assert np.shares_memory(x, X) and np.shares_memory(y, labels)
    assert x.shape == (3, 5, 4, 4, 3) and n.tolist() == [5, 5, 5]
    np.testing.assert_array_equal(x.reshape(15, 4, 4, 3), X[10:25])
    padded, _, _ = padded_arrays(X, Y, [np.arange(10, 15), np.arange(15, 20)], pad_to=6)  # padding: a copy
    assert not np.shares_memory(padded, X) and not padded[:, 5].any()


def test_all_empty_clients_still_valid():
    d = stack_clients(X, Y, [np.array([], np.int64)] * 3)
    assert d.x.shape[:2] == (3, 1) and int(d.n.sum()) == 0


def test_bad_inputs():
    with pytest.raises(UserError, match="samples"):
        stack_clients(X, Y[:10], PARTS)
    with pytest.raises(UserError, match="indices"):
        stack_clients(X, Y, [np.array([50])])


def test_pytree_select_and_device_put():
    d = stack_clients(X, Y, PARTS)
    leaves = jax.tree_util.tree_leaves(d)
    assert len(leaves) == 3
    doubled = jax.jit(lambda c: c._replace(n=c.n * 2))(d)
    assert isinstance(doubled, ClientData) and doubled.n.tolist() == [6, 20, 0, 2]
    sub = select_clients(d, np.array([3, 0]))
    assert sub.num_clients == 2 and sub.n.tolist() == [1, 3]
    np.testing.assert_array_equal(sub.x[1], d.x[0])
    moved = device_put(d, jax.devices()[0])
    np.testing.assert_array_equal(moved.y, d.y)


def test_padding_efficiency():
    assert padding_efficiency([10, 10], 5) == 1.0
    assert padding_efficiency([10, 1, 0], 5) == pytest.approx(3 / 6)
    assert padding_efficiency([16, 32], 16, epochs=5) == pytest.approx(0.75)
    assert padding_efficiency([0, 0], 8) == 1.0
