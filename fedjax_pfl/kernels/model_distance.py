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

The relative error of d_ij is about ``eps32 * (|wc_i|^2 + |wc_j|^2) / d_ij^2``;
it is small unless two models are much closer to each other than to the mean
of all models (tight clusters far apart). Pairs closer than the Gram's
rounding noise are reported at distance 0 (see `pairwise_sq_distances`), so
the server step is never amplified by a spuriously tiny distance.

The model-distance loss (``form='distance'``, the paper's)
---------------------------------------------------------
The logits are the Euclidean distances scaled by the temperature tau:

    L(D) = sum_i L_i,  L_i = sum_{j != i} log( exp(d_ij / tau) / sum_{k != i} exp(d_ik / tau) ),
    dL_i/dd_ij = (1 - (N-1) s_ij) / tau,  s_ij = softmax_{k != i}(d_ik / tau)_j.

Descent on L shortens the distances of the models closer to client i than
its softmax average (attraction: the numerator) and lengthens those of the
farther ones (repulsion: the denominator). The server step is one gradient
step on L with respect to every model ("incremental proximal", Lemma 1):
``u_i = w_i - eta_i grad_{w_i} L``. Since ``grad_{w_i} d_ij = (w_i - w_j) / d_ij``,

    u_i = sum_j xi_ij w_j,  xi_ij = eta_i c_ij / d_ij  (j != i),  xi_ii = 1 - sum_{j != i} xi_ij,
    c_ij = dL/dd_ij counting both L_i and L_j,

so a positive xi_ij attracts and a negative one repels; a pair at distance 0
has no direction and weight 0 (identical initial models: Xi = I).

Stabilisation. Taken literally, L is unbounded below: the farthest model's
term falls without limit as it moves away, and xi_ij = eta c_ij / d_ij grows
without bound for close pairs, so the full step overshoots them. The one
change made: each client's step size eta_i is eta, cut where needed so that
sum_{j != i} |xi_ij| <= 1 (`bounded_step_sizes`). The step keeps the
gradient's direction (a shorter descent step on the same L), xi_ii >= 0, and
u_i stays within the span of the distances to the other models. Far pairs
still repel and near ones attract at every step.

The unit distances are read in (``unit``)
-----------------------------------------
The loss and its step see d_ij / s, the distances in a unit s, and the step is
taken in that unit: xi_ij = eta_i c_ij(d / s) / (d_ij / s) (`read_in_unit`):

- ``mean``: s = the mean distance over all pairs of the N stored models, so the
  distances that tau divides have mean 1 in every round, whatever the
  network's size and however far training has moved the models; Xi does not
  change when every model difference is scaled by the same factor;
- ``sqrt_params``: s = sqrt(P) for P parameters (the root-mean-square
  difference per parameter);
- ``raw``: s = 1, parameter units (the distances reach tens to thousands).

Diagnostics of one step (`step_diagnostics`): the entropy of each row's
softmax (log(N-1) for a uniform one, 0 for a hard max), the rows on which the
step bound binds, the share of models whose nearest other model is closer than
1% of the mean distance (a merged cluster), and the mean distance, in units of
the mean, of the pairs the step pulls together and of those it pushes apart.

The kernel variant (``form='kernel'``)
-------------------------------------
Logits tau k_ij with k_ij = exp(-d_ij^2 / sigma), a bounded similarity:

    L(D^2) = sum_i sum_{j != i} log softmax_{l != i}(tau k_il)_j,
    u_i = w_i - eta_i sigma grad_{w_i} L,  xi_ij = 2 eta_i sigma c_ij,  c_ij = dL/d(d_ij^2) (both terms),

with eta_i cut to the step at which xi_ii reaches 0 (`step_sizes`). Every
force is multiplied by k_ij, which goes to 0 for far pairs: a far model is
left alone instead of repelled, so this is not the paper's loss; it is kept
as a named variant only.
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


FORMS = ("distance", "kernel")  # the paper's loss on d_ij / tau; the bounded-similarity variant
UNITS = ("mean", "sqrt_params", "raw")  # the unit distances are read in (module docstring)
MERGED_SHARE = 0.01  # `step_diagnostics`: a model is merged when another lies within this share of the mean distance


def num_parameters(models) -> int:
    """P, the parameters of one model: the columns of W [N, P], or a stacked tree's leaf sizes per row.

    Examples:
        >>> num_parameters(jnp.zeros((3, 7))), num_parameters({"w": jnp.zeros((3, 2, 4)), "b": jnp.zeros((3, 4))})
        (7, 12)
    """
    if hasattr(models, "ndim"):
        return _as_matrix(models).shape[1]
    return sum(a[0].size for a in jax.tree.leaves(models))


def mean_distance(sq_distances):
    """The mean of d_ij over the N (N - 1) ordered pairs of different models (0 for fewer than two).

    Examples:
        >>> round(float(mean_distance(jnp.array([[0.0, 25.0, 1.0], [25.0, 0.0, 18.0], [1.0, 18.0, 0.0]]))), 3)
        3.414
    """
    n = sq_distances.shape[0]
    return jnp.sum(safe_sqrt(sq_distances)) / max(n * (n - 1), 1)


def read_in_unit(sq_distances, unit: str, num_params: int):
    """Squared distances (d_ij / s)^2 in the unit s named by ``unit`` (module docstring): ``mean`` the mean
    distance of the pairs (1 where all models coincide), ``sqrt_params`` sqrt(num_params), ``raw`` 1.

    Examples:
        >>> sq = jnp.array([[0.0, 4.0, 16.0], [4.0, 0.0, 4.0], [16.0, 4.0, 0.0]])  # distances 2, 4 and 2
        >>> [round(float(v), 4) for v in read_in_unit(sq, "mean", num_params=4)[0]]  # mean distance 8/3
        [0.0, 0.5625, 2.25]
        >>> read_in_unit(sq, "sqrt_params", num_params=4)[0].tolist()
        [0.0, 1.0, 4.0]
    """
    if unit == "raw":
        return sq_distances
    if unit == "sqrt_params":
        return sq_distances / num_params
    if unit == "mean":
        s = mean_distance(sq_distances)
        return sq_distances / jnp.where(s > 0, s, 1.0) ** 2
    raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")


def model_distance_loss(distances, tau):
    """L(D) = sum_i sum_{j != i} log softmax_{k != i}(d_ik / tau)_j, D Euclidean (module docstring).

    distances [N, N] (symmetric, zero diagonal; entries are used as
    independent inputs, so dL/dD_ij is the L_i part only). The only place the
    paper's formula lives.

    Examples:
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> round(float(model_distance_loss(d, tau=1.0)), 4)
        -4.6393
    """
    return _sum_of_log_softmax_off_diagonal(distances / tau)


def _sum_of_log_softmax_off_diagonal(logits):
    """sum_i sum_{j != i} log softmax_{k != i}(logits_ik)_j for logits [N, N] (0 for N < 2)."""
    n = logits.shape[0]
    if n < 2:
        return jnp.zeros((), logits.dtype)
    off = _off_diagonal(n)
    lse = jax.nn.logsumexp(jnp.where(off, logits, -jnp.inf), axis=1)  # [N]
    return jnp.sum(jnp.sum(jnp.where(off, logits, 0.0), axis=1) - (n - 1) * lse)


def model_distance_loss_grad(distances, tau):
    """Closed form of dL/dD for `model_distance_loss`: (1 - (N-1) s_ij) / tau off the diagonal.

    s_ij = softmax_{k != i}(d_ik / tau)_j. Positive entries attract (the loss
    grows with that distance), negative ones repel. A test reference for autodiff.

    Examples:
        >>> import numpy as np
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> g = model_distance_loss_grad(d, 1.0)
        >>> bool(jnp.allclose(g, jax.grad(model_distance_loss)(d, 1.0), atol=1e-6))
        True
        >>> print(np.asarray(g).round(3))  # client 0: model 1 (near) attracts, model 2 (far) repels
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


def similarities(sq_distances, sigma):
    """k_ij = exp(-d_ij^2 / sigma): 1 for identical models, toward 0 for models far apart (the kernel variant).

    Examples:
        >>> import numpy as np
        >>> print(np.asarray(similarities(jnp.array([[0.0, 1.0], [1.0, 0.0]]), sigma=2.0)).round(4))
        [[1.     0.6065]
         [0.6065 1.    ]]
    """
    return jnp.exp(-sq_distances / sigma)


def kernel_similarity_loss(sq_distances, tau, sigma):
    """The kernel variant's loss: sum_i sum_{j != i} log softmax_{l != i}(tau k_il)_j, k = exp(-D^2 / sigma).

    Examples:
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> round(float(kernel_similarity_loss(d2, tau=1.0, sigma=1.0)), 4)
        -4.2197
    """
    return _sum_of_log_softmax_off_diagonal(tau * similarities(sq_distances, sigma))


def kernel_similarity_loss_grad(sq_distances, tau, sigma):
    """Closed form of dL/dD^2 for `kernel_similarity_loss`: (tau/sigma) k_ij ((N-1) s_ij - 1) off the diagonal.

    s_ij = softmax_{l != i}(tau k_il)_j. A test reference for autodiff.

    Examples:
        >>> import numpy as np
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> g = kernel_similarity_loss_grad(d2, 1.0, 1.0)
        >>> bool(jnp.allclose(g, jax.grad(kernel_similarity_loss)(d2, 1.0, 1.0), atol=1e-6))
        True
    """
    n = sq_distances.shape[0]
    if n < 2:
        return jnp.zeros_like(sq_distances)
    off = _off_diagonal(n)
    k = similarities(sq_distances, sigma)
    s = jax.nn.softmax(jnp.where(off, tau * k, -jnp.inf), axis=1)
    return jnp.where(off, (tau / sigma) * k * ((n - 1) * s - 1.0), 0.0)


def pair_coefficients(loss_fn: Callable, matrix, *args):
    """c_ij = dL/dm_ij with m_ij = m_ji one variable: G + G^T, G = grad of ``loss_fn(matrix, *args)``.

    Examples:
        >>> import numpy as np
        >>> d = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
        >>> print(np.asarray(pair_coefficients(model_distance_loss, d, 1.0)).round(3))  # symmetric
        [[ 0.     0.462 -0.924]
         [ 0.462  0.     0.462]
         [-0.924  0.462  0.   ]]
    """
    g = jax.grad(loss_fn)(matrix, *args)
    return jnp.where(_off_diagonal(matrix.shape[0]), g + g.T, 0.0)


def step_pulls(sq_distances, tau, *, form: str = "distance", sigma: float = 1.0):
    """Xi's off-diagonal per unit of server step, [N, N]: c_ij / d_ij (``distance``; 0 where d_ij = 0) or
    2 sigma c_ij with c on squared distances (``kernel``).

    Examples:
        >>> import numpy as np
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> print(np.asarray(step_pulls(d2, 1.0)).round(3))
        [[ 0.     0.462 -0.462]
         [ 0.462  0.     0.462]
         [-0.462  0.462  0.   ]]
    """
    if form == "kernel":
        return 2.0 * sigma * pair_coefficients(kernel_similarity_loss, sq_distances, tau, sigma)
    if form != "distance":
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    distances = safe_sqrt(sq_distances)
    c = pair_coefficients(model_distance_loss, distances, tau)
    positive = distances > 0
    return jnp.where(positive, c / jnp.where(positive, distances, 1.0), 0.0)


def mixing_matrix(sq_distances, tau, eta, *, form: str = "distance", sigma: float = 1.0, rows=None):
    """Xi [N, N] (or [S, N] for ``rows`` [S]): xi_ij = eta_i pull_ij (`step_pulls`), xi_ii = 1 - sum_{j != i} xi_ij.

    ``sq_distances`` are the squared distances of ALL N models; rows select
    whose mixed model is wanted (the clients of this round). Every row sums to
    1. eta_i is eta, cut where needed: ``distance`` so that sum_{j != i} |xi_ij|
    <= 1 (`bounded_step_sizes`), ``kernel`` so that xi_ii >= 0 (`step_sizes`).

    Examples:
        >>> import numpy as np
        >>> d2 = jnp.array([[0.0, 1.0, 4.0], [1.0, 0.0, 1.0], [4.0, 1.0, 0.0]])
        >>> print(np.asarray(mixing_matrix(d2, tau=1.0, eta=0.5)).round(3))  # a negative entry repels
        [[ 1.     0.231 -0.231]
         [ 0.231  0.538  0.231]
         [-0.231  0.231  1.   ]]
        >>> print(np.asarray(mixing_matrix(d2, tau=1.0, eta=10.0)).round(3))  # steps cut: sum |xi_ij| = 1
        [[ 1.   0.5 -0.5]
         [ 0.5  0.   0.5]
         [-0.5  0.5  1. ]]
        >>> print(np.asarray(mixing_matrix(d2, tau=1.0, eta=0.5, form="kernel", sigma=1.0)).round(3))
        [[ 0.943  0.064 -0.006]
         [ 0.064  0.873  0.064]
         [-0.006  0.064  0.943]]
    """
    pull = step_pulls(sq_distances, tau, form=form, sigma=sigma)
    off = cut_step_sizes(pull, eta, form)[:, None] * pull
    xi = off + jnp.diag(1.0 - jnp.sum(off, axis=1))
    if rows is not None:
        xi = xi[rows]
    return xi


def cut_step_sizes(pull, eta, form: str = "distance"):
    """Each client's server step size [N]: `bounded_step_sizes` for the distance form, `step_sizes` for the
    kernel form.

    Examples:
        >>> pull = jnp.array([[0.0, 0.5, -0.25], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> cut_step_sizes(pull, 1.0).tolist(), cut_step_sizes(pull, 1.0, "kernel").tolist()
        ([1.0, 0.25, 1.0], [1.0, 0.25, 1.0])
    """
    return bounded_step_sizes(pull, eta) if form == "distance" else step_sizes(pull, eta)


def bounded_step_sizes(pull, eta):
    """Each client's server step size [N] for the distance form: eta, or 1 / sum_{j != i} |pull_ij| where the
    full step would put more than 1 of absolute weight on the other models. ``pull`` [N, N]: Xi's off-diagonal
    per unit of step.

    Examples:
        >>> print(bounded_step_sizes(jnp.array([[0.0, 0.5, -0.25], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), eta=1.0).tolist())
        [1.0, 0.25, 1.0]
    """
    total = jnp.sum(jnp.abs(pull), axis=1)
    return jnp.where(eta * total > 1.0, 1.0 / jnp.where(total > 0, total, 1.0), eta)


def step_sizes(pull, eta):
    """Each client's server step size [N] for the kernel form: eta, or less where the full step would put a
    negative weight on the client's own model, 1 / sum_{j != i} pull_ij (then xi_ii = 0).

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


def mix_models(models, tau, eta, *, form: str = "distance", sigma: float = 1.0, unit: str = "raw", rows=None):
    """DiversiFed's server step in one call: -> (U for ``rows`` (all if None), Xi, D).

    models: [N, P] or a stacked tree of all N stored models; U comes back in
    the same form with S = len(rows) rows; D are the Euclidean distances [N, N]
    in parameter units. ``form`` and ``sigma``: see `mixing_matrix`; ``unit``:
    the unit the step reads the distances in (`read_in_unit`).

    Examples:
        >>> import numpy as np
        >>> models = jnp.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])  # N=3 flattened models
        >>> u, xi, d = mix_models(models, tau=1.0, eta=0.1, rows=jnp.array([0]))
        >>> print(np.asarray(d).round(3))
        [[0.    1.    2.   ]
         [1.    0.    2.236]
         [2.    2.236 0.   ]]
        >>> print(np.asarray(u).round(3))  # client 0's anchor: toward model 1 (near), away from model 2 (far)
        [[ 0.101 -0.034]]
    """
    sq = pairwise_sq_distances(models)
    xi = mixing_matrix(read_in_unit(sq, unit, num_parameters(models)), tau, eta, form=form, sigma=sigma, rows=rows)
    return apply_mixing(xi, models), xi, safe_sqrt(sq)


def sq_distances_in_unit(models, unit: str):
    """The squared distances [N, N] of the N models the server step reads: `pairwise_sq_distances` in the
    unit ``unit`` (`read_in_unit`).

    Examples:
        >>> w = jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])  # distances 5, 1 and sqrt(18)
        >>> [round(float(v), 3) for v in sq_distances_in_unit(w, "raw")[0]]
        [0.0, 25.0, 1.0]
        >>> [round(float(v), 3) for v in sq_distances_in_unit(w, "mean")[0]]  # mean distance 3.414
        [0.0, 2.145, 0.086]
    """
    return read_in_unit(pairwise_sq_distances(models), unit, num_parameters(models))


def loss_logits(sq_distances, tau, form: str = "distance", sigma: float = 1.0):
    """[N, N] logits of each row's softmax in the loss: d_ij / tau (``distance``) or tau k_ij (``kernel``).

    Examples:
        >>> sq = jnp.array([[0.0, 4.0], [4.0, 0.0]])
        >>> loss_logits(sq, 0.5).tolist()
        [[0.0, 4.0], [4.0, 0.0]]
        >>> [[round(float(v), 3) for v in row] for row in loss_logits(sq, 2.0, "kernel", 4.0)]
        [[2.0, 0.736], [0.736, 2.0]]
    """
    if form == "kernel":
        return tau * similarities(sq_distances, sigma)
    if form != "distance":
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    return safe_sqrt(sq_distances) / tau


def row_entropies(logits):
    """Entropy (nats) of each row's softmax over the other columns, [N]: log(N-1) if uniform, 0 for a hard max.

    Examples:
        >>> [round(float(h), 3) for h in row_entropies(jnp.array([[0.0, 1.0, 1.0], [1.0, 0.0, 50.0], [0.0, 0.0, 0.0]]))]
        [0.693, 0.0, 0.693]
    """
    off = _off_diagonal(logits.shape[0])
    log_p = jax.nn.log_softmax(jnp.where(off, logits, -jnp.inf), axis=1)
    return -jnp.sum(jnp.where(off, jnp.exp(log_p) * jnp.where(off, log_p, 0.0), 0.0), axis=1)


def step_diagnostics(sq_distances, xi, tau, eta, *, rows, form: str = "distance", sigma: float = 1.0):
    """How one server step read the models (module docstring), as scalars.

    ``sq_distances`` [N, N]: all N stored models' squared distances in the unit
    the step read them in; ``xi`` [S, N]: the step's rows for the clients ``rows``
    [S]. -> {'softmax_entropy_mean', 'softmax_entropy_min'} of the rows' softmax
    (nats), 'bound_rows' (how many of the S rows had their step cut),
    'merged_fraction' (share of all N models whose nearest other model lies
    within `MERGED_SHARE` of the mean distance), 'pulled_distance' and
    'pushed_distance' (mean distance, in units of the mean distance, of the
    pairs with xi_ij > 0 and with xi_ij < 0; 0 where there are none).

    Examples:
        >>> near, far = 1e-4, 25.0  # squared distances: models 0-2 within 0.01 of each other, model 3 at 5
        >>> sq = jnp.array([[0, near, near, far], [near, 0, near, far], [near, near, 0, far], [far, far, far, 0]])
        >>> rows = jnp.arange(4)
        >>> out = step_diagnostics(sq, mixing_matrix(sq, 1.0, 0.1, rows=rows), 1.0, 0.1, rows=rows)
        >>> for name, value in out.items():  # rows 0-2: a near-hard max, their steps cut, merged
        ...     print(name, round(float(value), 3))
        softmax_entropy_mean 0.335
        softmax_entropy_min 0.081
        bound_rows 3.0
        merged_fraction 0.75
        pulled_distance 0.004
        pushed_distance 1.996
    """
    n = sq_distances.shape[0]
    off = _off_diagonal(n)
    entropy = row_entropies(loss_logits(sq_distances, tau, form, sigma))[rows]
    steps = cut_step_sizes(step_pulls(sq_distances, tau, form=form, sigma=sigma), eta, form)[rows]
    distances = safe_sqrt(sq_distances)
    mean = mean_distance(sq_distances)
    nearest = jnp.min(jnp.where(off, distances, jnp.inf), axis=1)
    relative = distances[rows] / jnp.where(mean > 0, mean, 1.0)
    others = off[rows]

    def mean_where(mask):
        return jnp.sum(jnp.where(mask, relative, 0.0)) / jnp.maximum(jnp.sum(mask), 1)

    return {"softmax_entropy_mean": jnp.mean(entropy), "softmax_entropy_min": jnp.min(entropy),
            "bound_rows": jnp.sum(steps < eta).astype(jnp.float32),
            "merged_fraction": jnp.mean((nearest < MERGED_SHARE * mean).astype(jnp.float32)),
            "pulled_distance": mean_where(others & (xi > 0)), "pushed_distance": mean_where(others & (xi < 0))}


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
