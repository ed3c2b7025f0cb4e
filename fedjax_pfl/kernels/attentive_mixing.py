"""FedAMP's attentive message passing: attention weights from pairwise squared
model distances, and the personalized cloud models U = Xi @ W.

Pure, jit-able functions of the stacked models ``W`` [N, P] (or a stacked
tree) and of the squared-distance matrix ``D2`` [N, N]. No loop over pairs:
the distances come from `model_distance.pairwise_sq_distances` (one Gram
matmul of the centered models), the mixing from `model_distance.apply_mixing`
(one [S, N] x [N, P] matmul). Nothing here knows about clients or the engine
(methods/fedamp.py composes it).

Weights (Huang et al., AAAI 2021, Eq. 8 with the exp attention function
A(x) = 1 - exp(-x / sigma), A'(x) = exp(-x / sigma) / sigma):

    xi_ij = alpha_k * A'(||w_i - w_j||^2)   (j != i),
    xi_ii = 1 - sum_{j != i} xi_ij           (the self-weight),

so every row sums to 1; closer models get larger weights. The self-weight
is negative when ``alpha_k * (N - 1) / sigma > 1`` and all models are close;
keep ``alpha_k * (N - 1) / sigma`` at most 1 for a convex mix.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_pfl.kernels import model_distance


def attention_derivative(sq_distances, sigma):
    """A'(x) = exp(-x / sigma) / sigma of the exp attention function A(x) = 1 - exp(-x / sigma).

    Examples:
        >>> import numpy as np
        >>> print(np.asarray(attention_derivative(jnp.array([0.0, 1.0]), sigma=1.0)).round(4))
        [1.     0.3679]
    """
    return jnp.exp(-sq_distances / sigma) / sigma


def attention_weights(sq_distances, alpha_k, sigma, rows=None):
    """Xi [N, N] (or [S, N] for ``rows``): alpha_k A'(d2_ij) off the diagonal, 1 - row sum on it.

    Examples:
        >>> import numpy as np
        >>> sq = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> xi = attention_weights(sq, alpha_k=0.1, sigma=1.0)
        >>> print(np.asarray(xi).round(3))
        [[0.961 0.037 0.002]
         [0.037 0.926 0.037]
         [0.002 0.037 0.961]]
        >>> print(np.asarray(xi.sum(axis=1)).round(3))  # every row sums to 1
        [1. 1. 1.]
    """
    n = sq_distances.shape[0]
    off_diagonal = ~jnp.eye(n, dtype=bool)
    off = jnp.where(off_diagonal, alpha_k * attention_derivative(sq_distances, sigma), 0.0)
    xi = off + jnp.diag(1.0 - jnp.sum(off, axis=1))
    return xi if rows is None else xi[rows]


def personalized_cloud_models(models, alpha_k, sigma, rows=None):
    """-> (U for ``rows`` (all if None), Xi, D2): FedAMP's server step in one call.

    models: [N, P] or a stacked tree of all N stored models; U comes back in the
    same form with one row per entry of ``rows``.

    Examples:
        >>> import numpy as np
        >>> models = jnp.array([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0]])  # N=3 flattened models
        >>> u, xi, sq = personalized_cloud_models(models, alpha_k=0.1, sigma=1.0, rows=jnp.array([0]))
        >>> print(np.asarray(u).round(3))  # client 0's cloud model, pulled toward its near neighbour
        [[0.037 0.   ]]
    """
    sq = model_distance.pairwise_sq_distances(models)
    xi = attention_weights(sq, alpha_k, sigma, rows)
    return model_distance.apply_mixing(xi, models), xi, sq
