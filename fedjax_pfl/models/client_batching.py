"""The vmap rule of a two-argument layer op whose batched form takes one client per leading index.

A convolution or matmul vmapped over clients, each with its own kernel, should
not become a grouped convolution or a loop: the conv implementations
(direct_conv.py, pallas_conv.py) give each op a form ``batched(a, b)`` over a
leading client axis of both arguments, and `client_mapped` makes ``vmap``
call it. When only the data argument is mapped and the kernel is shared (a
global model evaluated on every client), the mapped axis is merged into the
data's batch axis instead: one op on a larger batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap


def client_mapped(one, batched, fold=None):
    """``one(*args)`` with a vmap rule: ``batched`` with every argument mapped on axis 0 (unmapped ones
    broadcast), or, when ``fold`` = (data argument, kernel argument) and only the data argument is mapped,
    ``one`` with the mapped axis merged into the data's batch axis.

    >>> op = client_mapped(lambda x, k: x @ k, lambda x, k: jnp.einsum("vbi,vio->vbo", x, k), fold=(0, 1))
    >>> jax.vmap(op)(jnp.ones((3, 2, 4)), jnp.ones((3, 4, 5))).shape
    (3, 2, 5)
    """
    op = custom_vmap(one)

    @op.def_vmap
    def rule(axis_size, in_batched, *args):
        args, mapped = list(args), list(in_batched)
        if fold is not None and mapped[fold[0]] and sum(mapped) == 1:
            data = args[fold[0]]
            args[fold[0]] = data.reshape((-1,) + data.shape[2:])
            out = op(*args)
            return out.reshape((axis_size, -1) + out.shape[1:]), True
        args = [v if m else jnp.broadcast_to(v, (axis_size,) + v.shape) for v, m in zip(args, mapped)]
        out = batched(*args)
        return out, jax.tree.map(lambda _: True, out)

    return op


def one_client(batched):
    """``batched`` (every argument and output with a leading client axis) for a single client.

    >>> one_client(lambda x, k: jnp.einsum("vbi,vio->vbo", x, k))(jnp.ones((2, 4)), jnp.ones((4, 5))).shape
    (2, 5)
    """
    return lambda *args: jax.tree.map(lambda a: a[0], batched(*(a[None] for a in args)))
