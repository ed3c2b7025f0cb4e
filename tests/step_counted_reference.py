"""What the Per-FedAvg and pFedMe update-rule tests share: one client of the pFedKD tests' small
problem, the batch keys `random_batch_steps` draws, the masked cross-entropy written out again,
and a tolerance check."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.data.client_data import ClientData, stack_clients
from test_pfedkd import _data


def client(method, c=1):
    x, y, idx = _data(3)
    train = stack_clients(x, y, idx)
    return ClientData(train.x[c], train.y[c], train.n[c])


def batch_keys(key, steps, max_steps, per_step):
    """The batch keys `random_batch_steps` draws: per step, split into (step key, batch keys...)."""
    keys = jax.random.split(key, max_steps)
    return [jax.random.split(keys[r], per_step + 1)[1:] for r in range(steps)]


def close(a, b, rtol=1e-5, atol=1e-6):
    for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=rtol, atol=atol)


def loss_fn(method):
    def loss(params, batch):
        logits = method.model.apply({"params": params}, batch.x, train=True).logits
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, batch.y[:, None], axis=1)[:, 0]
        m = batch.mask.astype(jnp.float32)
        return jnp.sum(nll * m) / jnp.maximum(m.sum(), 1.0)
    return loss
