"""Padding rows must not reach BatchNorm statistics: three batches that differ only in their
padding rows, the check that an objective gives the same loss and statistics over all three,
and a ResNet-8 setup to run it on."""

import jax
import jax.numpy as jnp
import numpy as np

import plain_sgd_federation as plain_fed
from fedjax_pfl.kernels.local_training import Batch


def padded_batches(seed=0):
    """(3 real rows alone, the same + 3 zero rows, the same + 3 rows of noise), masks marking the real rows."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(3, 8, 8, 3)), jnp.float32)
    y = jnp.asarray([0, 2, 1])
    pad_y = jnp.zeros(3, jnp.int32)
    mask = jnp.arange(6) < 3
    noise = jnp.asarray(rng.normal(size=(3, 8, 8, 3)) * 5 + 3, jnp.float32)
    padded_y = jnp.concatenate([y, pad_y])
    return (Batch(x, y, jnp.ones(3, bool)), Batch(jnp.concatenate([x, jnp.zeros_like(x)]), padded_y, mask),
            Batch(jnp.concatenate([x, noise]), padded_y, mask))


def assert_same_over_padding(objective, variables):
    outs = [jax.jit(objective)(variables, batch, jax.random.key(0)) for batch in padded_batches()]
    for out in outs[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), out, outs[0])


def bn_setup():
    return plain_fed.setup("resnet8", shape=(8, 8, 3), batch_size=6)
