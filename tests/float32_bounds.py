"""How far a float32 result may lie from the exact one: bounds argued from the computation.

A float32 comparison between two paths of one computation (a jitted method
and an eager kernel, a tree and a flat matrix, batches of two sizes) holds on
one CPU only when its tolerance is a guess: another vector unit sums in
another order. So each float32 result is compared with the exact (float64)
value, within a bound of the float32 rounding its computation can make:
Higham's gamma_k = k eps / (1 - k eps) for k accumulated roundings, times the
sum of the magnitudes accumulated (`sum_bound`, `matmul_bound`).

DiversiFed's server step (`exact_mixing`):

`kernels/model_distance.mix_models` computes the squared distances from one
Gram matmul of the centered models (sq_ij = g_ii + g_jj - 2 g_ij), turns them
into the mixing matrix Xi (softmax over d / tau, step sizes), and mixes
U = Xi @ W with a second matmul. In float32 each of the P-term dot products of
the Gram is off by at most gamma_P sum_k |w_ik w_jk| <= gamma_P sqrt(g_ii g_jj)
(Higham's gamma_k = k eps / (1 - k eps); the centering adds N terms), so

    |dsq_ij| <= 2 gamma_{P+N} (g_ii + g_jj),

which is large against sq_ij itself for near models (the subtraction cancels).
To first order that error reaches Xi and U through their derivatives in sq,
taken here exactly in float64 (jax.jacfwd), and the mixing matmul adds
gamma_{N+2} (|Xi| |Wc| + |rowsum Xi| |mean|); one last rounding adds eps |U|.
Two float32 paths (a jitted method and an eager kernel call, or two CPUs
with different vector units) each lie within the bound of the float64
result, so each is compared with the float64 result, never with the other
at a fixed tolerance (that holds on one CPU only).
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import model_distance as md

EPS32 = float(np.finfo(np.float32).eps)


def gamma(k: int) -> float:
    """Higham's gamma_k for float32: the relative error bound of k accumulated roundings."""
    return k * EPS32 / (1.0 - k * EPS32)


def sum_bound(terms, axis=None):
    """Error bound of a float32 sum of ``terms`` (any order): gamma_n times the sum of their magnitudes."""
    terms = np.asarray(terms, np.float64)
    n = terms.size if axis is None else terms.shape[axis]
    return gamma(n) * np.sum(np.abs(terms), axis=axis)


def matmul_bound(a, b):
    """Error bound of a float32 ``a @ b`` (K-term dot products in any order): gamma_K |a| @ |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return gamma(a.shape[-1]) * (np.abs(a) @ np.abs(b))


def exact_sq_distances(models):
    """(squared distances [N, N] in float64, their float32 bound) of the stacked ``models`` (module docstring)."""
    with jax.enable_x64(True):
        w = jnp.asarray(np.asarray(tree_ops.flatten_stacked(models)), jnp.float64)
        wc, _ = md.center_models(w)
        g = np.diagonal(np.asarray(wc @ wc.T))
        sq = np.asarray(md.pairwise_sq_distances(w))
    n, p = w.shape
    return sq, 2 * gamma(p + n) * (g[:, None] + g[None, :])


def exact_mixing(models, tau, eta, rows, **form):
    """(U, Xi, bound on |U32 - U|, bound on |Xi32 - Xi|) in float64 NumPy for the stacked float32 ``models``:
    U [S, P] flattened as `tree_ops.flatten_stacked` lays a tree out, Xi [S, N] (module docstring)."""
    with jax.enable_x64(True):
        w = jnp.asarray(np.asarray(tree_ops.flatten_stacked(models)), jnp.float64)
        n, p = w.shape
        wc, mean = md.center_models(w)
        sq = md.pairwise_sq_distances(w)

        def xi_of(sq):
            return md.mixing_matrix(sq, tau, eta, rows=rows, **form)

        def u_of(sq):
            return md.apply_mixing(xi_of(sq), w)

        xi, u = np.asarray(xi_of(sq)), np.asarray(u_of(sq))
        _, dsq = exact_sq_distances(models)
        through_sq_u = np.einsum("spij,ij->sp", np.abs(np.asarray(jax.jacfwd(u_of)(sq))), dsq)
        through_sq_xi = np.einsum("snij,ij->sn", np.abs(np.asarray(jax.jacfwd(xi_of)(sq))), dsq)
        matmul = gamma(n + 2) * (np.abs(xi) @ np.abs(np.asarray(wc))
                                 + np.abs(xi.sum(1, keepdims=True)) * np.abs(np.asarray(mean))[None, :])
    return u, xi, through_sq_u + matmul + EPS32 * np.abs(u), through_sq_xi + gamma(n + 4) * np.abs(xi)


def assert_within(got, exact, bound, what: str):
    """|got - exact| <= bound everywhere (float64 comparison), naming the worst element otherwise."""
    got = np.asarray(got, np.float64).reshape(exact.shape)
    excess = np.abs(got - exact) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (f"{what}: |float32 - float64| = {abs(got[worst] - exact[worst]):.3g} at {worst} "
                                f"passes the float32 bound {bound[worst]:.3g}")
