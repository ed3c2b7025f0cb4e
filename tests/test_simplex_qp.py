"""The JAX simplex QP (FedPAC's classifier-combination weights) against exact
float64 references: brute-force enumeration of supports with the KKT system on
each (exact for convex QPs: the optimum is the unique KKT point of its minimal
support), and scipy's SLSQP for larger problems."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize

from fedjax_pfl import aggregation
from fedjax_pfl.kernels import simplex_qp as sq

TOL = 1e-4


# ------------------------------------------------------------ references --
def brute_force(P):
    """Exact min of a^T P a over the simplex (float64): best feasible KKT point over all supports."""
    P = np.asarray(P, np.float64)
    m = P.shape[0]
    best, best_a = np.inf, None
    for r in range(1, m + 1):
        for S in itertools.combinations(range(m), r):
            S = list(S)
            k = len(S)
            K = np.zeros((k + 1, k + 1))
            K[:k, :k] = 2 * P[np.ix_(S, S)]
            K[:k, k] = K[k, :k] = 1.0
            rhs = np.zeros(k + 1)
            rhs[k] = 1.0
            sol = np.linalg.lstsq(K, rhs, rcond=None)[0][:k]
            if np.all(sol >= -1e-10) and abs(sol.sum() - 1) < 1e-8:
                a = np.zeros(m)
                a[S] = np.maximum(sol, 0)
                a /= a.sum()
                f = a @ P @ a
                if f < best:
                    best, best_a = f, a
    return best, best_a


def slsqp(P):
    P = np.asarray(P, np.float64)
    m = P.shape[0]
    cons = ({"type": "eq", "fun": lambda a: a.sum() - 1, "jac": lambda a: np.ones(m)},)
    r = minimize(lambda a: a @ P @ a, np.ones(m) / m, jac=lambda a: 2 * P @ a, bounds=[(0, None)] * m,
                 constraints=cons, method="SLSQP", options={"ftol": 1e-15, "maxiter": 2000})
    return r.fun


def np_project(v, mask=None):
    """Simplex projection by bisection on theta (a different algorithm from the sort-based one)."""
    v = np.asarray(v, np.float64)
    mask = np.ones(v.shape, bool) if mask is None else np.asarray(mask)
    lo, hi = v[mask].min() - 1.0, v[mask].max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.maximum(v[mask] - mid, 0).sum() > 1:
            lo = mid
        else:
            hi = mid
    return np.where(mask, np.maximum(v - 0.5 * (lo + hi), 0), 0)


def np_repair(P, floor=0.01, mode="drop", tol=1e-5):
    P = 0.5 * (P + P.T)
    w, U = np.linalg.eigh(P)
    if w[0] >= -tol * np.abs(w).max():
        return P
    w = np.where(w >= floor, w, 0.0) if mode == "drop" else np.maximum(w, floor)
    return (U * w) @ U.T


def problems(m, rng):
    """Random PSD and degenerate problems of size m: (name, P float64)."""
    out = []
    R = rng.normal(size=(m, m))
    out.append(("psd", R @ R.T))
    R = rng.normal(size=(2, m))
    out.append(("rank2", R.T @ R))
    v = rng.normal(size=m)
    out.append(("rank1_mixed_signs", np.outer(v, v)))
    v = rng.uniform(0.5, 2.0, size=m)
    out.append(("rank1_positive", np.outer(v, v)))
    R = rng.normal(size=(m, m))
    R[:, 1] = R[:, 0]
    R[:, -1] = R[:, -2]
    out.append(("duplicate_clients", R.T @ R))
    out.append(("zero", np.zeros((m, m))))
    R = rng.normal(size=(3, m)) + 2
    out.append(("rank3_plus_tiny_diag", R.T @ R + np.diag(rng.uniform(0, 1e-2, m))))
    h = rng.normal(size=(m, 6))
    d = h[0] - h
    out.append(("fedpac_shape", np.diag(rng.uniform(0, 0.1, m)) + d @ d.T))
    out.append(("scaled_up", 50.0 * (R.T @ R)))
    return out


# Jitted once per problem size (eager calls would compile the loop body each time).
_SOLVE = jax.jit(sq.solve_simplex_qp)
_WEIGHTS = jax.jit(sq.combination_weights, static_argnames=("repair", "num_iters"))
_REPAIR = jax.jit(sq.repair_psd, static_argnames="repair")
_PROJECT = jax.jit(sq.project_simplex)


def _solve(P):
    return np.asarray(_SOLVE(jnp.asarray(P, jnp.float32)), np.float64)


def _on_simplex(a, atol=1e-5):
    assert np.all(a >= 0)
    assert abs(a.sum() - 1) < atol


# ------------------------------------------------------------------ tests --
@pytest.mark.parametrize("m", [2, 5, 7])
def test_projection_matches_bisection(m):
    rng = np.random.default_rng(m)
    for scale in (0.1, 1.0, 10.0):
        v = rng.normal(size=m) * scale
        mask = rng.uniform(size=m) < 0.7
        mask[0] = True
        got = np.asarray(_PROJECT(jnp.asarray(v, jnp.float32)))
        np.testing.assert_allclose(got, np_project(v), atol=2e-6)
        got = np.asarray(_PROJECT(jnp.asarray(v, jnp.float32), jnp.asarray(mask)))
        np.testing.assert_allclose(got, np_project(v, mask), atol=2e-6)
        assert np.all(got[~mask] == 0)


@pytest.mark.parametrize("m", [3, 5, 7])
def test_solver_matches_brute_force_on_psd_and_degenerate_problems(m):
    rng = np.random.default_rng(100 + m)
    for name, P in problems(m, rng):
        f_ref, _ = brute_force(P)
        a = _solve(P)
        _on_simplex(a)
        assert a @ P @ a - f_ref <= TOL * max(1.0, np.abs(P).max() / 10), (name, a @ P @ a, f_ref)


def test_solver_matches_slsqp_on_twenty_clients():
    rng = np.random.default_rng(7)
    for k in range(4):
        m = 20
        R = rng.normal(size=(m, 2 + 3 * k))
        P = R @ R.T + np.diag(rng.uniform(0, 1e-3, m))
        a = _solve(P)
        _on_simplex(a)
        assert a @ P @ a <= slsqp(P) + TOL


def test_near_psd_problems_are_repaired_then_solved_exactly():
    rng = np.random.default_rng(3)
    for m in (4, 6):
        for mode in sq.REPAIRS:
            U, _ = np.linalg.qr(rng.normal(size=(m, m)))
            w = np.concatenate([[-2e-3, -1e-4, 0.0, 0.004], rng.uniform(0.5, 3.0, m - 4)])
            P = (U * w) @ U.T  # near-PSD: small negative eigenvalues, some below the floor
            ref = np_repair(P, 0.01, mode)
            got, repaired = _REPAIR(jnp.asarray(P, jnp.float32), floor=0.01, repair=mode)
            assert bool(repaired)
            np.testing.assert_allclose(np.asarray(got), ref, atol=1e-5)
            f_ref, _ = brute_force(ref)
            a = _solve(np.asarray(got))
            _on_simplex(a)
            assert a @ ref @ a - f_ref <= TOL


def test_psd_input_is_left_alone_by_the_repair():
    rng = np.random.default_rng(4)
    R = rng.normal(size=(5, 2))
    P = R @ R.T  # PSD, singular: eigenvalues ~0 may round slightly negative
    got, repaired = _REPAIR(jnp.asarray(P, jnp.float32))
    assert not bool(repaired)
    np.testing.assert_allclose(np.asarray(got), P, rtol=1e-6, atol=1e-6)


def test_combination_weights_truncate_renormalise_and_mask():
    rng = np.random.default_rng(5)
    m = 6
    # Optimum with one tiny weight: clients 0..4 near each other, 5 far and noisy.
    h = rng.normal(size=(m, 4)) * 0.1
    d = h[0] - h
    V = np.full(m, 0.05)
    P = np.diag(V) + d @ d.T
    mask = np.array([1, 1, 0, 1, 1, 1], bool)
    a = np.asarray(_WEIGHTS(jnp.asarray(P, jnp.float32), 0, jnp.asarray(mask)))
    _on_simplex(a)
    assert a[2] == 0  # masked out
    assert np.all((a == 0) | (a > 1e-3))
    # Reference: exact solution of the restricted problem, truncated and renormalised.
    keep = np.flatnonzero(mask)
    _, a_sub = brute_force(P[np.ix_(keep, keep)])
    ref = np.zeros(m)
    ref[keep] = a_sub
    ref = np.where(ref > 1e-3, ref, 0)
    ref /= ref.sum()
    sub = P[np.ix_(keep, keep)]
    assert a[keep] @ sub @ a[keep] <= ref[keep] @ sub @ ref[keep] + TOL


def test_truncation_zeroes_small_weights():
    # Two identical clients and a third that is slightly worse: a tiny weight on it
    # appears only through rounding; a large min_weight must zero it.
    P = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 30.0]])
    a = np.asarray(_WEIGHTS(jnp.asarray(P, jnp.float32), 0, min_weight=0.1))
    np.testing.assert_allclose(a, [0.5, 0.5, 0.0], atol=1e-4)
    exact = np.array([30, 30, 1.0]) / 61  # unconstrained optimum (all positive)
    a = np.asarray(_WEIGHTS(jnp.asarray(P, jnp.float32), 0, min_weight=0.0))
    np.testing.assert_allclose(a, exact, atol=1e-4)
    a = np.asarray(_WEIGHTS(jnp.asarray(P, jnp.float32), 0, min_weight=0.02))
    np.testing.assert_allclose(a, [0.5, 0.5, 0.0], atol=1e-4)  # 1/61 < 0.02 is dropped


def test_fallback_to_own_head():
    P = np.eye(4, dtype=np.float32)
    bad = P.copy()
    bad[1, 2] = np.nan
    a = np.asarray(_WEIGHTS(jnp.asarray(bad), 2))
    np.testing.assert_array_equal(a, [0, 0, 1, 0])
    a = np.asarray(_WEIGHTS(jnp.asarray(P), 1, jnp.array([1, 0, 1, 1], bool)))
    np.testing.assert_array_equal(a, [0, 1, 0, 0])  # own upload missing
    a = np.asarray(_WEIGHTS(jnp.asarray(np.full((4, 4), np.inf, np.float32)), 3))
    np.testing.assert_array_equal(a, [0, 0, 0, 1])


def test_batch_equals_single_problems_and_is_reexported():
    rng = np.random.default_rng(6)
    S = 5
    Ps = []
    for _ in range(S):
        R = rng.normal(size=(S, 3))
        Ps.append(R @ R.T)
    Ps = jnp.asarray(np.stack(Ps), jnp.float32)
    mask = jnp.array([1, 1, 1, 0, 1], bool)
    batch = np.asarray(jax.jit(aggregation.combination_weights_batch)(Ps, mask))
    for s in range(S):
        single = np.asarray(_WEIGHTS(Ps[s], s, mask))
        np.testing.assert_allclose(batch[s], single, atol=1e-6)
    np.testing.assert_array_equal(batch[3], np.eye(S)[3])
    solved = np.asarray(jax.jit(aggregation.solve_simplex_qp_batch)(Ps))
    for s in range(S):
        _on_simplex(solved[s])


def test_float64_inputs_are_solved_in_float64():
    rng = np.random.default_rng(8)
    R = rng.normal(size=(6, 6))
    P = R @ R.T
    with jax.enable_x64(True):
        a = jax.jit(sq.solve_simplex_qp, static_argnames="num_iters")(jnp.asarray(P, jnp.float64), num_iters=3000)
        assert a.dtype == jnp.float64
        a = np.asarray(a)
    f_ref, _ = brute_force(P)
    assert a @ P @ a - f_ref <= 1e-8
