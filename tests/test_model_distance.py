"""DiversiFed's kernel (fedjax_pfl/kernels/model_distance.py) against float64 pairwise loops.

References are NumPy float64 double loops over pairs, computed from the same
float32 inputs the kernel sees; gradients are checked against central finite
differences in float64 (``jax.enable_x64(True)`` as a context only).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import aggregation, losses
from fedjax_pfl.kernels import model_distance as md

REL = 1e-5

# Eager dispatch compiles every primitive separately (slow on busy CPUs): jit once.
mix_models = jax.jit(md.mix_models, static_argnames=("normalization", "loss_fn", "scale_free"))
pairwise_distances = jax.jit(md.pairwise_distances)
mixing_matrix = jax.jit(md.mixing_matrix, static_argnames=("loss_fn", "scale_free"))


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


def mixing_loop64(d, tau, eta, scale_free=False):
    """Xi from docs/methods/conventions.md written out pair by pair (closed form of dL/dd).

    ``scale_free``: c of L(D / mean(D)) at mean(D) = 1, i.e. c_ij - sum_kl c_kl d_kl / (N (N - 1)).
    """
    n = d.shape[0]
    s = np.zeros((n, n))
    for i in range(n):
        z = np.array([d[i, k] / tau for k in range(n) if k != i])
        e = np.exp(z - z.max())
        probs = e / e.sum()
        s[i, [k for k in range(n) if k != i]] = probs
    c = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if j != i:
                c[i, j] = (1 - (n - 1) * s[i, j]) / tau + (1 - (n - 1) * s[j, i]) / tau
    if scale_free:
        kappa = sum(c[k, l] * d[k, l] for k in range(n) for l in range(n) if k != l) / (n * (n - 1))
        c = c - kappa
    xi = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if j != i and d[i, j] > 0:
                xi[i, j] = eta * c[i, j] / d[i, j]
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


def test_identical_models_give_zero_distance_and_finite_gradient():
    w = jnp.broadcast_to(jnp.arange(30.0), (5, 30))
    d = pairwise_distances(w)
    assert np.all(np.asarray(d) == 0.0)
    g = jax.jit(jax.grad(lambda w: md.model_distance_loss(md.pairwise_distances(w), 0.5)))(w)
    assert np.all(np.isfinite(np.asarray(g)))
    xi = mixing_matrix(d, 0.5, 0.1)
    np.testing.assert_array_equal(np.asarray(xi), np.eye(5))


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
    np.testing.assert_allclose(pairwise_distances(tree), pairwise_distances(jnp.asarray(flat)), rtol=1e-6)
    xi = mixing_matrix(pairwise_distances(tree), 1.0, 0.1, rows=jnp.array([4, 1]))
    u_tree = md.apply_mixing(xi, tree)
    assert u_tree["body"]["kernel"].shape == (2, 5, 4) and u_tree["head"]["bias"].shape == (2, 3)
    u_flat = md.apply_mixing(xi, jnp.asarray(flat))
    np.testing.assert_allclose(u_tree["body"]["kernel"].reshape(2, -1), u_flat[:, :20], rtol=1e-6)
    np.testing.assert_allclose(u_tree["head"]["bias"], u_flat[:, 20:], rtol=1e-6)


# --------------------------------------------------------------- loss, mixing
def test_loss_value_matches_formula():
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


def test_autodiff_grad_equals_closed_form():
    with jax.enable_x64(True):
        d = jnp.asarray(distances_loop64(random_models(12, 40)))
        g = jax.grad(md.model_distance_loss)(d, 0.3)
        np.testing.assert_allclose(g, md.model_distance_loss_grad(d, 0.3), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(g).sum(axis=1), 0.0, atol=1e-9)


def test_gradient_through_kernel_matches_finite_differences():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        w = jnp.asarray(rng.normal(size=(7, 20)))
        f = jax.jit(lambda w: md.model_distance_loss(md.pairwise_distances(w), 0.8))
        g = jax.jit(jax.grad(f))(w)
        h = 1e-6
        for _ in range(5):
            v = jnp.asarray(rng.normal(size=w.shape))
            fd = (f(w + h * v) - f(w - h * v)) / (2 * h)
            assert abs(float(jnp.vdot(g, v)) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))
        # and entry by entry for a few coordinates
        for i, p in [(0, 0), (3, 7), (6, 19)]:
            e = jnp.zeros_like(w).at[i, p].set(1.0)
            fd = (f(w + h * e) - f(w - h * e)) / (2 * h)
            assert abs(float(g[i, p]) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))


@pytest.mark.parametrize("normalization,scale_free", [("none", False), ("mean", False), ("sqrt_params", False),
                                                      ("mean", True)])
def test_mixing_is_a_gradient_step_on_the_loss(normalization, scale_free):
    """Lemma 1: U = W - eta * s^2 * grad_W L(D(W) / s), s the normaliser: a constant, or the
    mean distance differentiated through (scale_free)."""
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        w = jnp.asarray(rng.normal(size=(9, 30)))
        tau, eta = 0.5, 0.05
        u, xi, d = mix_models(w, tau, eta, normalization=normalization, scale_free=scale_free)
        _, s = md.normalize_distances(d, normalization, 30)

        def loss(w):
            dist = md.pairwise_distances(w)
            scale = md.mean_distance(dist) if scale_free else s
            return md.model_distance_loss(dist / scale, tau)

        ref = w - eta * s ** 2 * jax.jit(jax.grad(loss))(w)
        np.testing.assert_allclose(u, ref, rtol=1e-10, atol=1e-12)


def test_scale_free_step_does_not_inflate_distances():
    """scale_free: the step is orthogonal to a common scaling (sum_ij c_ij d_ij = 0); fixed scale: it is not."""
    with jax.enable_x64(True):
        d = jnp.asarray(distances_loop64(two_groups(6, 40, spread=0.5)))
        d_hat = d / md.mean_distance(d)
        free = md.pair_coefficients(d_hat, 0.3, scale_free=True)
        fixed = md.pair_coefficients(d_hat, 0.3)
        assert abs(float(jnp.sum(free * d_hat))) < 1e-10 * float(jnp.sum(jnp.abs(free * d_hat)))
        assert float(jnp.sum(fixed * d_hat)) < -1e-3  # descent on L would inflate every distance
        # The spread of the models changes at second order in eta scale-free, first order with 'none'.
        w = jnp.asarray(two_groups(6, 40, spread=0.5), jnp.float64)
        tau_raw = 0.3 * float(md.mean_distance(d))

        def spread_change(normalization, eta):
            u, _, _ = mix_models(w, tau_raw if normalization == "none" else 0.3, eta, normalization=normalization,
                                 scale_free=normalization == "mean")
            before = float(jnp.sum(jnp.square(w - w.mean(0))))
            return (float(jnp.sum(jnp.square(u - u.mean(0)))) - before) / before

        assert spread_change("mean", 1e-4) / spread_change("mean", 1e-5) > 80
        ratio = spread_change("none", 1e-4) / spread_change("none", 1e-5)
        assert 8 < ratio < 12 and spread_change("none", 1e-4) > 0


@pytest.mark.parametrize("n,p,kind,normalization", [
    (10, 2000, "random", "mean"), (40, 1000, "random", "mean"), (40, 1000, "random", "none"),
    (100, 800, "random", "mean"), (100, 1500, "near", "mean"), (100, 800, "random", "sqrt_params"),
    (40, 1000, "random", "mean+scale_free")])
def test_mixed_models_match_float64_loop(n, p, kind, normalization):
    scale_free = normalization.endswith("+scale_free")
    normalization = normalization.split("+")[0]
    w = random_models(n, p, seed=n) if kind == "random" else near_identical_models(n, p, 1e-4, seed=n)
    tau, eta = 1.0, 0.02
    d64 = distances_loop64(w)
    scale = {"mean": d64.sum() / (n * (n - 1)), "none": 1.0, "sqrt_params": np.sqrt(p)}[normalization]
    xi64 = mixing_loop64(d64 / scale, tau, eta, scale_free=scale_free)
    u64 = mix_loop64(xi64, w)
    u, xi, d = mix_models(jnp.asarray(w), tau, eta, normalization=normalization, scale_free=scale_free)
    u, xi = np.asarray(u, np.float64), np.asarray(xi, np.float64)
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, atol=1e-5)
    assert np.max(np.abs(xi - xi64)) < REL * np.max(np.abs(xi64))
    row_err = np.linalg.norm(u - u64, axis=1) / np.linalg.norm(u64, axis=1)
    assert row_err.max() < REL
    # The server's move u_i - w_i (much smaller than u_i): for random models to
    # 1e-4 of itself; for nearly identical ones it is below float32's
    # resolution of u_i, so it must be right to a few ulps of u_i.
    step64 = u64 - w.astype(np.float64)
    step_err = np.linalg.norm((u - w) - step64, axis=1)
    if kind == "random":
        assert np.max(step_err / np.linalg.norm(step64, axis=1)) < 1e-4
    else:
        assert np.all(step_err <= 4 * np.finfo(np.float32).eps * np.linalg.norm(u64, axis=1))


def test_rows_select_clients_from_all_models():
    w = jnp.asarray(random_models(30, 200))
    rows = jnp.array([3, 17, 29, 0])
    u_all, xi_all, _ = mix_models(w, 0.5, 0.01)
    u_sel, xi_sel, _ = mix_models(w, 0.5, 0.01, rows=rows)
    np.testing.assert_allclose(xi_sel, xi_all[rows], rtol=1e-6)
    np.testing.assert_allclose(u_sel, u_all[rows], rtol=1e-6, atol=1e-6)
    assert xi_sel.shape == (4, 30)


def test_rows_of_xi_sum_to_one_and_signs():
    d = pairwise_distances(jnp.asarray(two_groups(8, 300)))
    d_hat, _ = md.normalize_distances(d, "mean")
    xi = np.asarray(mixing_matrix(d_hat, 0.2, 0.01))
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, atol=1e-6)
    same = np.kron(np.eye(2), np.ones((8, 8))).astype(bool) & ~np.eye(16, dtype=bool)
    other = ~np.kron(np.eye(2), np.ones((8, 8))).astype(bool)
    assert np.all(xi[same] > 0) and np.all(xi[other] < 0)  # attract own group, repel the other


def test_mechanism_two_groups_attract_and_repel():
    """u_i moves toward its own group's models and away from the other group's."""
    n = 10
    w = two_groups(n, 500, spread=0.3, seed=5)
    u, _, _ = mix_models(jnp.asarray(w), 0.3, 1e-3, normalization="mean")
    u = np.asarray(u)
    mean_a, mean_b = w[:n].mean(0), w[n:].mean(0)
    for i in range(2 * n):
        own, other = (mean_a, mean_b) if i < n else (mean_b, mean_a)
        assert np.linalg.norm(u[i] - own) < np.linalg.norm(w[i] - own)
        assert np.linalg.norm(u[i] - other) > np.linalg.norm(w[i] - other)
    # and the whole picture: mean distance to own group shrinks, to the other grows
    d_before = distances_loop64(w)
    d_after_own = [np.linalg.norm(u[i] - w[j]) for i in range(n) for j in range(n) if j != i]
    d_before_own = [d_before[i, j] for i in range(n) for j in range(n) if j != i]
    assert np.mean(d_after_own) < np.mean(d_before_own)


def test_normalization_scales():
    d = pairwise_distances(jnp.asarray(random_models(5, 100)))
    np.testing.assert_allclose(md.normalize_distances(d, "none")[0], d)
    np.testing.assert_allclose(md.normalize_distances(d, "sqrt_params", 100)[0], d / 10.0, rtol=1e-6)
    dm, s = md.normalize_distances(d, "mean")
    np.testing.assert_allclose(float(dm.sum()) / 20, 1.0, rtol=1e-6)
    with pytest.raises(ValueError):
        md.normalize_distances(d, "median")
    with pytest.raises(ValueError):
        md.normalize_distances(d, "sqrt_params")


def test_single_model_is_left_alone():
    w = jnp.asarray(random_models(1, 10))
    u, xi, d = mix_models(w, 1.0, 0.1)
    np.testing.assert_allclose(u, w, rtol=1e-6)
    assert float(md.model_distance_loss(d, 1.0)) == 0.0


def test_public_facades_reexport_the_kernel():
    assert aggregation.pairwise_distances is md.pairwise_distances
    assert aggregation.mixing_matrix is md.mixing_matrix
    assert aggregation.apply_mixing is md.apply_mixing
    assert losses.model_distance_loss is md.model_distance_loss
