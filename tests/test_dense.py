"""models/dense.py: the direct Dense layer equals x @ kernel + bias and JAX's gradients, in canonical matmuls."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as f32

from fedjax_pfl.models.dense import Dense, dense_direct
from fedjax_pfl.models.networks import build_model


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _arrays(x_shape, features, clients=None):
    lead = () if clients is None else (clients,)
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k1, lead + x_shape, jnp.float64)
    kernel = jax.random.normal(k2, lead + (x_shape[-1], features), jnp.float64)
    return x, kernel, jax.random.normal(k3, lead + x_shape[:-1] + (features,), jnp.float64)


def _close(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("x_shape", [(5, 7), (2, 3, 7)], ids=["batch", "batch_and_position"])
def test_value_and_both_gradients_equal_jnp_dot_in_float64(x64, x_shape):
    x, kernel, ct = _arrays(x_shape, 4)
    _close(dense_direct(x, kernel), jnp.dot(x, kernel))
    _close(jax.vjp(dense_direct, x, kernel)[1](ct), jax.vjp(jnp.dot, x, kernel)[1](ct))


@pytest.mark.parametrize("kernel_axis", [0, None], ids=["kernel_per_client", "shared_kernel"])
def test_vmapped_over_clients_equals_jnp_dot(x64, kernel_axis):
    x, kernel, ct = _arrays((5, 7), 4, clients=3)
    kernel = kernel if kernel_axis == 0 else kernel[0]
    mapped = lambda f: jax.vmap(lambda x, k, c: (f(x, k), jax.vjp(f, x, k)[1](c)), (0, kernel_axis, 0))  # noqa: E731
    _close(mapped(dense_direct)(x, kernel, ct), mapped(jnp.dot)(x, kernel, ct))


def test_forward_over_reverse_hessian_vector_product(x64):
    """Per-FedAvg's Hessian-vector product: jax.jvp of a gradient through the layer."""
    x, kernel, _ = _arrays((5, 7), 4)
    hvp = lambda f: jax.jvp(jax.grad(lambda k: jnp.sum(jnp.tanh(f(x, k)) ** 2)), (kernel,), (jnp.cos(kernel),))[1]  # noqa: E731
    _close(hvp(dense_direct), hvp(jnp.dot))


@pytest.mark.parametrize("impl", ["direct", "native"])
def test_layer_has_flax_dense_parameters_and_values(impl):
    x = jax.random.normal(jax.random.key(1), (6, 9))
    ours, flax_dense = Dense(5, impl), nn.Dense(5)
    params, reference = ours.init(jax.random.key(2), x), flax_dense.init(jax.random.key(2), x)
    _close(params, reference)  # same initialisers, same draws: parameters move between them freely
    loss = lambda module, p: jnp.sum(jnp.sin(module.apply(p, x)))  # noqa: E731
    # both within float32's bound of the exact x @ kernel + bias (tests/float32_bounds.py), not of each other
    kernel, bias = (np.asarray(params["params"][k], np.float64) for k in ("kernel", "bias"))
    exact = np.asarray(x, np.float64) @ kernel + bias
    bound = f32.gamma(x.shape[-1] + 1) * (np.abs(np.asarray(x)) @ np.abs(kernel) + np.abs(bias))
    for got in (ours.apply(params, x), flax_dense.apply(reference, x)):
        f32.assert_within(got, exact, bound, "Dense")
    for a, b in zip(jax.tree.leaves(jax.grad(lambda p: loss(ours, p))(params)),
                    jax.tree.leaves(jax.grad(lambda p: loss(flax_dense, p))(reference))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_mlp_direct_equals_native_outputs_and_grads():
    direct, native = (build_model("mlp", (28, 28, 1), 10, conv_impl=impl, hidden=(32, 16)) for impl in ("direct", "native"))
    variables = native.init(jax.random.key(0))
    x, y = jax.random.normal(jax.random.key(1), (8, 28, 28, 1)), jnp.arange(8) % 10

    def loss(params, model):
        logits = model.apply({"params": params}, x, train=True).logits
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1).mean()

    (l_d, g_d), (l_n, g_n) = (jax.value_and_grad(loss)(variables["params"], m) for m in (direct, native))
    np.testing.assert_allclose(l_d, l_n, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_d), jax.tree.leaves(g_n)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's dot forms")
def test_kernel_gradient_in_a_scanned_sgd_step_is_a_canonical_matmul():
    """JAX's own kernel gradient contracts the batch axis of both operands (a dot XLA:CPU keeps to its own
    slower loop); the direct layer's every dot is [M, K] x [K, N]."""
    def compiled(impl):
        model = build_model("mlp", (28, 28, 1), 10, conv_impl=impl, hidden=(100,))
        params = model.init(jax.random.key(0))["params"]

        def step(p, xy):
            loss = lambda q: -jax.nn.log_softmax(model.apply({"params": q}, xy[0], train=True).logits)[:, 0].sum()  # noqa: E731
            return jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p)), None

        xs = jnp.ones((3, 10, 28, 28, 1))
        return jax.jit(lambda p, xs: jax.lax.scan(step, p, (xs, xs[..., 0, 0, 0]))[0]).lower(params, xs).compile().as_text()

    batch_contracting = r"lhs_contracting_dims=\{0\}, rhs_contracting_dims=\{0\}"
    assert re.search(batch_contracting, compiled("native"))
    assert not re.search(batch_contracting, compiled("direct"))
