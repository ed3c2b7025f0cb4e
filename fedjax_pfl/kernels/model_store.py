"""The server's copy of every client's latest model: rows [N, ...] updated from uploads.

Methods whose clients learn from other clients' models (FedFomo, APPLE, and
DiversiFed's stored parameters) keep the last arrived upload of each client on
the server. A dropped upload leaves the stored row as it was. Pure, jit-able.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def store_arrived(stored, selected, arrived, rows):
    """``stored`` (leaves [N, ...]) with rows ``selected`` [S] set to ``rows`` where ``arrived`` [S].

    Examples:
        >>> stored = {"w": jnp.zeros((4, 2))}  # N=4 clients' stored models
        >>> rows = {"w": jnp.ones((2, 2))}  # uploads of the S=2 selected clients
        >>> new = store_arrived(stored, jnp.array([1, 3]), jnp.array([True, False]), rows)  # client 3's upload was lost
        >>> new["w"][:, 0].tolist()
        [0.0, 1.0, 0.0, 0.0]
    """

    def store(all_rows, new_rows):
        old = all_rows[selected]
        mask = arrived.reshape((-1,) + (1,) * (new_rows.ndim - 1))
        return all_rows.at[selected].set(jnp.where(mask, new_rows.astype(all_rows.dtype), old))

    return jax.tree.map(store, stored, rows)


def arrived_mask(num_clients: int, selected, arrived):
    """bool [N]: True for the clients whose upload arrived this round.

    Examples:
        >>> arrived_mask(4, jnp.array([1, 3]), jnp.array([True, False])).tolist()
        [False, True, False, False]
    """
    return jnp.zeros((num_clients,), bool).at[selected].set(arrived)
