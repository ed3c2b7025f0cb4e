"""GPFL's guidance losses and conditional valve inputs against float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as f32

from fedjax_pfl.kernels import global_guidance
from fedjax_pfl.models import conditional_valve


def _batch(seed=0, b=6, d=5, c=4):
    rng = np.random.default_rng(seed)
    f = rng.normal(size=(b, d)).astype(np.float32)
    y = rng.integers(0, c, size=b).astype(np.int32)
    e = rng.normal(size=(c, d)).astype(np.float32)
    mask = np.arange(b) < b - 2
    f[~mask] = 1e3  # padding rows must not count
    return f, y, e, mask


def test_angle_level_guidance_is_cosine_softmax_cross_entropy():
    f, y, e, mask = _batch()
    got = global_guidance.angle_level_guidance(jnp.asarray(f), jnp.asarray(y), jnp.asarray(e), jnp.asarray(mask))
    f64, e64 = f.astype(np.float64), e.astype(np.float64)
    cos = (f64 / np.linalg.norm(f64, axis=1, keepdims=True)) @ (e64 / np.linalg.norm(e64, axis=1, keepdims=True)).T
    logp = cos - np.log(np.exp(cos).sum(axis=1, keepdims=True))
    ref = -np.mean([logp[i, y[i]] for i in range(len(y)) if mask[i]])
    np.testing.assert_allclose(float(got), ref, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["code", "paper"])
def test_magnitude_level_guidance(reduction):
    f, y, e, mask = _batch(1)
    t = e[y]
    got = global_guidance.magnitude_level_guidance(jnp.asarray(f), jnp.asarray(t), jnp.asarray(mask), reduction)
    diff = (f.astype(np.float64) - t)[mask]
    ref = np.sqrt(np.sum(diff ** 2)) if reduction == "code" else np.mean(np.linalg.norm(diff, axis=1))
    np.testing.assert_allclose(float(got), ref, rtol=1e-5)
    g = jax.grad(lambda x: global_guidance.magnitude_level_guidance(x, jnp.asarray(t), None, reduction))(
        jnp.asarray(t))  # at the target: zero distance, finite zero gradient
    assert np.all(np.asarray(g) == 0.0)


def test_conditional_inputs_and_prior():
    rng = np.random.default_rng(3)
    e = rng.normal(size=(4, 3)).astype(np.float32)
    labels = np.array([1, 1, 3, 0, 2, 2], np.int32)  # last two rows are padding
    prior = conditional_valve.label_prior(jnp.asarray(labels), 4, 4)
    np.testing.assert_allclose(np.asarray(prior), [0.25, 0.5, 0.0, 0.25])
    z_g, z_p = conditional_valve.conditional_inputs(jnp.asarray(e), prior)
    e64 = e.astype(np.float64)
    # means of 4 float32 terms: within gamma_6 of the mean of their magnitudes (tests/float32_bounds.py)
    f32.assert_within(z_g, e64.mean(0), f32.gamma(6) * np.abs(e64).mean(0), "z_g")
    weights = np.array([0.25, 0.5, 0.0, 0.25])
    f32.assert_within(z_p, weights @ e64, f32.gamma(6) * (weights @ np.abs(e64)), "z_p")


def test_valve_is_the_affine_modulation_of_its_branches():
    valve = conditional_valve.ConditionalValve(3)
    params = valve.init(jax.random.key(0), jnp.zeros((1, 3)), jnp.ones(3))["params"]
    params = jax.tree.map(lambda a: a + 0.3 * jax.random.normal(jax.random.key(1), a.shape), params)
    x, z = np.random.default_rng(4).normal(size=(2, 3)), np.array([0.5, -1.0, 2.0])

    def branch(p):
        h = np.maximum(z @ np.asarray(p["dense"]["kernel"], np.float64) + np.asarray(p["dense"]["bias"]), 0)
        h = (h - h.mean()) / np.sqrt(h.var() + 1e-5)
        return h * np.asarray(p["norm"]["scale"]) + np.asarray(p["norm"]["bias"])

    parts = {b: {"dense": params[f"{b}_dense"], "norm": params[f"{b}_norm"]} for b in ("gamma", "beta")}
    ref = np.maximum(x * (branch(parts["gamma"]) + 1) + branch(parts["beta"]), 0)
    got = valve.apply({"params": params}, jnp.asarray(x, jnp.float32), jnp.asarray(z, jnp.float32))
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-4, atol=1e-5)
