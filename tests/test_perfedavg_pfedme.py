"""Per-FedAvg and pFedMe (the pFedKD paper's baselines): the update rules against
explicit per-step reference loops, the server steps, learning on MNIST, bad options."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.base import ClientRound, ServerRound
from fedjax_pfl.methods.step_counted import random_batch
from test_pfedkd import _data, _method, mnist_config, run_rounds


def _client(method, c=1):
    x, y, idx = _data(3)
    train = stack_clients(x, y, idx)
    return ClientData(train.x[c], train.y[c], train.n[c])


def _batch_keys(key, steps, max_steps, per_step):
    """The batch keys `random_batch_steps` draws: per step, split into (step key, batch keys...)."""
    keys = jax.random.split(key, max_steps)
    return [jax.random.split(keys[r], per_step + 1)[1:] for r in range(steps)]


def _close(a, b, rtol=1e-5, atol=1e-6):
    for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=rtol, atol=atol)


def _loss_fn(method):
    def loss(params, batch):
        logits = method.model.apply({"params": params}, batch.x, train=True).logits
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, batch.y[:, None], axis=1)[:, 0]
        m = batch.mask.astype(jnp.float32)
        return jnp.sum(nll * m) / jnp.maximum(m.sum(), 1.0)
    return loss


# ------------------------------------------------------------------ Per-FedAvg
@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_client_step_equals_reference(variant):
    """fo: w <- w - beta grad f(w - alpha grad f(w; D); D');
    hf: w <- w - beta (I - alpha H(w; D'')) grad f(w - alpha grad f(w; D); D'), H explicit."""
    method = _method("perfedavg", beta=0.3, alpha=0.2, variant=variant, local_steps=3)
    data = _client(method)
    server, client = method.init(jax.random.key(0), 6)
    key = jax.random.key(5)
    out_client, upload = jax.jit(method.client_update)(server, client, data, key, ClientRound(0, jnp.int32(4)))
    loss = _loss_fn(method)
    params = server["variables"]["params"]
    flat0, unravel = jax.flatten_util.ravel_pytree(params)

    @jax.jit
    def reference_step(w, keys):
        b = [random_batch(k, data, method.setup.batch_size, method.setup.normalize) for k in keys]
        f = [lambda v, bb=bb: loss(unravel(v), bb) for bb in b]
        temp = w - 0.2 * jax.grad(f[0])(w)
        g2 = jax.grad(f[1])(temp)
        if variant == "hf":
            g2 = g2 - 0.2 * jax.hessian(f[2])(w) @ g2
        return w - 0.3 * g2

    w = flat0
    for keys in _batch_keys(key, 3, 3, 3 if variant == "hf" else 2):
        w = reference_step(w, keys)
    got, _ = jax.flatten_util.ravel_pytree(upload["variables"]["params"])
    assert np.abs(np.asarray(got - flat0)).max() > 1e-4
    np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-4, atol=1e-6)


def test_perfedavg_evaluates_after_one_step_and_averages_by_size():
    method = _method("perfedavg", alpha=0.2, eval_beta_steps=0)  # PFLlib's one step (default: test_authors_fidelity)
    data = _client(method)
    server, _ = method.init(jax.random.key(0), 6)
    key = jax.random.key(9)
    got = jax.jit(method.eval_variables)(server, {}, data, key)
    batch = random_batch(jax.random.split(key, 1)[0], data, method.setup.batch_size, method.setup.normalize)
    g = jax.grad(_loss_fn(method))(server["variables"]["params"], batch)
    _close(got["params"], jax.tree.map(lambda a, b: a - 0.2 * b, server["variables"]["params"], g))
    # server: n_i-weighted mean of the uploads; a dropped upload weighs 0
    ups = {"variables": jax.tree.map(lambda a: jnp.stack([a, a + 1.0, a + 5.0]), server["variables"])}
    info = ServerRound(0, jnp.arange(3), jnp.asarray([1.0, 3.0, 2.0]), jnp.asarray([True, True, False]))
    new, _ = method.server_update(server, {}, ups, info)
    _close(new["variables"], jax.tree.map(lambda a: a + 0.75, server["variables"]))


# ------------------------------------------------------------------ pFedMe
def test_pfedme_client_update_equals_reference_loop():
    """K inner steps theta <- theta - plr (grad f(theta) + lamda (theta - w_loc)) on one batch,
    then w_loc <- w_loc - eta lamda (w_loc - theta); R such steps from theta = w_loc = w."""
    lamda, plr, k_inner, eta, steps = 2.0, 0.05, 3, 0.1, 3
    method = _method("pfedme", lamda=lamda, personal_lr=plr, K=k_inner, local_steps=steps,
                     weight_decay=0.0)  # the decay: test_authors_fidelity
    assert method.train_lr == pytest.approx(eta)
    data = _client(method, 2)
    server, clients = method.init(jax.random.key(0), 6)
    client = jax.tree.map(lambda a: a[2], clients)
    key = jax.random.key(4)
    out, upload = jax.jit(method.client_update)(server, client, data, key, ClientRound(0, jnp.int32(4)))
    loss = _loss_fn(method)
    w, unravel = jax.flatten_util.ravel_pytree(server["variables"]["params"])

    @jax.jit
    def reference_step(theta, local, kb):
        batch = random_batch(kb, data, method.setup.batch_size, method.setup.normalize)
        for _ in range(k_inner):
            theta = theta - plr * (jax.grad(lambda v: loss(unravel(v), batch))(theta) + lamda * (theta - local))
        return theta, local - eta * lamda * (local - theta)

    theta, local = w, w
    for (kb,) in _batch_keys(key, steps, steps, 1):
        theta, local = reference_step(theta, local, kb)
    got_theta, _ = jax.flatten_util.ravel_pytree(out["variables"]["params"])
    got_local, _ = jax.flatten_util.ravel_pytree(upload["variables"]["params"])
    assert np.abs(np.asarray(got_theta - got_local)).max() > 1e-4
    np.testing.assert_allclose(np.asarray(got_theta), np.asarray(theta), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_local), np.asarray(local), rtol=1e-4, atol=1e-6)


