"""Convex quadratic programs over the probability simplex, in JAX (FedPAC's server step).

    minimize  a^T P a   subject to  a >= 0,  sum(a) = 1,  a_j = 0 where mask_j is False

FedPAC (Xu et al., ICLR 2023) solves one such problem per selected client to
find the weights with which that client combines the uploaded classifier heads.
The authors call cvxpy in a Python loop over clients; here every function is a
pure, jit-able JAX function for ONE problem, and the ``*_batch`` forms map it
over a leading axis of problems with `jax.lax.map` inside the program (no
Python loop over clients). Not `jax.vmap`: vmapped, the eigendecompositions
become one batched LAPACK call, and on a CPU split into several host devices
(runs/host_devices.py) the FedPAC round holding it hung for good after the
devices' vmapped client updates (FMNIST preset, 16+ clients, jax 0.10.2: no
thread busy, both devices waiting; tests/test_sharding.py). One problem at a
time costs about what the batched form does at the sizes FedPAC meets
(benchmarks/RESULTS.md, "FedPAC's simplex QPs").

Algorithm (`solve_simplex_qp`): accelerated projected gradient (FISTA) with
the exact sort-based Euclidean projection onto the simplex (`project_simplex`),
a fixed iteration count and step 1/L where L = 2 * lambda_max(P) (P is first
divided by lambda_max, so the step is 1/2 whatever the scale of P), gradient-
based momentum restart (O'Donoghue & Candes 2015) and the best iterate kept.
A final "polish" solves the KKT system of the equality-constrained problem on
the support that FISTA found (least squares, so singular P is fine) and keeps
that point when it is feasible and no worse. On degenerate problems (duplicate
rows, rank-1, zero matrices) this reaches the exact optimum within 1e-4 in
objective (tests/test_simplex_qp.py checks it against brute-force enumeration
of supports in float64).

FedPAC's full rule (`combination_weights`): symmetrise; if P is not PSD,
rebuild it from its eigenpairs with eigenvalue >= ``floor`` (the authors'
code; ``repair='clip'`` instead raises small eigenvalues to ``floor``); solve;
zero weights <= ``min_weight`` and renormalise; if anything is non-finite, or
the client itself is masked out, return the one-hot weight of the client's own
index (the authors' fallback: keep the local head).

Two deliberate differences from the authors' NumPy checks: "not PSD" allows
float32 rounding (smallest eigenvalue below -1e-5 times the largest magnitude,
where the authors test eigenvalues >= 0 exactly), and a repaired matrix is
solved as it is (the authors re-test it with the exact check, which rounding
of the dropped eigenvalues can fail, and then keep the local head).

This module holds no method logic and no loops over clients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

REPAIRS = ("drop", "clip")
_HI = jax.lax.Precision.HIGHEST  # no TF32/bf16 passes on accelerators: the QP needs float32


def _full_mask(m, mask):
    return jnp.ones((m,), bool) if mask is None else jnp.asarray(mask, bool)


def project_simplex(v, mask=None):
    """Euclidean projection of ``v`` [m] onto {a >= 0, sum a = 1, a_j = 0 off ``mask``}.

    The exact sort-based algorithm (Held et al. 1974; Duchi et al. 2008):
    theta = (sum of the rho largest - 1) / rho, a = max(v - theta, 0). With an
    all-False mask the result is all zeros.

    Examples:
        >>> import numpy as np
        >>> print(np.asarray(project_simplex(jnp.array([0.5, 1.0, -1.0]))).round(3))
        [0.25 0.75 0.  ]
        >>> print(np.asarray(project_simplex(jnp.array([0.5, 1.0, 2.0]), mask=jnp.array([True, True, False]))).round(3))
        [0.25 0.75 0.  ]
    """
    v = jnp.asarray(v)
    m = v.shape[-1]
    mask = _full_mask(m, mask)
    key = jnp.where(mask, v, -jnp.inf)
    order = jnp.argsort(-key)  # valid entries first, descending
    sorted_mask = mask[order]
    u = jnp.where(sorted_mask, v[order], 0.0)
    cs = jnp.cumsum(u)
    j = jnp.arange(1, m + 1, dtype=v.dtype)
    cond = sorted_mask & (u - (cs - 1.0) / j > 0)
    rho = jnp.maximum(jnp.max(jnp.where(cond, jnp.arange(1, m + 1), 0)), 1)
    theta = (cs[rho - 1] - 1.0) / rho.astype(v.dtype)
    return jnp.where(mask, jnp.maximum(v - theta, 0.0), 0.0)


def quadratic_objective(P, a):
    """a^T P a (the FedPAC objective).

    Examples:
        >>> round(float(quadratic_objective(jnp.array([[2.0, 0.0], [0.0, 1.0]]), jnp.array([0.5, 0.5]))), 4)
        0.75
    """
    return jnp.dot(a, jnp.dot(P, a, precision=_HI), precision=_HI)


def _masked(P, mask):
    both = mask[:, None] & mask[None, :]
    return jnp.where(both, P, 0.0)


def _polish(P, a, mask, rel_tol):
    """KKT point of min a^T P a s.t. sum a = 1 on the support of ``a`` (least squares)."""
    m = P.shape[0]
    support = mask & (a > 0)
    both = support[:, None] & support[None, :]
    eye = jnp.eye(m, dtype=P.dtype)
    top = jnp.where(both, 2.0 * P, jnp.where(support[:, None], 0.0, eye))
    ones = support.astype(P.dtype)
    kkt = jnp.block([[top, ones[:, None]], [ones[None, :], jnp.zeros((1, 1), P.dtype)]])
    rhs = jnp.concatenate([jnp.zeros((m,), P.dtype), jnp.ones((1,), P.dtype)])
    # Least-squares solution of the symmetric (indefinite) KKT system by its eigenpairs.
    w, U = jnp.linalg.eigh(kkt)
    cutoff = rel_tol * jnp.max(jnp.abs(w))
    inv = jnp.where(jnp.abs(w) > cutoff, 1.0 / jnp.where(jnp.abs(w) > cutoff, w, 1.0), 0.0)
    sol = jnp.dot(U, inv * jnp.dot(U.T, rhs, precision=_HI), precision=_HI)
    cand = jnp.where(support, sol[:m], 0.0)
    feasible = jnp.all(cand >= -1e-6) & jnp.all(jnp.isfinite(cand))
    cand = jnp.maximum(cand, 0.0)
    cand = cand / jnp.maximum(jnp.sum(cand), 1e-30)
    better = quadratic_objective(P, cand) <= quadratic_objective(P, a)
    return jnp.where(feasible & better, cand, a)


def solve_simplex_qp(P, mask=None, *, num_iters: int = 1000, polish: bool = True, lambda_max=None):
    """argmin of a^T P a over the simplex restricted to ``mask``; P [m, m] symmetric PSD.

    Returns a [m] (zeros off the mask; all zeros if the mask is empty). ``lambda_max``
    (the largest eigenvalue of the masked P) is computed when not given.
    Non-PSD input is not an error but the result is then only a stationary point:
    repair P first (`repair_psd`).

    Examples:
        >>> import numpy as np
        >>> P = jnp.array([[2.0, 0.0], [0.0, 1.0]])  # min 2 a_0^2 + a_1^2 on the simplex: a = (1/3, 2/3)
        >>> print(np.asarray(solve_simplex_qp(P)).round(3))
        [0.333 0.667]
    """
    P = jnp.asarray(P)
    if not jnp.issubdtype(P.dtype, jnp.floating):
        P = P.astype(jnp.float32)
    m = P.shape[-1]
    mask = _full_mask(m, mask)
    P = _masked(0.5 * (P + P.T), mask)
    if lambda_max is None:
        lambda_max = jnp.linalg.eigvalsh(P)[-1]
    finite_scale = jnp.isfinite(lambda_max) & (lambda_max > 0)
    scale = jnp.where(finite_scale, lambda_max, 1.0)
    Q = P / scale  # lambda_max(Q) = 1 (or Q = 0)
    step = 0.5  # 1 / L with L = 2 * lambda_max(Q)
    x0 = mask.astype(P.dtype) / jnp.maximum(jnp.sum(mask), 1)

    def body(_, state):
        x, y, t, best, best_f = state
        x_new = project_simplex(y - step * 2.0 * jnp.dot(Q, y, precision=_HI), mask)
        restart = jnp.vdot(y - x_new, x_new - x) > 0
        t_new = jnp.where(restart, 1.0, 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * t * t)))
        beta = jnp.where(restart, 0.0, (t - 1.0) / t_new)
        y_new = x_new + beta * (x_new - x)
        f = quadratic_objective(Q, x_new)
        improved = f < best_f
        return x_new, y_new, t_new, jnp.where(improved, x_new, best), jnp.where(improved, f, best_f)

    one = jnp.ones((), P.dtype)
    init = (x0, x0, one, x0, quadratic_objective(Q, x0))
    _, _, _, best, _ = jax.lax.fori_loop(0, num_iters, body, init)
    if polish:
        best = _polish(Q, best, mask, rel_tol=100 * m * jnp.finfo(P.dtype).eps)
    return best


def repair_psd(P, floor: float = 0.01, repair: str = "drop", tol: float = 1e-5):
    """FedPAC's PSD repair: (P', was_repaired).

    P is symmetrised. If its smallest eigenvalue is below ``-tol * max|eigenvalue|``
    (not PSD beyond rounding), P' is rebuilt from its eigenpairs: ``'drop'`` keeps
    only eigenvalues >= ``floor`` (the authors' code), ``'clip'`` raises every
    eigenvalue to at least ``floor``. Otherwise P' = P.

    Examples:
        >>> import numpy as np
        >>> P = jnp.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1: not PSD
        >>> repaired, was_repaired = repair_psd(P)
        >>> bool(was_repaired)
        True
        >>> print(np.asarray(repaired).round(3))  # the negative eigenpair is dropped
        [[1.5 1.5]
         [1.5 1.5]]
    """
    if repair not in REPAIRS:
        raise ValueError(f"repair must be one of {REPAIRS}, got {repair!r}")
    P = jnp.asarray(P)
    P = 0.5 * (P + P.T)
    w, U = jnp.linalg.eigh(P)
    size = jnp.max(jnp.abs(w))
    not_psd = w[0] < -tol * size
    w_new = jnp.where(w >= floor, w, 0.0) if repair == "drop" else jnp.maximum(w, floor)
    rebuilt = jnp.matmul(U * w_new[None, :], U.T, precision=_HI)
    rebuilt = 0.5 * (rebuilt + rebuilt.T)
    return jnp.where(not_psd, rebuilt, P), not_psd


def combination_weights(P, own, mask=None, *, floor: float = 0.01, repair: str = "drop",
                        min_weight: float = 1e-3, num_iters: int = 1000, tol: float = 1e-5):
    """FedPAC's classifier-combination weights of one client: a [m] on the simplex.

    ``P`` [m, m] (diag(V) + D for client ``own``), ``mask`` [m] the clients whose
    uploads arrived. Steps: restrict to the mask, `repair_psd`, `solve_simplex_qp`,
    zero weights <= ``min_weight``, renormalise. Falls back to one_hot(own) when the
    result is not finite or ``own`` is masked out.

    Examples:
        >>> import numpy as np
        >>> P = jnp.array([[0.1, 0.0, 0.0], [0.0, 0.1, 0.0], [0.0, 0.0, 5.0]])  # client 2's head is far from client 0's
        >>> print(np.asarray(combination_weights(P, own=0)).round(3))
        [0.495 0.495 0.01 ]
        >>> print(np.asarray(combination_weights(P, own=0, mask=jnp.array([True, False, True]))).round(3))
        [0.98 0.   0.02]
    """
    P = jnp.asarray(P)
    m = P.shape[-1]
    mask = _full_mask(m, mask)
    Pm = _masked(P, mask)
    finite_in = jnp.all(jnp.isfinite(Pm))
    Pm = jnp.where(finite_in, Pm, 0.0)  # keep eigh away from NaN; the fallback decides
    Pr, _ = repair_psd(Pm, floor, repair, tol)
    a = solve_simplex_qp(_masked(Pr, mask), mask, num_iters=num_iters)
    a = jnp.where(a > min_weight, a, 0.0)
    total = jnp.sum(a)
    a = a / jnp.where(total > 0, total, 1.0)
    ok = finite_in & jnp.all(jnp.isfinite(a)) & (total > 0) & mask[own]
    return jnp.where(ok, a, jax.nn.one_hot(own, m, dtype=a.dtype))


def solve_simplex_qp_batch(P, mask=None, *, num_iters: int = 1000, polish: bool = True):
    """`solve_simplex_qp` over a leading axis (`jax.lax.map`): P [S, m, m] -> [S, m]; mask [m] or [S, m].

    Examples:
        >>> import numpy as np
        >>> P = jnp.stack([jnp.diag(jnp.array([2.0, 1.0])), jnp.diag(jnp.array([1.0, 1.0]))])  # S=2 problems
        >>> print(np.asarray(solve_simplex_qp_batch(P)).round(3))
        [[0.333 0.667]
         [0.5   0.5  ]]
    """
    P = jnp.asarray(P)
    S, m = P.shape[0], P.shape[-1]
    mask = jnp.broadcast_to(_full_mask(m, mask), (S, m))
    return jax.lax.map(lambda pk: solve_simplex_qp(*pk, num_iters=num_iters, polish=polish), (P, mask))


def combination_weights_batch(P, mask=None, own=None, **kwargs):
    """`combination_weights` over a leading axis (`jax.lax.map`): P [S, m, m] -> A [S, m]; row s combines for
    client own[s].

    ``own`` defaults to arange(S) (problem s belongs to client s, S == m).
    ``mask`` [m] (shared) or [S, m]. Keyword options as `combination_weights`.

    Examples:
        >>> import numpy as np
        >>> P = jnp.stack([jnp.diag(jnp.array([1.0, 1.0])), jnp.diag(jnp.array([1.0, 3.0]))])  # one P per client
        >>> print(np.asarray(combination_weights_batch(P)).round(3))
        [[0.5  0.5 ]
         [0.75 0.25]]
    """
    P = jnp.asarray(P)
    S, m = P.shape[0], P.shape[-1]
    own = jnp.arange(S) if own is None else jnp.asarray(own)
    mask = jnp.broadcast_to(_full_mask(m, mask), (S, m))
    return jax.lax.map(lambda pok: combination_weights(*pok, **kwargs), (P, own, mask))
