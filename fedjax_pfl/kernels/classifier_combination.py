"""FedPAC's classifier collaboration (Xu, Tong & Huang, ICLR 2023): the quantities from
which each client's new head is combined out of the uploaded heads.

* `qp_matrices`: P_i = diag(V) + D_i, (D_i)_jk = sum_c (h_i[c] - h_j[c]) . (h_i[c] - h_k[c]),
  for every client i at once (the QP of `simplex_qp.combination_weights_batch`);
* `prototype_losses`: f_ij = sum_k pi_jk CE(head_i(c_j^k), k), client j's class
  prototypes through client i's head weighted by j's class prior (the
  prototype-loss variant's weights come from softmax_j(-f_ij)).

Pure, jit-able; ``model`` only needs ``apply_head``. No loop over clients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def qp_matrices(V, H):
    """FedPAC's P_i = diag(V) + D_i for every client i: V [S], H [S, C, d] -> [S, S, S].

    Examples:
        >>> import numpy as np
        >>> V = jnp.array([0.1, 0.2])
        >>> H = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # S=2 clients, C=1, d=2
        >>> print(np.asarray(qp_matrices(V, H)[0]).round(3))  # P_0 = diag(V) + D_0
        [[0.1 0. ]
         [0.  2.2]]
    """
    S = V.shape[0]
    flat = H.reshape(S, -1).astype(jnp.float32)

    def one(h_i):
        diff = h_i[None, :] - flat  # [S, C*d]
        return jnp.diag(V.astype(jnp.float32)) + jnp.matmul(diff, diff.T, precision=jax.lax.Precision.HIGHEST)

    return jax.vmap(one)(flat)


def prototype_losses(model, heads, protos, counts):
    """f_ij = sum_k pi_jk CE(head_i(c_j^k), k): heads stacked [S, ...], protos [S, C, d], counts [S, C].

    Examples:
        >>> import numpy as np
        >>> class Head:  # a model whose head is a linear map: logits = proto @ kernel
        ...     def apply_head(self, variables, x):
        ...         return x @ variables["params"]["head"]["kernel"]
        >>> heads = {"params": {"kernel": jnp.stack([jnp.eye(2), -jnp.eye(2)])}}  # S=2 heads
        >>> protos = jnp.stack([jnp.eye(2), jnp.eye(2)])  # [S, C, d]: class k's prototype is e_k
        >>> counts = jnp.array([[5.0, 5.0], [5.0, 5.0]])
        >>> print(np.asarray(prototype_losses(Head(), heads, protos, counts)).round(3))  # head 0 fits, head 1 does not
        [[0.313 0.313]
         [1.313 1.313]]
    """
    counts = counts.astype(jnp.float32)
    prior = counts / jnp.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    labels = jnp.arange(protos.shape[1])

    def loss(head, proto, pri):
        logits = model.apply_head({"params": {"head": head["params"]}}, proto)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.sum(pri * logp[labels, labels])

    return jax.vmap(lambda h: jax.vmap(lambda p, q: loss(h, p, q))(protos, prior))(heads)
