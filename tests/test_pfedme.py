"""pFedMe: the client update (K inner steps per batch, then the local model's step) against an
explicit reference loop, the server's beta mix, and learning on MNIST.

The small problem and the MNIST setting: tests/test_pfedkd.py. Option errors, the no-BatchNorm
check and the refusal of an optimizer it would ignore (shared with Per-FedAvg):
tests/test_step_counted.py.
"""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import step_counted_reference as step_ref
from fedjax_pfl.methods.base import ClientRound, ServerRound
from fedjax_pfl.methods.step_counted import random_batch
from test_pfedkd import _method, mnist_config, run_rounds


def test_pfedme_client_update_equals_reference_loop():
    """K inner steps theta <- theta - plr (grad f(theta) + lamda (theta - w_loc)) on one batch,
    then w_loc <- w_loc - eta lamda (w_loc - theta); R such steps from theta = w_loc = w."""
    lamda, plr, k_inner, eta, steps = 2.0, 0.05, 3, 0.1, 3
    method = _method("pfedme", lamda=lamda, personal_lr=plr, K=k_inner, local_steps=steps,
                     weight_decay=0.0)  # the decay: test_authors_fidelity
    assert method.train_lr == pytest.approx(eta)
    data = step_ref.client(method, 2)
    server, clients = method.init(jax.random.key(0), 6)
    client = jax.tree.map(lambda a: a[2], clients)
    key = jax.random.key(4)
    out, upload = jax.jit(method.client_update)(server, client, data, key, ClientRound(0, jnp.int32(4)))
    loss = step_ref.loss_fn(method)
    w, unravel = jax.flatten_util.ravel_pytree(server["variables"]["params"])

    @jax.jit
    def reference_step(theta, local, kb):
        batch = random_batch(kb, data, method.setup.batch_size, method.setup.normalize)
        for _ in range(k_inner):
            theta = theta - plr * (jax.grad(lambda v: loss(unravel(v), batch))(theta) + lamda * (theta - local))
        return theta, local - eta * lamda * (local - theta)

    theta, local = w, w
    for (kb,) in step_ref.batch_keys(key, steps, steps, 1):
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
    step_ref.close(new["variables"], jax.tree.map(lambda a: a + 4.0, server["variables"]))
    # evaluation uses the personalized model theta_i
    assert method.eval_variables(server, jax.tree.map(lambda a: a[0], clients), None, None) is not None


@pytest.mark.parametrize("name", ["pfedme"])
def test_learns_on_mnist(name, data_dir):
    # measured over partition seeds 0-2: majority 0.35-0.40, pFedMe 0.52-0.57
    # (FedAvg 0.86-0.89 and Local 0.85-0.87 on the same clients: the paper's claim over them does not hold here)
    first, acc, majority = run_rounds(mnist_config(data_dir, name, rounds=12))
    assert acc > majority + 0.05 and acc > first + 0.2, (first, acc, majority)