def test_pfedme_server_mixes_with_beta():
    method = _method("pfedme", beta=2.0)
    server, clients = method.init(jax.random.key(0), 6)
    ups = {"variables": jax.tree.map(lambda a: jnp.stack([a + 1.0, a + 4.0]), server["variables"])}
    info = ServerRound(0, jnp.arange(2), jnp.asarray([2.0, 1.0]), jnp.asarray([True, True]))
    new, _ = method.server_update(server, clients, ups, info)
    # mean = w + 2; w_new = (1 - 2) w + 2 (w + 2) = w + 4
    _close(new["variables"], jax.tree.map(lambda a: a + 4.0, server["variables"]))
    # evaluation uses the personalized model theta_i
    assert method.eval_variables(server, jax.tree.map(lambda a: a[0], clients), None, None) is not None


# ------------------------------------------------------------------ options, learning
def test_bad_options_raise_user_error():
    bad = {
        "perfedavg": [{"beta": 0.0}, {"alpha": -1.0}, {"variant": "so"}, {"local_steps": 0}, {"eval_steps": 0},
                      {"lamda": 1.0}],
        "pfedme": [{"lamda": 0.0}, {"personal_lr": -0.1}, {"K": 0}, {"beta": -1.0}, {"local_steps": 1.5},
                   {"mu": 0.1}, {"theta_start": "local"}, {"aggregate": "mean"}],
    }
    for name, options in bad.items():
        cls = get_method(name)
        for o in options:
            with pytest.raises(UserError):
                config_lib.method_options(cls.hparams_type, o)
    assert config_lib.method_options(get_method("pfedme").hparams_type, {}).lamda == 15.0
    with pytest.raises(UserError):  # a BatchNorm model is refused
        get_method("pfedme")(_bn_setup()).init(jax.random.key(0), 2)


def test_a_method_with_its_own_sgd_refuses_an_optimizer_it_would_ignore():
    """pFedMe and Per-FedAvg step by hand with train.lr: Adam, momentum or decay asked of them must not be
    silently dropped (config.json would claim them). pFedKD, which trains with the run's optimizer, accepts."""
    import dataclasses

    setup = _method("pfedkd").setup
    for extra in [("train.optimizer=adam",), ("train.momentum=0.5",), ("train.weight_decay=0.0005",)]:
        richer = dataclasses.replace(setup, beyond_plain_sgd=extra)
        for name in ("pfedme", "perfedavg"):
            with pytest.raises(UserError, match=f"so {extra[0]} would be ignored"):
                get_method(name)(richer)
        get_method("pfedkd")(richer)
    for name in ("pfedme", "perfedavg"):
        get_method(name)(setup)  # plain SGD: accepted


def _bn_setup():
    """A setup whose model carries BatchNorm statistics (only ``init`` is needed)."""
    import types

    import optax

    from fedjax_pfl.methods.base import LocalSetup

    model = types.SimpleNamespace(init=lambda key: {"params": {"w": jnp.zeros(2)}, "batch_stats": {"m": jnp.zeros(2)}})
    return LocalSetup(model=model, optimizer=optax.sgd(0.1), batch_size=4, local_epochs=1, normalize=lambda x: x,
                      learning_rate=0.1)


@pytest.mark.parametrize("name", ["perfedavg", "pfedme"])
def test_learns_on_mnist(name, data_dir):
    # measured over partition seeds 0-2: majority 0.35-0.40, Per-FedAvg 0.71-0.72, pFedMe 0.52-0.57
    # (FedAvg 0.86-0.89 and Local 0.85-0.87 on the same clients: neither paper's claim over them holds here)
    first, acc, majority = run_rounds(mnist_config(data_dir, name, rounds=12))
    assert acc > majority + 0.05 and acc > first + 0.2, (first, acc, majority)

