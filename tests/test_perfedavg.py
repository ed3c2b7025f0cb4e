"""Per-FedAvg: the client step (first-order and Hessian-free) against an explicit per-step
reference loop, evaluation after one adaptation step, the server's size-weighted mean, and
learning on MNIST; as both authors' codes adapt for evaluation, an alpha then a beta step against
float64 on a linear model.

The small problem and the MNIST setting: tests/test_pfedkd.py; the linear-model federation:
tests/plain_sgd_federation.py. Option errors and the refusal of
an optimizer it would ignore (shared with pFedMe): tests/test_step_counted.py.
"""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import plain_sgd_federation as plain_fed
import step_counted_reference as step_ref
from fedjax_pfl.methods.base import ClientRound, ServerRound
from fedjax_pfl.methods.step_counted import random_batch
from test_pfedkd import _method, mnist_config, run_rounds


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_client_step_equals_reference(variant):
    """fo: w <- w - beta grad f(w - alpha grad f(w; D); D');
    hf: w <- w - beta (I - alpha H(w; D'')) grad f(w - alpha grad f(w; D); D'), H explicit."""
    method = _method("perfedavg", beta=0.3, alpha=0.2, variant=variant, local_steps=3)
    data = step_ref.client(method)
    server, client = method.init(jax.random.key(0), 6)
    key = jax.random.key(5)
    out_client, upload = jax.jit(method.client_update)(server, client, data, key, ClientRound(0, jnp.int32(4)))
    loss = step_ref.loss_fn(method)
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
    for keys in step_ref.batch_keys(key, 3, 3, 3 if variant == "hf" else 2):
        w = reference_step(w, keys)
    got, _ = jax.flatten_util.ravel_pytree(upload["variables"]["params"])
    assert np.abs(np.asarray(got - flat0)).max() > 1e-4
    np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-4, atol=1e-6)


def test_perfedavg_evaluates_after_one_step_and_averages_by_size():
    # PFLlib's one step (the default: test_perfedavg_adapts_with_an_alpha_then_a_beta_step_on_train_batches)
    method = _method("perfedavg", alpha=0.2, eval_beta_steps=0)
    data = step_ref.client(method)
    server, _ = method.init(jax.random.key(0), 6)
    key = jax.random.key(9)
    got = jax.jit(method.eval_variables)(server, {}, data, key)
    batch = random_batch(jax.random.split(key, 1)[0], data, method.setup.batch_size, method.setup.normalize)
    g = jax.grad(step_ref.loss_fn(method))(server["variables"]["params"], batch)
    step_ref.close(got["params"], jax.tree.map(lambda a, b: a - 0.2 * b, server["variables"]["params"], g))
    # server: n_i-weighted mean of the uploads; a dropped upload weighs 0
    ups = {"variables": jax.tree.map(lambda a: jnp.stack([a, a + 1.0, a + 5.0]), server["variables"])}
    info = ServerRound(0, jnp.arange(3), jnp.asarray([1.0, 3.0, 2.0]), jnp.asarray([True, True, False]))
    new, _ = method.server_update(server, {}, ups, info)
    step_ref.close(new["variables"], jax.tree.map(lambda a: a + 0.75, server["variables"]))


@pytest.mark.parametrize("name", ["perfedavg"])
def test_learns_on_mnist(name, data_dir):
    # measured over partition seeds 0-2: majority 0.35-0.40, Per-FedAvg 0.71-0.72
    # (FedAvg 0.86-0.89 and Local 0.85-0.87 on the same clients: the paper's claim over them does not hold here)
    first, acc, majority = run_rounds(mnist_config(data_dir, name, rounds=12))
    assert acc > majority + 0.05 and acc > first + 0.2, (first, acc, majority)


def test_perfedavg_adapts_with_an_alpha_then_a_beta_step_on_train_batches():
    """Both authors' codes: from the global model, one step of size alpha on a batch, then one of size beta on
    another; here both batches are random train batches (the i-th from the i-th of split(key, 2))."""
    alpha, beta = 0.2, 0.3
    method = plain_fed.method("perfedavg", plain_fed.setup("mlr"), alpha=alpha, beta=beta)
    assert (method.hparams.eval_steps, method.hparams.eval_beta_steps) == (1, 1)
    server, _ = method.init(jax.random.key(0), 1)
    data = plain_fed.client_data(2)
    key = jax.random.key(9)
    got = jax.jit(method.eval_variables)(server, {}, data, key)
    params = list(plain_fed.linear64(server["variables"]["params"]))
    for size, (x, y) in zip((alpha, beta), plain_fed.batches64(data, jax.random.split(key, 2))):
        params = [p - size * g for p, g in zip(params, plain_fed.softmax_ce_grad64(*params, x, y))]
    for a, b in zip(plain_fed.linear64(got["params"]), params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # PFLlib's single alpha step is the option eval_beta_steps=0, and it differs
    one = jax.jit(plain_fed.method("perfedavg", plain_fed.setup("mlr"), alpha=alpha, beta=beta,
                                   eval_beta_steps=0).eval_variables)(server, {}, data, key)
    assert np.abs(plain_fed.linear64(one["params"])[0] - params[0]).max() > 1e-3
