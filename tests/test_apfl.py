"""APFL: the output-mixture cross-entropy against float64, the engine against a per-client Python
loop, alpha fixed at zero is FedAvg's local model, alpha grows when the personal model fits
better; option errors.

The federation and its reference loop: tests/personal_model_federation.py.
Learning on real Fashion-MNIST: tests/test_learning_fmnist_two_class.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import personal_model_federation as fed
from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.apfl import APFLConfig
from fedjax_pfl.methods.base import ClientRound
from fedjax_pfl.runs import config as config_lib


def _mixed_loss(v, a, w, xb, yb):
    return losses.cross_entropy(a * fed.logits(v, xb) + (1 - a) * fed.logits(w, xb), jnp.asarray(yb))


def _ref_apfl(rounds, key, alpha0, decay=0.02):
    """APFL's client loop written step by step: w on CE(w); v and alpha on the
    output mixture with w of the step start; alpha only at the round's first step."""
    x, y, idx = fed.raw_data()
    init_key, key = jax.random.split(key)
    w = fed.model().init(init_key)["params"]
    personal, local, alpha = [w] * fed.N, [w] * fed.N, [alpha0] * fed.N
    opt = optax.sgd(fed.LR, momentum=0.9)
    grad_w, grad_va = fed.jit_grad(fed.ce), fed.jit_grad(_mixed_loss, (0, 1))
    for t in range(rounds):
        selected, keys = fed.round_plan(key, t)
        trained = []
        for j, c in enumerate(selected):
            xc, yc = x[idx[c]], y[idx[c]]
            wc, v, a = w, personal[c], alpha[c]
            sw, sv = opt.init(wc), opt.init(v)
            for step, (_, _, b) in enumerate(fed.batches(keys[j], xc.shape[0], fed.E)):
                gw = grad_w(wc, xc[b], yc[b])
                gv, ga = grad_va(v, a, wc, xc[b], yc[b])
                uw, sw = opt.update(gw, sw, wc)
                uv, sv = opt.update(gv, sv, v)
                wc, v = optax.apply_updates(wc, uw), optax.apply_updates(v, uv)
                if step == 0:
                    a = float(np.clip(a - fed.LR * (float(ga) + decay * a), 0.0, 1.0))
            personal[c], local[c], alpha[c] = v, wc, a
            trained.append(wc)
        w = fed.weighted_mean64(trained, [fed.SIZES[c] for c in selected])
    return w, personal, local, alpha


def test_apfl_engine_equals_per_client_loop():
    key = jax.random.key(4)
    ref_w, ref_personal, ref_local, ref_alpha = _ref_apfl(2, key, alpha0=0.5)
    _, server, clients = fed.run_engine(get_method("apfl")(fed.setup()), "vmap", 2, key)
    fed.assert_close(server["variables"]["params"], ref_w)
    np.testing.assert_allclose(np.asarray(clients["alpha"]), ref_alpha, rtol=1e-5, atol=1e-6)
    assert np.any(np.abs(np.asarray(clients["alpha"]) - 0.5) > 1e-4)  # alpha moved for the selected clients
    for c in range(fed.N):
        fed.assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c])
        fed.assert_close(tree_ops.gather(clients["local"]["params"], c), ref_local[c])


def test_output_mixture_cross_entropy_matches_float64():
    rng = np.random.default_rng(0)
    p, g = rng.normal(size=(6, fed.C)), rng.normal(size=(6, fed.C))
    y, mask = rng.integers(0, fed.C, 6), np.array([1, 1, 1, 0, 1, 1], bool)

    def np_loss(a):
        z = a * p + (1 - a) * g
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return -np.mean(logp[np.arange(6), y][mask])

    a = 0.3
    value, grad = jax.value_and_grad(losses.output_mixture_cross_entropy, argnums=2)(
        jnp.asarray(p, jnp.float32), jnp.asarray(g, jnp.float32), jnp.float32(a), jnp.asarray(y), jnp.asarray(mask))
    np.testing.assert_allclose(value, np_loss(a), rtol=1e-5)
    np.testing.assert_allclose(grad, (np_loss(a + 1e-6) - np_loss(a - 1e-6)) / 2e-6, rtol=1e-4)


@pytest.mark.parametrize("mix", ["output", "params"])
def test_apfl_alpha_fixed_at_zero_is_fedavgs_local_model(mix):
    setup = fed.setup()
    method = get_method("apfl")(setup, APFLConfig(alpha=0.0, adapt_alpha=False, mix=mix))
    server, clients = method.init(jax.random.key(0), fed.N)
    personal = jax.tree.map(lambda a: a + 0.3, tree_ops.gather(clients["variables"], 1))  # v_i != w
    client = {**tree_ops.gather(clients, 1), "variables": personal}
    out, upload = fed.one_client(method, client, server=server)
    _, fedavg_upload = fed.one_client(get_method("fedavg")(setup), {}, server=server)
    fed.assert_close(upload["variables"], fedavg_upload["variables"], tol=1e-6)
    fed.assert_close(out["local"], fedavg_upload["variables"], tol=1e-6)
    assert float(out["alpha"]) == 0.0
    x = fed.normalize(fed.client_data(1).x[:7])
    fed.assert_close(method.eval_logits(method.eval_variables(server, out, None, None), x),
                  setup.model.apply(fedavg_upload["variables"], x).logits, tol=1e-5)


def test_apfl_alpha_grows_when_the_personal_model_fits_better():
    """v_i trained on the client's data, w a fresh model: the mixed loss falls as alpha grows."""
    setup = fed.setup()
    method = get_method("apfl")(setup, APFLConfig(alpha=0.2, alpha_schedule="every_step", alpha_decay=0.0))
    server, clients = method.init(jax.random.key(0), fed.N)
    local = get_method("local")(fed.setup(epochs=10))
    fitted, _ = jax.jit(local.client_update)({}, tree_ops.gather(clients, 1), fed.client_data(1), jax.random.key(1),
                                             ClientRound(jnp.int32(0), jnp.int32(10)))
    client = {**tree_ops.gather(clients, 1), "variables": fitted["variables"]}
    server = {"variables": fed.model().init(jax.random.key(42))}
    out, _ = fed.one_client(method, client, server=server)
    assert 0.2 < float(out["alpha"]) <= 1.0


@pytest.mark.parametrize("config_type,options", [
    (APFLConfig, {"alpha": 1.5}), (APFLConfig, {"alpha_lr": 0.0}), (APFLConfig, {"mix": "weights"}),
    (APFLConfig, {"alpha_schedule": "sometimes"}), (APFLConfig, {"alpha_decay": -0.1}),
])
def test_bad_options_raise_user_error(config_type, options):
    with pytest.raises(UserError):
        config_lib.method_options(config_type, options)
