"""DiversiFed's kernel (fedjax_pfl/kernels/model_distance.py) against float64 pairwise loops.

References are NumPy float64 double loops over pairs, computed from the same
float32 inputs the kernel sees; gradients are checked against central finite
differences and autodiff in float64 (``jax.enable_x64(True)`` as a context only).
The paper's form (``form='distance'``, the default) first, then the kernel variant.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as f32

from fedjax_pfl import aggregation, losses
from fedjax_pfl.kernels import model_distance as md

REL = 1e-5

# Eager dispatch compiles every primitive separately (slow on busy CPUs): jit once.
mix_models = jax.jit(md.mix_models, static_argnames=("form", "unit"))
pairwise_distances = jax.jit(md.pairwise_distances)
mixing_matrix = jax.jit(md.mixing_matrix, static_argnames=("form",))


def kernel_mix_models(w, tau, eta, sigma, rows=None):
    return mix_models(w, tau, eta, form="kernel", sigma=sigma, rows=rows)


def kernel_mixing_matrix(sq, tau, eta, sigma, rows=None):
    return mixing_matrix(sq, tau, eta, form="kernel", sigma=sigma, rows=rows)


# ---------------------------------------------------------------- references
def distances_loop64(w):
    w = np.asarray(w, np.float64)
    n = w.shape[0]
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j:
                d[i, j] = np.sqrt(np.sum((w[i] - w[j]) ** 2))
    return d


def mixing_loop64(d, tau, eta, sigma):
    """Xi from the module docstring written out pair by pair (closed form of dL/d(d^2)), d Euclidean."""
    n = d.shape[0]
    k = np.exp(-d ** 2 / sigma)
    s = np.zeros((n, n))
    for i in range(n):
        others = [l for l in range(n) if l != i]
        z = np.array([tau * k[i, l] for l in others])
        e = np.exp(z - z.max())
        s[i, others] = e / e.sum()
    xi = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if j != i:
                c = tau * (k[i, j] * ((n - 1) * s[i, j] - 1) + k[j, i] * ((n - 1) * s[j, i] - 1))
                xi[i, j] = 2 * eta * c
        net = sum(xi[i, j] for j in range(n) if j != i)
        if net > 1:  # the step is cut where it would weigh the client's own model negatively
            xi[i] /= net
        xi[i, i] = 1.0 - sum(xi[i, j] for j in range(n) if j != i)
    return xi


def mix_loop64(xi, w):
    w = np.asarray(w, np.float64)
    u = np.zeros((xi.shape[0], w.shape[1]))
    for i in range(xi.shape[0]):
        for j in range(w.shape[0]):
            u[i] += xi[i, j] * w[j]
    return u


def off_diag_rel_err(d, ref):
    off = ~np.eye(ref.shape[0], dtype=bool)
    return float(np.max(np.abs(np.asarray(d, np.float64) - ref)[off] / ref[off]))


def random_models(n, p, seed=0):
    return np.random.default_rng(seed).normal(size=(n, p)).astype(np.float32)


def near_identical_models(n, p, spread=1e-4, seed=0):
    """All models = one shared model (norm ~ sqrt(p)) + a tiny per-client difference."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=p) + 3.0
    return (base + spread * rng.normal(size=(n, p))).astype(np.float32)


def two_groups(n_per_group, p, spread=0.3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(2, p))
    w = np.repeat(centers, n_per_group, axis=0) + spread * rng.normal(size=(2 * n_per_group, p))
    return w.astype(np.float32)


# ------------------------------------------------------------------ distances
@pytest.mark.parametrize("n,p", [(2, 500), (10, 3000), (40, 2000), (100, 1500)])
def test_distances_match_float64_loop(n, p):
    w = random_models(n, p, seed=n)
    d = np.asarray(pairwise_distances(jnp.asarray(w)))
    ref = distances_loop64(w)
    assert off_diag_rel_err(d, ref) < REL
    assert np.all(np.diag(d) == 0.0)
    np.testing.assert_array_equal(d, d.T)
    assert d.dtype == np.float32


@pytest.mark.parametrize("n,spread", [(10, 1e-3), (100, 1e-4), (50, 1e-6)])
def test_distances_nearly_identical_models(n, spread):
    w = near_identical_models(n, 2000, spread, seed=n)
    ref = distances_loop64(w)
    assert off_diag_rel_err(pairwise_distances(jnp.asarray(w)), ref) < REL
    # The test can fail: the textbook uncentered Gram in float32 is wrong here.
    wj = jnp.asarray(w)
    g = wj @ wj.T
    sq = jnp.diag(g)[:, None] + jnp.diag(g)[None, :] - 2 * g
    naive = np.sqrt(np.maximum(np.asarray(sq, np.float64), 0.0))
    assert off_diag_rel_err(naive, ref) > 1e-2


