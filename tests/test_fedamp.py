"""FedAMP: the attention weights and cloud models against a float64 double loop, closer models
get larger weights, the engine against a per-client Python loop; option errors.

The federation and its reference loop: tests/personal_model_federation.py.
Learning on real Fashion-MNIST: tests/test_learning_fmnist_two_class.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import personal_model_federation as fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.kernels import attentive_mixing
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.fedamp import FedAMPConfig
from fedjax_pfl.runs import config as config_lib


def _np_fedamp_mix(stored, alpha_k, sigma, rows):
    """u_i = sum_j xi_ij w_j by a float64 double loop over pairs (the paper's Eq. 8)."""
    flat = [np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(m)]) for m in stored]
    xi = np.zeros((len(rows), len(flat)))
    for r, i in enumerate(rows):
        for j in range(len(flat)):
            if j != i:
                d2 = np.sum((flat[i] - flat[j]) ** 2)
                xi[r, j] = alpha_k * np.exp(-d2 / sigma) / sigma
        xi[r, i] = 1.0 - xi[r].sum()
    u = [sum(xi[r, j] * flat[j] for j in range(len(flat))) for r in range(len(rows))]
    return xi, u


def _unflatten(vector, like):
    out, start = [], 0
    leaves, treedef = jax.tree.flatten(like)
    for a in leaves:
        out.append(vector[start:start + a.size].reshape(a.shape))
        start += a.size
    return jax.tree.unflatten(treedef, out)


def _ref_fedamp(rounds, key, hp):
    x, y, idx = fed.raw_data()
    init_key, key = jax.random.split(key)
    w0 = fed.model().init(init_key)["params"]
    personal, stored = [w0] * fed.N, [w0] * fed.N
    for t in range(rounds):
        selected, keys = fed.round_plan(key, t)
        _, u = _np_fedamp_mix(stored, hp.alpha_k, hp.sigma, list(selected))
        for j, c in enumerate(selected):
            anchor = jax.tree.map(jnp.float32, _unflatten(u[j], w0))
            personal[c] = fed.ref_sgd(fed.prox_loss, anchor, x[idx[c]], y[idx[c]], keys[j], anchor,
                                      hp.lamda / hp.alpha_k)
        for c in selected:
            stored[c] = personal[c]
    return personal, stored


def test_fedamp_engine_equals_per_client_loop():
    """lax.map here (the other methods: vmap); three clients of five per round."""
    key = jax.random.key(5)
    hp = FedAMPConfig(alpha_k=0.5, sigma=2.0, lamda=0.2)
    ref_personal, ref_stored = _ref_fedamp(2, key, hp)
    _, server, clients = fed.run_engine(get_method("fedamp")(fed.setup(), hp), "map", 2, key)
    for c in range(fed.N):
        fed.assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c], tol=2e-5)
        fed.assert_close(tree_ops.gather(server["params"], c), ref_stored[c], tol=2e-5)


def test_fedamp_weights_and_cloud_models_match_a_float64_double_loop():
    rng = np.random.default_rng(0)
    like = fed.model().init(jax.random.key(0))["params"]
    stored = [jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape) * 0.05 + 1.0, jnp.float32), like)
              for _ in range(fed.N)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *stored)
    rows = [3, 0, 4]
    xi_ref, u_ref = _np_fedamp_mix(stored, 0.5, 3.0, rows)
    u, xi, _ = jax.jit(lambda m: attentive_mixing.personalized_cloud_models(m, 0.5, 3.0, rows=jnp.array(rows)))(
        stacked)
    np.testing.assert_allclose(np.asarray(xi), xi_ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(xi).sum(axis=1), 1.0, atol=1e-6)
    assert np.all(np.asarray(xi)[np.arange(3), rows] < 1.0) and np.all(np.asarray(xi) > 0)
    for r in range(len(rows)):
        fed.assert_close(tree_ops.gather(u, r), _unflatten(u_ref[r], like), tol=1e-5)


def test_fedamp_closer_models_get_larger_weights():
    d2 = jnp.array([[0.0, 1.0, 9.0], [1.0, 0.0, 4.0], [9.0, 4.0, 0.0]])
    xi = np.asarray(attentive_mixing.attention_weights(d2, 1.0, 3.0))
    assert xi[0, 1] > xi[0, 2] and xi[2, 1] > xi[2, 0]
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("config_type,options", [
    (FedAMPConfig, {"sigma": 0.0}), (FedAMPConfig, {"alpha_k": -1.0}), (FedAMPConfig, {"lamda": -1.0}),
    (FedAMPConfig, {"start": "zero"}),
])
def test_bad_options_raise_user_error(config_type, options):
    with pytest.raises(UserError):
        config_lib.method_options(config_type, options)
