"""The server's copy of every client's latest model: rows [N, ...] updated from uploads.

Methods whose clients learn from other clients' models (FedFomo, APPLE, and
DiversiFed's stored parameters) keep the last arrived upload of each client on
the server. A dropped upload leaves the stored row as it was. Pure, jit-able.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def store_arrived(stored, selected, arrived, rows):
    """``stored`` (leaves [N, ...]) with rows ``selected`` [S] set to ``rows`` where ``arrived`` [S]."""

    def store(all_rows, new_rows):
        old = all_rows[selected]
        mask = arrived.reshape((-1,) + (1,) * (new_rows.ndim - 1))
        return all_rows.at[selected].set(jnp.where(mask, new_rows.astype(all_rows.dtype), old))

    return jax.tree.map(store, stored, rows)


def arrived_mask(num_clients: int, selected, arrived):
    """bool [N]: True for the clients whose upload arrived this round."""
    return jnp.zeros((num_clients,), bool).at[selected].set(arrived)