def test_identical_models_give_zero_distance_and_identity_mixing():
    w = jnp.broadcast_to(jnp.arange(30.0), (5, 30))
    sq = md.pairwise_sq_distances(w)
    assert np.all(np.asarray(pairwise_distances(w)) == 0.0)
    g = jax.jit(jax.grad(lambda w: md.model_distance_loss(md.pairwise_distances(w), 0.5)))(w)
    assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_array_equal(np.asarray(mixing_matrix(sq, 0.5, 0.1)), np.eye(5))
    np.testing.assert_array_equal(np.asarray(kernel_mixing_matrix(sq, 0.5, 0.1, 1.0)), np.eye(5))


def test_clustered_models_within_documented_error_model():
    """Tight clusters far apart: error ~ eps32 (|wc_i|^2 + |wc_j|^2) / d_ij^2 (module docstring)."""
    w = two_groups(10, 20000, spread=0.02, seed=3)
    ref = distances_loop64(w)
    d = np.asarray(pairwise_distances(jnp.asarray(w)), np.float64)
    wc = w.astype(np.float64) - w.astype(np.float64).mean(0)
    g = np.sum(wc * wc, axis=1)
    bound = 64 * np.finfo(np.float32).eps * (g[:, None] + g[None, :]) / np.maximum(ref, 1e-30) ** 2
    off = ~np.eye(20, dtype=bool)
    assert np.all(np.abs(d - ref)[off] / ref[off] <= bound[off])
    assert off_diag_rel_err(d, ref) < 1e-3


def test_pairs_below_resolution_are_zero():
    w = random_models(4, 1000)
    w[1] = w[0]
    w[2] = w[0] + np.float32(1e-7) * np.random.default_rng(1).normal(size=1000).astype(np.float32) * 1e-3
    d = np.asarray(pairwise_distances(jnp.asarray(w)))
    assert d[0, 1] == 0.0 and d[1, 0] == 0.0
    assert d[0, 2] == 0.0
    assert d[0, 3] > 0.0


def test_stacked_tree_equals_flat_matrix():
    rng = np.random.default_rng(0)
    tree = {"body": {"kernel": jnp.asarray(rng.normal(size=(6, 5, 4)), jnp.float32)},
            "head": {"bias": jnp.asarray(rng.normal(size=(6, 3)), jnp.float32)}}
    flat = np.concatenate([np.asarray(tree["body"]["kernel"]).reshape(6, -1), np.asarray(tree["head"]["bias"])], 1)
    # each form within float32's bound of the exact distances (tests/float32_bounds.py), not of each other
    sq_exact, sq_bound = f32.exact_sq_distances(jnp.asarray(flat))
    for form in (tree, jnp.asarray(flat)):
        f32.assert_within(md.pairwise_sq_distances(form), sq_exact, sq_bound, "squared distances")
    rows = jnp.array([4, 1])
    xi = mixing_matrix(md.pairwise_sq_distances(tree), 1.0, 0.1, rows=rows)
    u_tree = md.apply_mixing(xi, tree)
    assert u_tree["body"]["kernel"].shape == (2, 5, 4) and u_tree["head"]["bias"].shape == (2, 3)
    u_flat = md.apply_mixing(xi, jnp.asarray(flat))
    # the same Xi mixes both: U = Xi @ W exactly in float64, within gamma_{N+2} |Xi| |W| in float32
    u_exact = np.asarray(xi, np.float64) @ flat.astype(np.float64)
    bound = f32.matmul_bound(xi, flat) + f32.gamma(8) * np.abs(np.asarray(xi)) @ np.abs(flat)
    f32.assert_within(u_tree["body"]["kernel"].reshape(2, -1), u_exact[:, :20], bound[:, :20], "tree U")
    f32.assert_within(u_tree["head"]["bias"], u_exact[:, 20:], bound[:, 20:], "tree U")
    f32.assert_within(u_flat, u_exact, bound, "flat U")


