"""A deterministic validation split of ONE client's own train data (never its test data).

Of a client's ``n`` samples, ``floor(n * fraction)`` are validation samples,
taken at evenly spaced positions (sample j is in validation iff
``floor((j + 1) f) > floor(j f)``), so the split does not depend on a key and
follows the label mix even if a client's samples were stored sorted by class.
The rest is the train part. Both parts come back as single-client
``ClientData`` with their real samples first (the padded layout every other
pass expects); they are gathers of the same arrays, nothing is copied to host.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_pfl.data.client_data import ClientData


def validation_mask(n, n_max: int, fraction: float):
    """bool [n_max]: the validation positions among the first ``n`` rows."""
    j = jnp.arange(n_max)
    picked = jnp.floor((j + 1) * fraction) > jnp.floor(j * fraction)
    return picked & (j < n)


def split_train_validation(data: ClientData, fraction: float) -> tuple[ClientData, ClientData]:
    """(train part, validation part) of one client's ``ClientData(x [n_max, ...], y [n_max], n)``."""
    n_max = data.y.shape[0]
    val = validation_mask(data.n, n_max, fraction)
    real = jnp.arange(n_max) < data.n
    train = real & ~val

    def first(mask):  # stable: real samples of the part first, in their stored order
        order = jnp.argsort(~mask, stable=True)
        return ClientData(data.x[order], data.y[order], jnp.sum(mask).astype(jnp.int32))

    return first(train), first(val)
