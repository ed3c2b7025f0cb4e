"""DiversiFed's O(N^2) kernel: pairwise model distances, the model-distance
loss, the mixing matrix Xi and the mixed models U = Xi @ W.

Everything here is a pure, jit-able function of a matrix ``W`` [N, P] of N
flattened models (``tree_ops.flatten_stacked`` of a stacked tree) or of the
distance matrix ``D`` [N, N]. There is no loop over pairs: the distances come
from one Gram matmul, the mixing from one [S, N] x [N, P] matmul. Nothing here
knows about clients, data or the engine (methods/diversifed.py composes it).

Numerics
--------
Distances are translation invariant, so the Gram matrix is taken of the
mean-centered models ``Wc = W - mean(W)``: ``d_ij^2 = g_ii + g_jj - 2 g_ij``
with ``G = Wc Wc^T``. Centering removes the common part of nearly identical
models (e.g. all clients after a few rounds from one initialisation), which is
what would otherwise cancel catastrophically in float32. Tiny negative squared
distances are clamped to 0; the square root has a zero (sub)gradient at 0 and
the diagonal is exactly 0. Computation is in float32, or in the input's dtype
when that is wider (float64 under ``jax.enable_x64(True)``); matmuls use
``Precision.HIGHEST`` so GPUs/TPUs do not drop to TF32/bfloat16.

Remaining limit (documented, tested): the relative error of d_ij is about
``eps32 * (|wc_i|^2 + |wc_j|^2) / d_ij^2``; it is small unless two models are
much closer to each other than to the mean of all models (tight clusters far
apart): measured 2e-7 for random or globally near-identical models, 1e-3 for
two clusters whose spread is 1/70 of their separation. Pairs closer than the
Gram's rounding noise are reported at distance 0 (see `pairwise_sq_distances`),
so the server step is never amplified by a spuriously tiny distance.

Model-distance loss (docs/methods/conventions.md, DiversiFed; its equation is
reconstructed from the paper's words, so it lives in ONE pure function,
`model_distance_loss`, to be swapped). Models are compared by a bounded
similarity, a Gaussian kernel of their Euclidean distance, and the loss
sharpens each client's softmax over those similarities:

    k_ij = exp(-d_ij^2 / sigma),
    L(D) = sum_i L_i,  L_i = sum_{j != i} log( exp(tau k_ij) / sum_{l != i} exp(tau k_il) ).

L_i is smallest when client i's similarities are as unequal as possible, so
descent raises the similarity of models more similar than i's softmax average
(attraction) and lowers that of the others (repulsion):
dL_i/dk_ij = tau (1 - (N-1) s_ij), s_ij = softmax_{l != i}(tau k_il)_j. A
larger ``tau`` both sharpens the softmax and scales the gradient, so it
strengthens the pull and the push together. The logits lie in [0, tau], so L
is bounded below, and the push on a model fades as its similarity goes to 0:
a far model is left alone instead of being driven away without end.

The server step is one gradient step on L with respect to every model
("incremental proximal", Lemma 1), taken in units of the kernel scale:
``u_i = w_i - eta_i * sigma * grad_{w_i} L`` (eta_i = eta unless cut, below).
Since ``grad_{w_i} d_ij^2 = 2 (w_i - w_j)``, ``u_i = sum_j xi_ij w_j`` with

    xi_ij = 2 eta_i sigma c_ij  (j != i),   xi_ii = 1 - sum_{j != i} xi_ij,
    c_ij = dL/d(d_ij^2) counting both L_i and L_j  (= G_ij + G_ji, G = dL/dD^2),
    sigma c_ij = tau [k_ij ((N-1) s_ij - 1) + k_ji ((N-1) s_ji - 1)],

so every row of Xi sums to 1, a positive entry attracts and a negative one
repels. Taking the step on squared distances keeps every coefficient bounded
(no 1/d_ij factor, which would overshoot close pairs), and a pair at distance
0 has k = 1 and a zero direction (identical initial models: Xi = I). The
entries are weighted by the similarity, so the pull on near models outweighs
the push on far ones: sum_{j != i} k_ij ((N-1) s_ij - 1) >= 0 (k and s are
ordered alike), hence sum_ij c_ij >= 0: over all clients, the step mixes
others in (the mean self-weight of the uncut step is below 1 whenever the
similarities differ).

Scale and stability: ``sigma`` is a fixed scale in squared parameter distance
(like FedAMP's), not a statistic of the current models: with a scale that
follows the models (their mean distance), the push is a constant fraction of
the distances, and the models spread geometrically round after round. With a
fixed scale, models farther apart than a few sqrt(sigma) neither attract nor
repel. Since (N-1) s_ij <= e^tau, |xi_ij| <= 4 eta tau (e^tau - 1). The pull
grows as similar models gather (their similarities part from the others'),
so a step that mixes well while the models are still alike would, once they
cluster, move a client past the models it is pulled to (xi_ii < 0) and make
the clusters oscillate. Each client's step size is therefore cut, where
needed, to the step at which xi_ii reaches 0 (`step_sizes`): a per-client
step along the same gradient, so still a descent step on L, and a mix that
never weighs a client's own model negatively.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_pfl.core import tree_ops

_HIGHEST = jax.lax.Precision.HIGHEST


def _as_matrix(models):
    """[N, P] array, or a stacked pytree flattened to [N, P]."""
    if hasattr(models, "ndim"):
        if models.ndim != 2:
            raise ValueError(f"expected a matrix [N, P] of flattened models, got shape {models.shape}")
        return models
    return tree_ops.flatten_stacked(models)


def _compute_dtype(a):
    return jnp.promote_types(a.dtype, jnp.float32)


def center_models(models):
    """(W - mean over models, mean) in the compute dtype. W [N, P].

    Examples:
        >>> wc, mean = center_models(jnp.array([[1.0, 2.0], [3.0, 6.0]]))
        >>> wc.tolist(), mean.tolist()
        ([[-1.0, -2.0], [1.0, 2.0]], [2.0, 4.0])
    """
    w = _as_matrix(models)
    w = w.astype(_compute_dtype(w))
    n = w.shape[0]
    # The mean as a [1, N] x [N, P] product: XLA:CPU's reduction over the
    # leading axis is ~10x slower than this GEMV (measured at P = 500K). Any
    # reference point near the mean serves: distances and U do not depend on it.
    mean = jnp.matmul(jnp.full((1, n), 1.0 / n, w.dtype), w, precision=_HIGHEST)[0]
    return w - mean, mean


def pairwise_sq_distances(models, resolution: float | None = None):
    """Squared Euclidean distances [N, N] from ONE Gram matmul of the centered models.

    The diagonal is exactly 0. A value below the Gram's rounding noise,
    ``resolution * (g_ii + g_jj)`` (default ``64 * eps`` of the compute dtype;
    measured noise is up to ~20 eps at 11M float32 parameters), is set to 0:
    such a pair cannot be told apart from identical models at this precision
    (this also clamps tiny negatives). Pass ``resolution=0`` to only clamp.

    Examples:
        >>> import numpy as np
        >>> print(np.asarray(pairwise_sq_distances(jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]))).round(3))
        [[ 0. 25.  1.]
         [25.  0. 18.]
         [ 1. 18.  0.]]
    """
    wc, _ = center_models(models)
    gram = jnp.matmul(wc, wc.T, precision=_HIGHEST)
    sq_norm = jnp.diagonal(gram)
    scale = sq_norm[:, None] + sq_norm[None, :]
    sq = scale - 2.0 * gram
    if resolution is None:
        resolution = 64 * float(jnp.finfo(wc.dtype).eps)
    n = gram.shape[0]
    keep = (sq > resolution * scale) & ~jnp.eye(n, dtype=bool)
    return jnp.where(keep, sq, 0.0)


def safe_sqrt(x):
    """sqrt(x) for x >= 0 with value 0 and gradient 0 at x == 0 (never NaN).

    Examples:
        >>> safe_sqrt(jnp.array([4.0, 0.0])).tolist(), jax.grad(lambda x: safe_sqrt(x))(0.0).tolist()
        ([2.0, 0.0], 0.0)
    """
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def pairwise_distances(models, resolution: float | None = None):
    """Euclidean distances d_ij = ||w_i - w_j||_2, [N, N], for W [N, P] or a stacked tree.

    See `pairwise_sq_distances` for ``resolution``.

    Examples:
        >>> import numpy as np
        >>> print(np.asarray(pairwise_distances(jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]))).round(3))
        [[0.    5.    1.   ]
         [5.    0.    4.243]
         [1.    4.243 0.   ]]
    """
    return safe_sqrt(pairwise_sq_distances(models, resolution))


def _off_diagonal(n: int):
    return ~jnp.eye(n, dtype=bool)


def similarities(sq_distances, sigma):
    """k_ij = exp(-d_ij^2 / sigma): 1 for identical models, toward 0 for models far apart.

    Examples:
        >>> import numpy as np
        >>> print(np.asarray(similarities(jnp.array([[0.0, 1.0], [1.0, 0.0]]), sigma=2.0)).round(4))
        [[1.     0.6065]
         [0.6065 1.    ]]
    """
    return jnp.exp(-sq_distances / sigma)


def model_distance_loss(sq_distances, tau, sigma):
    """L(D^2) = sum_i sum_{j != i} log softmax_{l != i}(tau k_il)_j, k = exp(-D^2 / sigma) (module docstring).

    sq_distances [N, N] (symmetric, zero diagonal; entries are used as
    independent inputs, so dL/dD^2_ij is the L_i part only). The only place the
    formula lives.

    Examples:
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> round(float(model_distance_loss(d2, tau=1.0, sigma=1.0)), 4)
        -4.2197
    """
    n = sq_distances.shape[0]
    if n < 2:
        return jnp.zeros((), sq_distances.dtype)
    off = _off_diagonal(n)
    logits = tau * similarities(sq_distances, sigma)
    lse = jax.nn.logsumexp(jnp.where(off, logits, -jnp.inf), axis=1)  # [N]
    per_client = jnp.sum(jnp.where(off, logits, 0.0), axis=1) - (n - 1) * lse
    return jnp.sum(per_client)


def model_distance_loss_grad(sq_distances, tau, sigma):
    """Closed form of dL/dD^2 for `model_distance_loss`: (tau/sigma) k_ij ((N-1) s_ij - 1) off the diagonal.

    s_ij = softmax_{l != i}(tau k_il)_j. Positive entries attract (the loss
    grows with that distance). A test reference for autodiff.

    Examples:
        >>> import numpy as np
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> g = model_distance_loss_grad(d2, 1.0, 1.0)
        >>> bool(jnp.allclose(g, jax.grad(model_distance_loss)(d2, 1.0, 1.0), atol=1e-6))
        True
        >>> print(np.asarray(g).round(3))  # client 0: model 1 (near) attracts, model 2 (far) repels
        [[ 0.     0.064 -0.003]
         [ 0.     0.     0.   ]
         [-0.003  0.064  0.   ]]
    """
    n = sq_distances.shape[0]
    if n < 2:
        return jnp.zeros_like(sq_distances)
    off = _off_diagonal(n)
    k = similarities(sq_distances, sigma)
    s = jax.nn.softmax(jnp.where(off, tau * k, -jnp.inf), axis=1)
    return jnp.where(off, (tau / sigma) * k * ((n - 1) * s - 1.0), 0.0)


def pair_coefficients(sq_distances, tau, sigma, loss_fn: Callable = model_distance_loss):
    """c_ij = dL/d(d_ij^2) with d_ij = d_ji one variable: G + G^T, G = grad of ``loss_fn`` w.r.t. D^2.

    Examples:
        >>> import numpy as np
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> print(np.asarray(pair_coefficients(d2, 1.0, 1.0)).round(3))  # symmetric
        [[ 0.     0.064 -0.006]
         [ 0.064  0.     0.064]
         [-0.006  0.064  0.   ]]
    """
    g = jax.grad(loss_fn)(sq_distances, tau, sigma)
    return jnp.where(_off_diagonal(sq_distances.shape[0]), g + g.T, 0.0)


def mixing_matrix(sq_distances, tau, eta, sigma, *, loss_fn: Callable = model_distance_loss, rows=None):
    """Xi [N, N] (or [S, N] for ``rows`` [S]): xi_ij = 2 eta_i sigma c_ij, xi_ii = 1 - sum_{j != i} xi_ij.

    ``sq_distances`` are the squared distances of ALL N models; rows select
    whose mixed model is wanted (the clients of this round). Every row sums to
    1. eta_i = eta, cut to the step at which xi_ii reaches 0 where the full
    step would make it negative (`step_sizes`).

    Examples:
        >>> import numpy as np
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> xi = mixing_matrix(d2, tau=1.0, eta=0.5, sigma=1.0)
        >>> print(np.asarray(xi).round(3))  # a negative entry repels
        [[ 0.943  0.064 -0.006]
         [ 0.064  0.873  0.064]
         [-0.006  0.064  0.943]]
        >>> print(np.asarray(mixing_matrix(d2, tau=1.0, eta=10.0, sigma=1.0)).round(3))  # steps cut: xi_ii = 0
        [[ 0.     1.111 -0.111]
         [ 0.5    0.     0.5  ]
         [-0.111  1.111  0.   ]]
    """
    n = sq_distances.shape[0]
    pull = 2.0 * sigma * pair_coefficients(sq_distances, tau, sigma, loss_fn)  # the step per unit of eta
    off = step_sizes(pull, eta)[:, None] * pull
    xi = off + jnp.diag(1.0 - jnp.sum(off, axis=1))
    if rows is not None:
        xi = xi[rows]
    return xi


def step_sizes(pull, eta):
    """Each client's server step size [N]: eta, or less where the full step would put a negative weight on
    the client's own model, 1 / sum_{j != i} pull_ij (then xi_ii = 0). ``pull`` [N, N]: Xi's off-diagonal per
    unit of step.

    Examples:
        >>> print(step_sizes(jnp.array([[0.0, 0.5], [4.0, 0.0]]), eta=1.0).tolist())
        [1.0, 0.25]
    """
    net = jnp.sum(pull, axis=1)
    return jnp.where(eta * net > 1.0, 1.0 / jnp.where(net > 0, net, 1.0), eta)


def apply_mixing(xi, models):
    """U = Xi @ W as ONE matmul on the centered models: Xi @ Wc + rowsum(Xi) * mean.

    xi [S, N], models [N, P] or a stacked tree with N rows (then a stacked tree
    with S rows comes back, in the models' dtypes). Equal to Xi @ W for any Xi;
    centering keeps nearly identical models exact in float32.

    Examples:
        >>> xi = jnp.array([[0.5, 0.5, 0.0], [0.0, 1.5, -0.5]])  # S=2 rows over N=3 models
        >>> import numpy as np
        >>> print(np.asarray(apply_mixing(xi, jnp.array([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0]]))).round(3))
        [[ 1.  0.]
         [ 3. -2.]]
    """
    is_tree = not hasattr(models, "ndim")
    w = _as_matrix(models)
    wc, mean = center_models(w)
    xi = xi.astype(wc.dtype)
    u = jnp.matmul(xi, wc, precision=_HIGHEST) + jnp.sum(xi, axis=1, keepdims=True) * mean[None, :]
    if is_tree:
        return _unflatten_rows(u, models)
    return u.astype(w.dtype)


def _unflatten_rows(matrix, like):
    """[S, P] -> a stacked tree shaped like ``like`` (any leading size) with S rows."""
    leaves, treedef = jax.tree.flatten(like)
    s, out, start = matrix.shape[0], [], 0
    for a in leaves:
        size = a[0].size
        out.append(matrix[:, start:start + size].reshape((s,) + a.shape[1:]).astype(a.dtype))
        start += size
    return jax.tree.unflatten(treedef, out)


def mix_models(models, tau, eta, sigma, *, rows=None, loss_fn: Callable = model_distance_loss):
    """DiversiFed's server step in one call: -> (U for ``rows`` (all if None), Xi, D).

    models: [N, P] or a stacked tree of all N stored models; U comes back in
    the same form with S = len(rows) rows; D are the Euclidean distances [N, N].

    Examples:
        >>> import numpy as np
        >>> models = jnp.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])  # N=3 flattened models
        >>> u, xi, d = mix_models(models, tau=1.0, eta=0.5, sigma=1.0, rows=jnp.array([0]))
        >>> print(np.asarray(d).round(3))
        [[0.    1.    2.   ]
         [1.    0.    2.236]
         [2.    2.236 0.   ]]
        >>> print(np.asarray(u).round(3))  # client 0's anchor: toward model 1 (near), away from model 2 (far)
        [[ 0.129 -0.006]]
    """
    sq = pairwise_sq_distances(models)
    xi = mixing_matrix(sq, tau, eta, sigma, loss_fn=loss_fn, rows=rows)
    return apply_mixing(xi, models), xi, safe_sqrt(sq)


def signed_mass(xi, own):
    """{'attraction', 'repulsion'}: mean over rows of the sum of the positive (attracting) and of the
    negative (repelling, <= 0) weights on other clients; xi [S, N], ``own`` [S] each row's own column.

    Examples:
        >>> xi = jnp.array([[0.7, 0.4, -0.1], [0.2, 0.8, 0.0]])
        >>> {k: round(float(v), 3) for k, v in signed_mass(xi, jnp.array([0, 1])).items()}
        {'attraction': 0.3, 'repulsion': -0.05}
    """
    s, n = xi.shape
    others = jnp.where(jnp.arange(n)[None, :] == jnp.asarray(own)[:, None], 0.0, xi)
    return {"attraction": jnp.mean(jnp.sum(jnp.maximum(others, 0.0), axis=1)),
            "repulsion": jnp.mean(jnp.sum(jnp.minimum(others, 0.0), axis=1))}