# ------------------------------------------------- the paper's form: loss, mixing
def distance_mixing_loop64(d, tau, eta):
    """Xi of the paper's form written out pair by pair: c_ij from the closed form of dL/dd counting L_i and
    L_j, xi_ij = eta_i c_ij / d_ij, eta_i cut so that sum_{j != i} |xi_ij| <= 1 (module docstring)."""
    n = d.shape[0]
    s = np.zeros((n, n))
    for i in range(n):
        others = [k for k in range(n) if k != i]
        z = np.array([d[i, k] / tau for k in others])
        e = np.exp(z - z.max())
        s[i, others] = e / e.sum()
    xi = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if j != i and d[i, j] > 0:
                c = (1 - (n - 1) * s[i, j]) / tau + (1 - (n - 1) * s[j, i]) / tau
                xi[i, j] = eta * c / d[i, j]
        total = sum(abs(xi[i, j]) for j in range(n) if j != i)
        if total > 1:
            xi[i] /= total
        xi[i, i] = 1.0 - sum(xi[i, j] for j in range(n) if j != i)
    return xi


def written_loss_of_models64(w, tau):
    """The written loss of the models W [N, P], float64, through the kernel's distances (for autodiff)."""
    return md.model_distance_loss(md.pairwise_distances(w, resolution=0.0), tau)


def test_written_loss_value_matches_formula():
    d = distances_loop64(random_models(6, 50))
    tau = 0.7
    ref = 0.0
    for i in range(6):
        z = [d[i, k] / tau for k in range(6) if k != i]
        lse = np.log(np.sum(np.exp(z)))
        ref += sum(zj - lse for zj in z)
    with jax.enable_x64(True):
        val = md.model_distance_loss(jnp.asarray(d), tau)
        assert abs(float(val) - ref) < 1e-10 * abs(ref)


def test_written_loss_autodiff_equals_closed_form_and_signs():
    with jax.enable_x64(True):
        d = jnp.asarray(distances_loop64(random_models(12, 40)))
        g = jax.grad(md.model_distance_loss)(d, 0.3)
        np.testing.assert_allclose(g, md.model_distance_loss_grad(d, 0.3), rtol=1e-10, atol=1e-14)
        g = np.asarray(g)
        for i in range(12):  # in each row the nearest model attracts and the farthest repels
            others = [j for j in range(12) if j != i]
            nearest, farthest = min(others, key=lambda j: d[i, j]), max(others, key=lambda j: d[i, j])
            assert g[i, nearest] > 0 > g[i, farthest]


def test_written_loss_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        w = jnp.asarray(rng.normal(size=(7, 20)))
        f = jax.jit(lambda w: written_loss_of_models64(w, 0.8))
        g = jax.jit(jax.grad(f))(w)
        h = 1e-6
        for _ in range(5):
            v = jnp.asarray(rng.normal(size=w.shape))
            fd = (f(w + h * v) - f(w - h * v)) / (2 * h)
            assert abs(float(jnp.vdot(g, v)) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))


@pytest.mark.parametrize("eta", [0.01, 50.0])
def test_written_mixing_is_a_gradient_step_on_the_written_loss(eta):
    """Lemma 1: U = Xi @ W equals W - eta_i grad_W L(D(W)) (float64 autodiff of the written loss), eta_i = eta
    unless cut so that sum_{j != i} |xi_ij| <= 1."""
    with jax.enable_x64(True):
        w = jnp.asarray(two_groups(5, 30, spread=0.4, seed=1), jnp.float64)
        tau = 0.5
        u, xi, _ = mix_models(w, tau, eta)
        grad = jax.jit(jax.grad(lambda w: written_loss_of_models64(w, tau)))(w)
        steps = np.asarray(md.bounded_step_sizes(md.step_pulls(md.pairwise_sq_distances(w), tau), eta))
        np.testing.assert_allclose(u, w - steps[:, None] * grad, rtol=1e-10, atol=1e-12)
        xi = np.asarray(xi)
        off = np.abs(xi - np.diag(np.diag(xi))).sum(axis=1)
        if eta < 0.1:
            np.testing.assert_array_equal(steps, eta)
        else:
            assert np.all(steps < eta) and np.all(steps > 0)
            np.testing.assert_allclose(off, 1.0, rtol=1e-12)
        assert np.all(off <= 1 + 1e-12) and np.all(np.diag(xi) >= -1e-12)


