"""GPFL: the engine against a per-client Python loop with float64 server steps, prediction
through the valve, and option errors.

The federation and its momentum-SGD loop: tests/shifted_pixel_federation.py.
Learning on real Fashion-MNIST: tests/test_learning_fmnist_half_join.py
(with FedCAC, against the same FedAvg run).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shifted_pixel_federation as fed
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.runs import config as config_lib


def test_gpfl_engine_equals_per_client_loop_and_predicts_through_the_valve():
    """Partial participation (3 of 5) over 2 rounds exercises both sources of the
    conditional inputs (own trained GCE, or the global GCE of one round earlier)."""
    lamda, mu, rounds = 0.05, 0.1, 2
    eng = fed.engine("gpfl", {"lamda": lamda, "mu": mu})
    method = eng.method
    metrics = []
    (server0, clients0), server, clients, key = fed.run(eng, rounds, jax.random.key(6), metrics)
    model, valve, (x, y, idx) = fed.model(), method.static, fed.data()  # its conditional valve
    n = len(fed.SIZES)
    body, gce, cov = server0["body"]["params"], server0["gce"], server0["cov"]
    gce_before = gce
    heads = [fed.row(clients0["variables"]["params"]["head"], c) for c in range(n)]
    own_gce, trained_round = [gce] * n, [-1] * n

    def conditionals(c, t, server_gce_before):
        if t == 0:
            return np.zeros(gce.shape[1]), np.zeros(gce.shape[1])
        sources.add(trained_round[c] == t - 1)
        src = np.asarray(own_gce[c] if trained_round[c] == t - 1 else server_gce_before, np.float64)
        prior = np.bincount(y[idx[c]], minlength=fed.C) / len(idx[c])
        return src.mean(0), prior @ src

    sources = set()

    def loss(p, xb, yb, zg, zp, frozen):
        f = model.apply({"params": {"body": p["body"], "head": p["head"]}}, xb).features
        f_p, f_g = valve.apply({"params": p["cov"]}, f, zp), valve.apply({"params": p["cov"]}, f, zg)
        ce = fed.nll(model.apply_head({"params": {"head": p["head"]}}, f_p), yb)
        unit = lambda a: a / jnp.linalg.norm(a, axis=1, keepdims=True)
        angle = fed.nll(unit(f_g) @ unit(p["gce"]).T, yb)
        magnitude = jnp.sqrt(jnp.sum((f_g - frozen[yb]) ** 2))
        return ce + angle + lamda * magnitude  # mu: weight decay in the valve's and embeddings' SGD

    for t in range(rounds):
        selected, keys = fed.plan(key, t)
        uploads = []
        for j, c in enumerate(selected):
            zg, zp = (jnp.asarray(z, jnp.float32) for z in conditionals(c, t, gce_before))
            start = jax.tree.map(jnp.asarray, {"body": body, "head": heads[c], "gce": gce, "cov": cov})
            step_losses = []
            trained = fed.train(loss, start, x[idx[c]], y[idx[c]], keys[j], zg, zp, jnp.asarray(gce),
                                plain=("gce", "cov"), decay=mu, step_losses=step_losses)
            # the reported train loss is the data loss, without the decay (as PFLlib reports it)
            np.testing.assert_allclose(float(metrics[t]["client_loss"][j]), np.mean(step_losses), rtol=1e-4)
            uploads.append(trained)
            heads[c], own_gce[c], trained_round[c] = trained["head"], trained["gce"], t
        mean = fed.mean64(uploads, [fed.SIZES[c] for c in selected])
        gce_before = gce
        body, gce, cov = mean["body"], mean["gce"], mean["cov"]
    assert sources == {True, False}
    tol = 1e-4  # LayerNorm and norms in the loss: float32 summation order differs more than for CE alone
    fed.close(server["body"]["params"], body, tol)
    fed.close((server["gce"], server["cov"], server["gce_before"]), (gce, cov, gce_before), tol)
    for c in range(n):
        fed.close(fed.row(clients["variables"]["params"]["head"], c), heads[c], tol)
        assert int(clients["trained_round"][c]) == trained_round[c]
    # evaluation: global body and valve, own head, personalized conditional input
    got = eng.evaluate(server, clients, key)
    for c in range(n):
        _, zp = conditionals(c, rounds, gce_before)
        f = model.apply({"params": {"body": body, "head": heads[c]}}, fed.normalize(x[idx[c]])).features
        f_p = valve.apply({"params": cov}, f, jnp.asarray(zp, jnp.float32))
        logits = np.asarray(model.apply_head({"params": {"head": heads[c]}}, f_p))
        assert got["correct"][c] == np.sum(np.argmax(logits, 1) == y[idx[c]]), c


@pytest.mark.parametrize("method, options, match", [
    ("gpfl", ["method.magnitude=l1"], "magnitude"),
])
def test_bad_option_is_a_user_error(method, options, match):
    cfg = config_lib.build(None, [f"method_name={method}", *options])
    with pytest.raises(UserError, match=match):
        config_lib.method_options(get_method(method).hparams_type, cfg.method)
