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

Model-distance loss (docs/methods/conventions.md, DiversiFed; reconstructed from the paper's
words, so it lives in ONE pure function, `model_distance_loss`, to be swapped):

    L(D) = sum_i L_i,  L_i = sum_{j != i} log( exp(d_ij/tau) / sum_{k != i} exp(d_ik/tau) )

The server step is one gradient step on L w.r.t. every model ("incremental
proximal", Lemma 1): ``u_i = w_i - eta * grad_{w_i} L``. Since
``grad_{w_i} d_ij = (w_i - w_j) / d_ij``, ``u_i = sum_j xi_ij w_j`` with

    xi_ij = eta * c_ij / d_ij  (j != i),   xi_ii = 1 - sum_{j != i} xi_ij,
    c_ij = dL/dd_ij counting both L_i and L_j  (= G_ij + G_ji, G = dL/dD),

so every row of Xi sums to 1 and a negative entry repels. A pair at distance 0
gets xi_ij = 0 (its direction is undefined; the step it would take has norm
eta*|c_ij| in any case, so nothing is lost by dropping it).

Distance normalisation (``normalization``): distances are measured in units
of a scale ``s`` held constant within the step, i.e. the step is a gradient
step in the rescaled space w / s, ``xi_ij = eta * c(d/s)_ij / (d_ij / s)``:
  - ``'mean'`` (the default of methods/diversifed.py): s = mean off-diagonal
    distance of this round, so tau and eta do not depend on the model size or
    on how far training has moved the models;
  - ``'sqrt_params'``: s = sqrt(P); d/s is the RMS difference per parameter;
  - ``'none'``: s = 1, exactly the formula above.
Rows of Xi sum to 1 in every case (Lemma 1 form); only c changes.

Stability (measured, see the closing note): L is unbounded below — as one
d_ik grows, log s_ij -> -inf for the others — and its push on the farthest
models saturates at (N-1)/tau per loss term, so a gradient step with too large
``eta`` drives the models apart round after round (train loss of the proximal
term explodes). Keep ``eta * 2 (N - 2) / tau`` well below 1 (in units of s).
``scale_free=True`` differentiates L(D / mean(D)) through the mean instead,
which removes the first-order inflation of all distances (sum_ij c_ij d_ij = 0)
but not the drive toward extreme configurations; it measured worse on FMNIST
and is not used by the method.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_pfl.core import tree_ops

NORMALIZATIONS = ("mean", "sqrt_params", "none")
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


def mean_distance(distances):
    """Mean off-diagonal entry of D [N, N] (1 when N < 2 or all distances are 0); differentiable.

    Examples:
        >>> round(float(mean_distance(jnp.array([[0.0, 5.0, 1.0], [5.0, 0.0, 3.0], [1.0, 3.0, 0.0]]))), 4)
        3.0
    """
    n = distances.shape[0]
    if n < 2:
        return jnp.ones((), distances.dtype)
    mean = jnp.sum(jnp.where(_off_diagonal(n), distances, 0.0)) / (n * (n - 1))
    positive = mean > jnp.finfo(distances.dtype).tiny
    return jnp.where(positive, mean, 1.0)


def distance_scale(distances, normalization: str = "mean", num_params: int | None = None):
    """The scale s of `normalize_distances`, as a constant (no gradient flows through it).

    Examples:
        >>> d = jnp.array([[0.0, 5.0, 1.0], [5.0, 0.0, 3.0], [1.0, 3.0, 0.0]])
        >>> [round(float(distance_scale(d, norm, num_params=4)), 4) for norm in NORMALIZATIONS]
        [3.0, 2.0, 1.0]
    """
    if normalization == "none":
        return jnp.ones((), distances.dtype)
    if normalization == "sqrt_params":
        if num_params is None:
            raise ValueError("normalization 'sqrt_params' needs num_params")
        return jnp.sqrt(jnp.asarray(num_params, distances.dtype))
    if normalization == "mean":
        return jax.lax.stop_gradient(mean_distance(distances))
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")


def normalize_distances(distances, normalization: str = "mean", num_params: int | None = None):
    """-> (D / s, s); see the module docstring for the choices of s.

    Examples:
        >>> import numpy as np
        >>> d = jnp.array([[0.0, 5.0, 1.0], [5.0, 0.0, 3.0], [1.0, 3.0, 0.0]])
        >>> d_hat, s = normalize_distances(d)
        >>> round(float(s), 4)  # the mean off-diagonal distance
        3.0
        >>> print(np.asarray(d_hat).round(3))
        [[0.    1.667 0.333]
         [1.667 0.    1.   ]
         [0.333 1.    0.   ]]
    """
    s = distance_scale(distances, normalization, num_params)
    return distances / s, s


def _off_diagonal(n: int):
    return ~jnp.eye(n, dtype=bool)


def model_distance_loss(distances, tau):
    """L(D) = sum_i sum_{j != i} log softmax_{k != i}(d_ik / tau)_j  (docs/methods/conventions.md, DiversiFed).

    distances [N, N] (symmetric, zero diagonal; entries are used as independent
    inputs, so dL/dD_ij is the L_i part only). The only place the formula lives.

    Examples:
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> round(float(model_distance_loss(d, tau=1.0)), 4)
        -4.6393
    """
    n = distances.shape[0]
    if n < 2:
        return jnp.zeros((), distances.dtype)
    off = _off_diagonal(n)
    logits = distances / tau
    lse = jax.nn.logsumexp(jnp.where(off, logits, -jnp.inf), axis=1)  # [N]
    per_client = jnp.sum(jnp.where(off, logits, 0.0), axis=1) - (n - 1) * lse
    return jnp.sum(per_client)


def model_distance_loss_grad(distances, tau):
    """Closed form of dL/dD for `model_distance_loss`: (1/tau)(1 - (N-1) s_ij) off the diagonal.

    s_ij = softmax_{k != i}(d_ik / tau)_j. Rows sum to 0. A test reference for autodiff.

    Examples:
        >>> import numpy as np
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> bool(jnp.allclose(model_distance_loss_grad(d, 1.0), jax.grad(model_distance_loss)(d, 1.0), atol=1e-6))
        True
        >>> print(np.asarray(model_distance_loss_grad(d, 1.0)).round(3))  # rows sum to 0: near attracts, far repels
        [[ 0.     0.462 -0.462]
         [ 0.     0.     0.   ]
         [-0.462  0.462  0.   ]]
    """
    n = distances.shape[0]
    if n < 2:
        return jnp.zeros_like(distances)
    off = _off_diagonal(n)
    s = jax.nn.softmax(jnp.where(off, distances / tau, -jnp.inf), axis=1)
    return jnp.where(off, (1.0 - (n - 1) * s) / tau, 0.0)


def scale_free_loss(loss_fn: Callable = model_distance_loss):
    """``D, tau -> loss_fn(D / mean(D), tau)``: invariant to a common scaling of all distances.

    Examples:
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> loss = scale_free_loss()
        >>> round(float(loss(d, 1.0)), 4) == round(float(loss(10.0 * d, 1.0)), 4)
        True
    """

    def loss(distances, tau):
        return loss_fn(distances / mean_distance(distances), tau)

    return loss


def pair_coefficients(distances, tau, loss_fn: Callable = model_distance_loss, scale_free: bool = False):
    """c_ij = dL/dd_ij with d_ij = d_ji one variable: G + G^T, G = grad of ``loss_fn`` w.r.t. D.

    ``scale_free``: differentiate ``loss_fn(D / mean(D))`` instead (through the mean).

    Examples:
        >>> import numpy as np
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> print(np.asarray(pair_coefficients(d, 1.0)).round(3))  # symmetric: dL/dd_ij with d_ij = d_ji
        [[ 0.     0.462 -0.924]
         [ 0.462  0.     0.462]
         [-0.924  0.462  0.   ]]
    """
    if scale_free:
        loss_fn = scale_free_loss(loss_fn)
    g = jax.grad(loss_fn)(distances, tau)
    c = g + g.T
    return jnp.where(_off_diagonal(distances.shape[0]), c, 0.0)


def mixing_matrix(distances, tau, eta, *, loss_fn: Callable = model_distance_loss, rows=None,
                  scale_free: bool = False):
    """Xi [N, N] (or [S, N] for ``rows`` [S]): xi_ij = eta c_ij / d_ij, xi_ii = 1 - sum_{j != i} xi_ij.

    ``distances`` are the (normalised) distances of ALL N models; rows select
    whose mixed model is wanted (the clients of this round). Pairs at
    distance 0 get 0 off the diagonal. Every row sums to 1. ``scale_free``:
    c from ``L(D / mean(D))`` (see `pair_coefficients`).

    Examples:
        >>> import numpy as np
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> xi = mixing_matrix(d, tau=1.0, eta=0.1)
        >>> print(np.asarray(xi).round(3))  # a negative entry repels
        [[ 1.     0.046 -0.046]
         [ 0.046  0.908  0.046]
         [-0.046  0.046  1.   ]]
        >>> print(np.asarray(xi.sum(axis=1)).round(3))
        [1. 1. 1.]
    """
    n = distances.shape[0]
    c = pair_coefficients(distances, tau, loss_fn, scale_free)
    positive = distances > 0
    off = jnp.where(positive, eta * c / jnp.where(positive, distances, 1.0), 0.0)
    off = jnp.where(_off_diagonal(n), off, 0.0)
    xi = off + jnp.diag(1.0 - jnp.sum(off, axis=1))
    if rows is not None:
        xi = xi[rows]
    return xi


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


def mix_models(models, tau, eta, *, normalization: str = "mean", rows=None,
               loss_fn: Callable = model_distance_loss, scale_free: bool = False):
    """DiversiFed's server step in one call: -> (U for ``rows`` (all if None), Xi, D).

    models: [N, P] or a stacked tree of all N stored models; U comes back in
    the same form with S = len(rows) rows; D are the raw (unnormalised) distances.
    ``scale_free``: c from L(D / mean(D)) differentiated through the mean (module docstring).

    Examples:
        >>> import numpy as np
        >>> models = jnp.array([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0]])  # N=3 flattened models
        >>> u, xi, d = mix_models(models, tau=1.0, eta=0.05, rows=jnp.array([0]))
        >>> print(np.asarray(d).round(3))
        [[0.    1.    3.   ]
         [1.    0.    3.162]
         [3.    3.162 0.   ]]
        >>> print(np.asarray(u).round(3))  # client 0's anchor: toward model 1 (near), away from model 2 (far)
        [[ 0.098 -0.043]]
    """
    w = _as_matrix(models)
    d = pairwise_distances(w)
    d_hat, _ = normalize_distances(d, normalization, w.shape[1])
    xi = mixing_matrix(d_hat, tau, eta, loss_fn=loss_fn, rows=rows, scale_free=scale_free)
    return apply_mixing(xi, models), xi, d