def test_two_near_pairs_far_apart_attract_within_and_repel_across():
    """4 clients, models {0, 1} near each other and {2, 3} near each other, the pairs far apart: one server
    step moves each model toward its partner and away from the other pair (negative xi), as float64
    autodiff of the written loss says."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=20), rng.normal(size=20) + 6.0
    w = np.stack([a, a + 0.3 * rng.normal(size=20), b, b + 0.3 * rng.normal(size=20)]).astype(np.float32)
    tau, eta = 1.0, 0.05
    u, xi, _ = mix_models(jnp.asarray(w), tau, eta)
    u, xi = np.asarray(u, np.float64), np.asarray(xi, np.float64)
    partner, far = {0: 1, 1: 0, 2: 3, 3: 2}, {0: (2, 3), 1: (2, 3), 2: (0, 1), 3: (0, 1)}
    for i in range(4):
        assert xi[i, partner[i]] > 0 and all(xi[i, j] < 0 for j in far[i]), xi[i]
        assert np.linalg.norm(u[i] - w[partner[i]]) < np.linalg.norm(w[i] - w[partner[i]])
        other_mean = w[list(far[i])].mean(0)
        assert np.linalg.norm(u[i] - other_mean) > np.linalg.norm(w[i] - other_mean)
    with jax.enable_x64(True):
        w64 = jnp.asarray(w, jnp.float64)
        grad = np.asarray(jax.jit(jax.grad(lambda w: written_loss_of_models64(w, tau)))(w64))
        steps = np.asarray(md.bounded_step_sizes(md.step_pulls(md.pairwise_sq_distances(w64), tau), eta))
    np.testing.assert_allclose(u, w - steps[:, None] * grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,p,kind,eta", [(10, 2000, "random", 0.01), (40, 1000, "random", 0.01),
                                          (100, 1500, "near", 1e-5), (40, 1000, "groups", 0.01),
                                          (40, 1000, "groups", 5.0)])
def test_written_mixed_models_match_float64_loop(n, p, kind, eta):
    w = {"random": lambda: random_models(n, p, seed=n),
         "near": lambda: near_identical_models(n, p, 1e-4, seed=n),
         "groups": lambda: two_groups(n // 2, p, spread=0.3, seed=n)}[kind]()
    tau = 0.7
    d64 = distances_loop64(w)
    xi64 = distance_mixing_loop64(d64, tau, eta)
    u64 = mix_loop64(xi64, w)
    u, xi, d = mix_models(jnp.asarray(w), tau, eta)
    u, xi = np.asarray(u, np.float64), np.asarray(xi, np.float64)
    assert off_diag_rel_err(d, d64) < REL
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, atol=1e-5)
    off64 = xi64 - np.diag(np.diag(xi64))
    assert np.max(np.abs((xi - np.diag(np.diag(xi))) - off64)) < 1e-3 * np.max(np.abs(off64))
    assert np.all(np.abs(xi - np.diag(np.diag(xi))).sum(axis=1) <= 1 + 1e-5)
    row_err = np.linalg.norm(u - u64, axis=1) / np.linalg.norm(u64, axis=1)
    assert row_err.max() < REL


def test_written_form_keeps_repelling_a_far_model():
    """Unlike the kernel variant, a model moved away from the others keeps being pushed away: its weight
    from the others stays negative and its step does not fade to nothing."""
    rng = np.random.default_rng(4)
    base = rng.normal(size=(12, 100)) * 0.1
    direction = rng.normal(size=100)
    direction /= np.linalg.norm(direction)
    for r in (4.0, 16.0, 64.0):
        w = base.copy()
        w[0] = base[0] + r * direction
        u, xi, _ = mix_models(jnp.asarray(w, jnp.float32), 1.0, 0.05)
        xi = np.asarray(xi)
        assert np.all(xi[1:, 0] < 0), (r, xi[1:, 0])  # every other client repels the far model
        outward = float(np.dot(np.asarray(u)[0] - w[0], direction))
        assert outward > 1e-3, (r, outward)  # the far model's anchor moves further out


def test_single_pair_and_identical_pairs_have_no_force():
    """Two models: each softmax has one entry (s = 1), so N-1 = 1 and c = 0; identical models: weight 0."""
    w = jnp.asarray(random_models(2, 10))
    u, xi, _ = mix_models(w, 1.0, 0.5)
    np.testing.assert_allclose(np.asarray(xi), np.eye(2), atol=1e-7)
    w3 = jnp.asarray(np.stack([random_models(1, 10)[0]] * 2 + [random_models(1, 10, seed=1)[0]]))
    xi3 = np.asarray(mix_models(w3, 1.0, 0.5)[1])
    assert xi3[0, 1] == 0.0 and xi3[1, 0] == 0.0 and np.all(np.isfinite(xi3))


# ------------------------------------------------------- the unit the distances are read in
@pytest.mark.parametrize("unit", ["mean", "sqrt_params"])
@pytest.mark.parametrize("kind,eta", [("random", 0.01), ("groups", 0.01), ("groups", 5.0)])
def test_mixing_in_a_unit_matches_float64_loop_on_rescaled_distances(unit, kind, eta):
    """Xi read in unit s is the raw pair-by-pair Xi of the distances d / s (s: the mean distance of the pairs,
    or sqrt(P)): the loss and its step both in units of s."""
    n, p = 12, 300
    w = random_models(n, p, seed=2) if kind == "random" else two_groups(n // 2, p, spread=0.3, seed=2)
    d64 = distances_loop64(w)
    s = d64[~np.eye(n, dtype=bool)].mean() if unit == "mean" else np.sqrt(p)
    xi64 = distance_mixing_loop64(d64 / s, 0.4, eta)
    u, xi, d = mix_models(jnp.asarray(w), 0.4, eta, unit=unit)
    assert off_diag_rel_err(d, d64) < REL  # D stays in parameter units
    np.testing.assert_allclose(np.asarray(xi, np.float64), xi64, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(u, np.float64), mix_loop64(xi64, w), rtol=1e-4, atol=1e-4)


def test_mean_unit_step_does_not_change_when_the_models_spread_further():
    """Scaling every model difference by the same factor (training that moves all models further apart)
    leaves Xi unchanged in the mean unit; in parameter units it changes."""
    w = two_groups(6, 200, spread=0.3, seed=5)
    center = w.mean(0)
    xi = {}
    for factor in (1.0, 30.0):
        spread = jnp.asarray(center + factor * (w - center))
        xi[("mean", factor)] = np.asarray(mix_models(spread, 0.3, 0.05, unit="mean")[1])
        xi[("raw", factor)] = np.asarray(mix_models(spread, 0.3, 0.05, unit="raw")[1])
    np.testing.assert_allclose(xi[("mean", 30.0)], xi[("mean", 1.0)], rtol=1e-4, atol=1e-6)
    assert np.abs(xi[("raw", 30.0)] - xi[("raw", 1.0)]).max() > 0.05


@pytest.mark.parametrize("eta", [1e-4, 0.5])
def test_sqrt_params_unit_is_raw_with_tau_and_eta_rescaled(eta):
    """A constant unit s = sqrt(P) is the raw reading with tau s and eta s^2 (the step is taken in the unit)."""
    w, p = jnp.asarray(random_models(8, 50, seed=3)), 50
    xi = mix_models(w, 0.3, eta, unit="sqrt_params")[1]
    np.testing.assert_allclose(xi, mix_models(w, 0.3 * np.sqrt(p), eta * p, unit="raw")[1], rtol=1e-5, atol=1e-6)


def test_bad_unit_fails():
    with pytest.raises(ValueError, match="unit"):
        md.read_in_unit(jnp.zeros((2, 2)), "median", 4)


def step_diagnostics_loop64(d, xi, tau, eta, rows):
    """`step_diagnostics` of the paper's form written out row by row in float64 (d: distances in the unit read)."""
    n = d.shape[0]
    mean = d[~np.eye(n, dtype=bool)].mean()
    softmax = np.zeros((n, n))
    for i in range(n):
        others = [k for k in range(n) if k != i]
        z = np.array([d[i, k] / tau for k in others])
        softmax[i, others] = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    entropies, bound = [], 0
    for i in rows:
        prob = np.array([softmax[i, k] for k in range(n) if k != i])
        entropies.append(-np.sum(prob * np.log(np.where(prob > 0, prob, 1.0))))
        pulls = [((1 - (n - 1) * softmax[i, j]) + (1 - (n - 1) * softmax[j, i])) / tau / d[i, j]
                 for j in range(n) if j != i and d[i, j] > 0]
        bound += int(eta * sum(abs(v) for v in pulls) > 1)  # the full step would weigh the others more than 1
    nearest = [min(d[i, j] for j in range(n) if j != i) for i in range(n)]
    pulled = [d[i, j] / mean for r, i in enumerate(rows) for j in range(n) if j != i and xi[r, j] > 0]
    pushed = [d[i, j] / mean for r, i in enumerate(rows) for j in range(n) if j != i and xi[r, j] < 0]
    return {"softmax_entropy_mean": np.mean(entropies), "softmax_entropy_min": np.min(entropies),
            "bound_rows": bound, "merged_fraction": np.mean([v < 0.01 * mean for v in nearest]),
            "pulled_distance": np.mean(pulled) if pulled else 0.0,
            "pushed_distance": np.mean(pushed) if pushed else 0.0}


