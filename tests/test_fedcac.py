"""FedCAC: with nothing critical it is FedAvg; the engine against a per-client Python loop with
float64 server steps; the gradient sensitivity; option errors.

The federation and its momentum-SGD loop: tests/shifted_pixel_federation.py.
Learning on real Fashion-MNIST: tests/test_learning_fmnist_half_join.py
(with GPFL, against the same FedAvg run).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import shifted_pixel_federation as fed
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.methods import fedcac, get_method
from fedjax_pfl.runs import config as config_lib


def test_fedcac_with_nothing_critical_is_fedavg(shifted_pixel_fedavg_run):
    fedavg, avg, avg_clients, key = shifted_pixel_fedavg_run
    cac_eng = fed.engine("fedcac", {"tau": 0.0}, test_seed=1)
    _, cac, cac_clients, k = fed.run(cac_eng, 2, jax.random.key(4))
    fed.close(cac["global"], avg["variables"]["params"], tol=1e-6)
    for c in range(len(fed.SIZES)):
        fed.close(fed.row(cac["personalized"], c), avg["variables"]["params"], tol=1e-6)
    np.testing.assert_array_equal(cac_eng.evaluate(cac, cac_clients, k)["correct"],
                                  fedavg.evaluate(avg, avg_clients, key)["correct"])


def _np_mask(values, tau):
    flat = np.sort(np.asarray(values, np.float64).reshape(-1))[::-1]
    return np.asarray(values) >= flat[int(tau * flat.size) - 1]


def _sensitivity64(trained, start):
    t, s = np.asarray(trained, np.float64), np.asarray(start, np.float64)
    return np.abs((t - s) * t)


def test_fedcac_engine_equals_per_client_loop():
    tau, beta, rounds = 0.3, 4.0, 2
    eng = fed.engine("fedcac", {"tau": tau, "beta": beta})
    initial, server, _, key = fed.run(eng, rounds, jax.random.key(5))
    model, (x, y, idx) = fed.model(), fed.data()
    params0 = initial[0]["global"]
    flat0, unravel = ravel_pytree(params0)
    n = len(fed.SIZES)
    glob = np.asarray(flat0, np.float64)
    models, personalized = np.tile(glob, (n, 1)), np.tile(glob, (n, 1))
    masks, active = np.zeros((n, glob.size)), np.zeros(n, bool)

    def ce(p, xb, yb):
        return fed.nll(model.apply({"params": p}, xb).logits, yb)

    for t in range(rounds):
        selected, keys = fed.plan(key, t)
        uploads = []
        for j, c in enumerate(selected):
            start = unravel(jnp.asarray(personalized[c], jnp.float32))
            trained = fed.train(ce, start, x[idx[c]], y[idx[c]], keys[j])
            mask = jax.tree.map(lambda a, b: _np_mask(_sensitivity64(a, b), tau), trained, start)
            uploads.append(trained)
            models[c], masks[c], active[c] = np.asarray(ravel_pytree(trained)[0]), ravel_pytree(mask)[0], True
        glob = np.asarray(ravel_pytree(fed.mean64(uploads, [fed.SIZES[c] for c in selected]))[0])
        overlap = {(i, j): 1 - np.abs(masks[i] - masks[j]).sum() / (2 * masks[i].sum())
                   for i in range(n) for j in range(n) if i != j and active[i] and active[j]}
        vals = np.array(list(overlap.values()))
        threshold = vals.mean() + (t + 1) / beta * (vals.max() - vals.mean())
        for i in range(n):
            group = [i] + [j for j in range(n) if overlap.get((i, j), -np.inf) >= threshold]
            customized = np.mean(models[group], axis=0)
            personalized[i] = np.where(masks[i] > 0, customized, glob)
    assert 0 < len(overlap) and np.any(masks.sum(1) > 0)
    fed.close(server["global"], unravel(glob))
    for c in range(n):
        fed.close(fed.row(server["personalized"], c), unravel(personalized[c]))


def test_fedcac_gradient_sensitivity_is_theta_times_the_mean_train_gradient():
    tau, c = 0.3, 1
    method, model, (x, y, idx) = fed.method("fedcac", {"tau": tau, "sensitivity": "gradient"}), fed.model(), fed.data()
    variables = model.init(jax.random.key(0))
    data = stack_clients(x, y, idx)
    client = ClientData(data.x[c], data.y[c], data.n[c])
    grad = jax.grad(lambda p: fed.nll(model.apply({"params": p}, fed.normalize(x[idx[c]])).logits, y[idx[c]]))(
        variables["params"])
    local = method.local
    mean_gradient, mask = jax.jit(lambda v, d: (fedcac.mean_gradient(method, local, v, d),
                                                fedcac.critical(method, local, None, v, d)))(variables, client)
    fed.close(mean_gradient, grad)
    want = jax.tree.map(lambda p, g: _np_mask(np.abs(np.asarray(p, np.float64) * np.asarray(g)), tau),
                        variables["params"], grad)
    for a, b in zip(jax.tree.leaves(mask), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.parametrize("method, options, match", [
    ("fedcac", ["method.tau=2"], "tau"), ("fedcac", ["method.sensitivity=fisher"], "sensitivity"),
])
def test_bad_option_is_a_user_error(method, options, match):
    cfg = config_lib.build(None, [f"method_name={method}", *options])
    with pytest.raises(UserError, match=match):
        config_lib.method_options(get_method(method).hparams_type, cfg.method)
