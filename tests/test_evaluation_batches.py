"""Evaluation batches sized to the clients' test sets: the rule picks the cheapest batch, and the numbers do
not depend on it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import float32_bounds as f32

from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import client_mapping
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup


def _brute_force(sizes, mapping, largest):
    """Every batch size 1..largest, executed rows counted by `client_mapping.step_counts` (the engine's count)."""
    how = client_mapping.MAP if mapping.packed else mapping
    best = None
    for b in range(1, min(largest, max(sizes)) + 1):
        steps = jnp.asarray([-(-n // b) for n in sizes])
        rows = int(client_mapping.step_counts(steps, how)[1]) * (b + client_mapping.BATCH_COST_ROWS)
        if best is None or rows <= best[0]:
            best = (rows, b)
    return best[1]


@pytest.mark.parametrize("mapping,chunk_size", [("map", None), ("vmap", None), ("chunked", 3), ("packed:2", None)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_is_the_cheapest_under_the_mapping(mapping, chunk_size, seed):
    sizes = sorted(np.random.default_rng(seed).integers(0, 300, 11).tolist(), reverse=True)
    mapping = client_mapping.of(mapping, chunk_size)
    chosen = client_mapping.pass_batch_size(sizes, mapping, largest=64)
    assert chosen == _brute_force(sizes, mapping, 64)
    assert 1 <= chosen <= 64


def test_equal_test_sets_get_one_batch_each():
    assert client_mapping.pass_batch_size([200] * 21, client_mapping.MAP, 256) == 200
    assert client_mapping.pass_batch_size([0] * 3, client_mapping.MAP, 256) == 1  # no test data: any batch, none computed


def _engine(largest_eval_batch, mapping, sizes=(7, 23, 1, 16, 12), test_sizes=(9, 31, 4, 17, 0)):
    rng = np.random.default_rng(0)
    model = build_model("mlp", (12,), 4, hidden=(8,))
    setup = local_setup(model=model, optimizer=optax.sgd, lr=0.1, batch_size=5, local_epochs=1,
                        normalize=lambda x: x)

    def clients(counts):
        x = rng.normal(size=(sum(counts), 12)).astype(np.float64)
        y = rng.integers(0, 4, sum(counts)).astype(np.int32)
        edges = np.cumsum((0, *counts))
        return stack_clients(x, y, [np.arange(a, b) for a, b in zip(edges[:-1], edges[1:])])

    method_cls = get_method("fedavg")
    method = method_cls(setup, method_cls.hparams_type())
    config = engine_config(3, client_mapping=mapping, chunk_size=2, largest_eval_batch=largest_eval_batch)
    return engine_lib.Engine(method, clients(sizes), clients(test_sizes), config)


@pytest.mark.parametrize("mapping", ["map", "vmap", "chunked", "packed"])
def test_evaluation_does_not_depend_on_the_batch(mapping):
    """The per-client metrics with batches sized by the rule equal those with batches of 2 (counts exactly;
    the loss sums to float32 rounding: the model computes in float32)."""
    with jax.enable_x64(True):
        sized, small = _engine(256, mapping), _engine(2, mapping)
        assert sized.eval_batch_size > 2 and small.eval_batch_size <= 2
        key = jax.random.key(0)
        server, clients = sized.init(key)
        server, clients, _ = sized.round(server, clients, jax.random.key(1), 0)
        a = sized.evaluate(server, clients, jax.random.key(2))
        b = small.evaluate(server, clients, jax.random.key(2))
    np.testing.assert_array_equal(a["correct"], b["correct"])
    np.testing.assert_array_equal(a["count"], [9, 31, 4, 17, 0])
    np.testing.assert_array_equal(a["count"], b["count"])
    # float32 rounding only (tests/float32_bounds.py): each client's sum of n <= 31 positive per-sample losses in
    # another order (gamma_n), of logits from dot products of 12 then 8 terms in other batch shapes; a
    # cross-entropy moves by at most twice its logits' largest change, and these logits and losses are of order 1
    np.testing.assert_allclose(a["loss_sum"], b["loss_sum"], rtol=2 * f32.gamma(31 + 12 + 8), atol=0)