@pytest.mark.parametrize("eta", [0.002, 5.0])
def test_step_diagnostics_match_float64_loop(eta):
    w = two_groups(5, 80, spread=0.4, seed=7)
    w[0] = w[1] + 1e-3 * np.random.default_rng(0).normal(size=80)  # one merged pair (below resolution: d = 0)
    rows = np.array([0, 3, 7, 9])
    sq = md.pairwise_sq_distances(jnp.asarray(w))
    xi = mixing_matrix(sq, 0.5, eta, rows=jnp.asarray(rows))
    got = jax.jit(lambda sq, xi: md.step_diagnostics(sq, xi, 0.5, eta, rows=jnp.asarray(rows)))(sq, xi)
    want = step_diagnostics_loop64(np.sqrt(np.asarray(sq, np.float64)), np.asarray(xi, np.float64), 0.5, eta, rows)
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(float(got[name]), value, rtol=1e-4, atol=1e-6, err_msg=name)
    assert abs(float(got["merged_fraction"]) - 0.2) < 1e-6  # models 0 and 1 of 10
    assert (float(got["bound_rows"]) > 0) == (eta == 5.0)


# ------------------------------------------------------- the kernel variant: loss, mixing
def mean_sq_distance(w):
    """A kernel scale at the models' own spread: the mean squared distance of different pairs (float64)."""
    d = distances_loop64(w)
    n = d.shape[0]
    return float((d ** 2).sum() / (n * (n - 1)))


def test_loss_value_matches_formula():
    d = distances_loop64(random_models(6, 50))
    tau, sigma = 0.7, 100.0
    ref = 0.0
    for i in range(6):
        z = [tau * np.exp(-d[i, l] ** 2 / sigma) for l in range(6) if l != i]
        lse = np.log(np.sum(np.exp(z)))
        ref += sum(zj - lse for zj in z)
    with jax.enable_x64(True):
        val = md.kernel_similarity_loss(jnp.asarray(d ** 2), tau, sigma)
        assert abs(float(val) - ref) < 1e-10 * abs(ref)


def test_autodiff_grad_equals_closed_form():
    with jax.enable_x64(True):
        sq = jnp.asarray(distances_loop64(random_models(12, 40)) ** 2)
        g = jax.grad(md.kernel_similarity_loss)(sq, 0.3, 80.0)
        np.testing.assert_allclose(g, md.kernel_similarity_loss_grad(sq, 0.3, 80.0), rtol=1e-10, atol=1e-14)
        # each client's pull on its more-similar models outweighs its push on the others
        assert np.all(np.asarray(g).sum(axis=1) > 0)


def test_gradient_through_kernel_matches_finite_differences():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        w = jnp.asarray(rng.normal(size=(7, 20)))
        f = jax.jit(lambda w: md.kernel_similarity_loss(md.pairwise_sq_distances(w), 0.8, 30.0))
        g = jax.jit(jax.grad(f))(w)
        h = 1e-6
        for _ in range(5):
            v = jnp.asarray(rng.normal(size=w.shape))
            fd = (f(w + h * v) - f(w - h * v)) / (2 * h)
            assert abs(float(jnp.vdot(g, v)) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))
        for i, p in [(0, 0), (3, 7), (6, 19)]:
            e = jnp.zeros_like(w).at[i, p].set(1.0)
            fd = (f(w + h * e) - f(w - h * e)) / (2 * h)
            assert abs(float(g[i, p]) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))


@pytest.mark.parametrize("eta", [0.05, 50.0])
def test_mixing_is_a_gradient_step_on_the_loss(eta):
    """Lemma 1: U = Xi @ W equals W - eta_i * sigma * grad_W L(D^2(W)), eta_i = eta unless cut where the
    full step would weigh a client's own model negatively (then xi_ii = 0)."""
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        w = jnp.asarray(two_groups(5, 30, spread=0.4, seed=1), jnp.float64)
        tau, sigma = 0.5, 60.0
        u, xi, _ = kernel_mix_models(w, tau, eta, sigma)
        grad = jax.jit(jax.grad(lambda w: md.kernel_similarity_loss(md.pairwise_sq_distances(w), tau, sigma)))(w)
        pull = md.step_pulls(md.pairwise_sq_distances(w), tau, form="kernel", sigma=sigma)
        steps = np.asarray(md.step_sizes(pull, eta))
        np.testing.assert_allclose(u, w - steps[:, None] * sigma * grad, rtol=1e-10, atol=1e-12)
        self_weight = np.diag(np.asarray(xi))
        if eta < 1:
            np.testing.assert_array_equal(steps, eta)
        else:
            cut = steps < eta
            assert cut.all() and np.all(steps > 0)
            np.testing.assert_allclose(self_weight[cut], 0.0, atol=1e-12)
        assert np.all(self_weight >= -1e-12)


@pytest.mark.parametrize("n,p,kind,eta", [(10, 2000, "random", 0.02), (40, 1000, "random", 0.02),
                                          (100, 800, "random", 0.02), (100, 1500, "near", 0.02),
                                          (40, 1000, "groups", 0.02), (40, 1000, "groups", 5.0)])
def test_kernel_mixed_models_match_float64_loop(n, p, kind, eta):
    w = {"random": lambda: random_models(n, p, seed=n),
         "near": lambda: near_identical_models(n, p, 1e-4, seed=n),
         "groups": lambda: two_groups(n // 2, p, spread=0.3, seed=n)}[kind]()
    tau, sigma = 1.0, mean_sq_distance(w)
    d64 = distances_loop64(w)
    xi64 = mixing_loop64(d64, tau, eta, sigma)
    u64 = mix_loop64(xi64, w)
    u, xi, d = kernel_mix_models(jnp.asarray(w), tau, eta, jnp.float32(sigma))
    u, xi = np.asarray(u, np.float64), np.asarray(xi, np.float64)
    assert off_diag_rel_err(d, d64) < REL
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, atol=1e-5)
    if eta > 1:  # every step cut (tested): no client weighs its own model negatively
        assert np.all(np.diag(xi64) < 1e-12) and np.all(np.diag(xi) > -1e-5)
    # Off the diagonal to 1e-4 of the largest coefficient (they hold (N-1) s_ij - 1, a difference of
    # nearly equal numbers when the similarities are alike); the diagonal, about 1, to float32's ulps.
    off64 = xi64 - np.diag(np.diag(xi64))
    assert np.max(np.abs((xi - np.diag(np.diag(xi))) - off64)) < 1e-4 * np.max(np.abs(off64))
    assert np.max(np.abs(np.diag(xi) - np.diag(xi64))) < 1e-6
    row_err = np.linalg.norm(u - u64, axis=1) / np.linalg.norm(u64, axis=1)
    assert row_err.max() < REL
    # The server's move u_i - w_i (much smaller than u_i): for random models to
    # 3e-4 of itself; for nearly identical ones it is below float32's
    # resolution of u_i, so it must be right to a few ulps of u_i.
    step64 = u64 - w.astype(np.float64)
    step_err = np.linalg.norm((u - w) - step64, axis=1)
    if kind == "near":
        assert np.all(step_err <= 4 * np.finfo(np.float32).eps * np.linalg.norm(u64, axis=1))
    else:
        assert np.max(step_err / np.linalg.norm(step64, axis=1)) < 3e-4


def test_rows_select_clients_from_all_models():
    w = jnp.asarray(random_models(30, 200))
    rows = jnp.array([3, 17, 29, 0])
    u_all, xi_all, _ = mix_models(w, 0.5, 0.01)
    u_sel, xi_sel, _ = mix_models(w, 0.5, 0.01, rows=rows)
    # both within float32's bound of the exact step's rows (tests/float32_bounds.py), not of each other
    u_exact, xi_exact, u_bound, xi_bound = f32.exact_mixing(w, 0.5, 0.01, jnp.arange(30))
    for u, xi, picked in ((u_all[rows], xi_all[rows], "all rows"), (u_sel, xi_sel, "the chosen rows")):
        f32.assert_within(xi, xi_exact[rows], xi_bound[rows], f"Xi of {picked}")
        f32.assert_within(u, u_exact[rows], u_bound[rows], f"U of {picked}")
    assert xi_sel.shape == (4, 30)


def test_rows_of_xi_sum_to_one_and_signs():
    w = two_groups(8, 300)
    xi = np.asarray(kernel_mixing_matrix(md.pairwise_sq_distances(jnp.asarray(w)), 1.0, 0.01, mean_sq_distance(w)))
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, atol=1e-6)
    same = np.kron(np.eye(2), np.ones((8, 8))).astype(bool) & ~np.eye(16, dtype=bool)
    other = ~np.kron(np.eye(2), np.ones((8, 8))).astype(bool)
    assert np.all(xi[same] > 0) and np.all(xi[other] < 0)  # attract own group, repel the other
    assert np.all(np.diag(xi) < 1)  # the pull outweighs the push: every client mixes others in


def test_mechanism_two_groups_attract_and_repel():
    """u_i moves toward its own group's models and away from the other group's."""
    n = 10
    w = two_groups(n, 500, spread=0.3, seed=5)
    u, _, _ = kernel_mix_models(jnp.asarray(w), 1.0, 1e-3, mean_sq_distance(w))
    u = np.asarray(u)
    mean_a, mean_b = w[:n].mean(0), w[n:].mean(0)
    for i in range(2 * n):
        own, other = (mean_a, mean_b) if i < n else (mean_b, mean_a)
        assert np.linalg.norm(u[i] - own) < np.linalg.norm(w[i] - own)
        assert np.linalg.norm(u[i] - other) > np.linalg.norm(w[i] - other)
    d_before = distances_loop64(w)
    d_after_own = [np.linalg.norm(u[i] - w[j]) for i in range(n) for j in range(n) if j != i]
    d_before_own = [d_before[i, j] for i in range(n) for j in range(n) if j != i]
    assert np.mean(d_after_own) < np.mean(d_before_own)


@pytest.mark.parametrize("kind", ["groups", "random"])
def test_kernel_larger_tau_strengthens_pull_and_push(kind):
    """In the kernel variant, over the paper's range of tau, both the attracting and the repelling mass of Xi
    grow with tau."""
    w = two_groups(10, 400, spread=0.5, seed=2) if kind == "groups" else random_models(20, 400, seed=2)
    sq, sigma = md.pairwise_sq_distances(jnp.asarray(w)), mean_sq_distance(w)
    own = jnp.arange(20)
    masses = [md.signed_mass(kernel_mixing_matrix(sq, tau, 0.01, sigma), own)
              for tau in (0.1, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0)]
    pull = np.array([float(m["attraction"]) for m in masses])
    push = np.array([-float(m["repulsion"]) for m in masses])
    assert np.all(np.diff(pull) > 0) and np.all(np.diff(push) > 0), (pull, push)
    assert push[0] > 0


def test_kernel_push_on_a_far_model_fades():
    """In the kernel variant a model moved away from the others is pushed less and less, to nothing: it does
    not repel far models (why it is not the paper's form)."""
    rng = np.random.default_rng(4)
    base = rng.normal(size=(12, 100)) * 0.1
    direction = rng.normal(size=100)
    direction /= np.linalg.norm(direction)
    steps = []
    for r in (1.0, 2.0, 4.0, 8.0):
        w = base.copy()
        w[0] = base[0] + r * direction
        u, _, _ = kernel_mix_models(jnp.asarray(w, jnp.float32), 1.0, 0.05, 1.0)
        steps.append(float(np.linalg.norm(np.asarray(u)[0] - w[0])))
    assert steps[0] > steps[1] > 100 * steps[2] and steps[-1] < 1e-6, steps


def test_coefficients_are_bounded_for_close_pairs():
    """|xi_ij| <= 4 eta tau (e^tau - 1) (module docstring), also for pairs far closer than the rest."""
    w = random_models(20, 300, seed=7)
    w[1] = w[0] + 1e-3 * np.random.default_rng(8).normal(size=300).astype(np.float32)
    for tau in (0.5, 1.0, 2.0):
        for sigma in (1.0, mean_sq_distance(w), 1e4):
            xi = np.asarray(kernel_mixing_matrix(md.pairwise_sq_distances(jnp.asarray(w)), tau, 0.01, sigma))
            off = xi - np.diag(np.diag(xi))
            assert np.abs(off).max() <= 4 * 0.01 * tau * (np.exp(tau) - 1) * (1 + 1e-5)
            assert np.mean(np.diag(xi)) <= 1 + 1e-6  # on average the pull outweighs the push


def test_single_model_is_left_alone():
    w = jnp.asarray(random_models(1, 10))
    for form in md.FORMS:
        u, xi, d = mix_models(w, 1.0, 0.1, form=form)
        np.testing.assert_allclose(u, w, rtol=1e-6)
    assert float(md.model_distance_loss(d, 1.0)) == 0.0
    assert float(md.kernel_similarity_loss(d ** 2, 1.0, 1.0)) == 0.0


def test_public_facades_reexport_the_kernel():
    assert aggregation.pairwise_distances is md.pairwise_distances
    assert aggregation.mixing_matrix is md.mixing_matrix
    assert aggregation.apply_mixing is md.apply_mixing
    assert losses.model_distance_loss is md.model_distance_loss
