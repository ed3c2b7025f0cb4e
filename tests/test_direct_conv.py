"""conv_impl='direct' (models/direct_conv.py): lax.conv's values and gradients, canonical convolutions in loops."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fedjax_pfl.models.direct_conv import conv2d_direct
from fedjax_pfl.models.networks import build_model

NHWC = ("NHWC", "HWIO", "NHWC")
CASES = [  # input [B, H, W, C], kernel [kh, kw, C, O], strides, pads
    ((3, 12, 12, 5), (5, 5, 5, 7), (1, 1), ((0, 0), (0, 0))),
    ((2, 9, 10, 4), (3, 3, 4, 6), (2, 2), ((1, 1), (1, 1))),
    ((2, 8, 8, 4), (1, 1, 4, 6), (2, 2), ((0, 0), (0, 0))),
    ((2, 8, 8, 3), (3, 3, 3, 6), (2, 2), ((0, 1), (0, 1))),
    ((2, 7, 8, 3), (3, 3, 3, 2), (2, 1), ((1, 0), (2, 1))),
    ((2, 7, 7, 1), (3, 3, 1, 2), (1, 1), ((1, 1), (1, 1))),
    ((2, 9, 9, 2), (4, 4, 2, 3), (3, 3), ((0, 0), (0, 0))),  # the last input row and column feed no output
    ((16, 12, 12, 32), (5, 5, 32, 3), (1, 1), ((0, 0), (0, 0))),  # kernel gradient by im2col's matmul
    ((32, 11, 11, 16), (3, 3, 16, 2), (2, 2), ((1, 1), (1, 1))),  # ditto, strided
]


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _arrays(shape, kernel_shape, strides, pads, clients=None, dtype=jnp.float64):
    lead = () if clients is None else (clients,)
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], lead + shape, dtype)
    k = jax.random.normal(keys[1], lead + kernel_shape, dtype)
    out = jax.eval_shape(lambda x, k: lax.conv_general_dilated(x, k, strides, pads, dimension_numbers=NHWC),
                         x[0] if clients else x, k[0] if clients else k).shape
    return x, k, jax.random.normal(keys[2], lead + out, dtype)


def _pair(strides, pads):
    reference = lambda x, k: lax.conv_general_dilated(x, k, strides, pads, dimension_numbers=NHWC)  # noqa: E731
    return reference, lambda x, k: conv2d_direct(x, k, strides, pads)


def _assert_close(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("shape,kernel_shape,strides,pads", CASES)
def test_forward_and_both_gradients_equal_lax_conv_in_float64(x64, shape, kernel_shape, strides, pads):
    x, k, ct = _arrays(shape, kernel_shape, strides, pads)
    reference, direct = _pair(strides, pads)
    _assert_close(direct(x, k), reference(x, k))
    _assert_close(jax.vjp(direct, x, k)[1](ct), jax.vjp(reference, x, k)[1](ct))


@pytest.mark.parametrize("shape,kernel_shape,strides,pads", CASES[:2])
@pytest.mark.parametrize("kernel_axis", [0, None], ids=["kernel_per_client", "shared_kernel"])
def test_vmapped_over_clients_equals_lax_conv(x64, shape, kernel_shape, strides, pads, kernel_axis):
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, clients=3)
    k = k if kernel_axis == 0 else k[0]
    reference, direct = _pair(strides, pads)
    mapped = lambda f: jax.vmap(lambda x, k, c: (f(x, k), jax.vjp(f, x, k)[1](c)), (0, kernel_axis, 0))  # noqa: E731
    _assert_close(mapped(direct)(x, k, ct), mapped(reference)(x, k, ct))


def test_forward_over_reverse_hessian_vector_product(x64):
    x, k, _ = _arrays(*CASES[1])
    for_each = [lambda f=f: jax.jvp(jax.grad(lambda k: jnp.sum(jnp.tanh(f(x, k)) ** 2)), (k,), (jnp.cos(k),))[1]
                for f in _pair(*CASES[1][2:])]
    _assert_close(for_each[1](), for_each[0]())


@pytest.mark.parametrize("name,shape,train", [("fedavgcnn", (28, 28, 1), False), ("resnet8", (12, 12, 3), True),
                                              ("fedpac_cnn", (32, 32, 3), False)])
def test_models_equal_native_outputs_and_grads(name, shape, train):
    direct, native = (build_model(name, shape, 10, conv_impl=impl) for impl in ("direct", "native"))
    variables = native.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, *shape))
    y = jnp.arange(4) % 10

    def loss(params, model):
        out = model.apply({**variables, "params": params}, x, train=train)
        return -jnp.take_along_axis(jax.nn.log_softmax(out.logits), y[:, None], 1).mean(), out.logits

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1,
                   compiler_options={"xla_backend_optimization_level": 0})  # compiles 5x faster, same values
    (l_d, logits_d), g_d = grad(variables["params"], direct)
    (l_n, logits_n), g_n = grad(variables["params"], native)
    np.testing.assert_allclose(l_d, l_n, rtol=1e-5)
    np.testing.assert_allclose(logits_d, logits_n, rtol=1e-4, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_d), jax.tree.leaves(g_n)):
        scale = max(float(jnp.abs(b).max()), 1e-12)
        np.testing.assert_allclose(a / scale, b / scale, rtol=0, atol=1e-4)


@functools.lru_cache(maxsize=None)
def _compiled_scan_step(impl):
    model = build_model("lenet", (16, 16, 3), 10, conv_impl=impl)
    params = model.init(jax.random.key(0))["params"]
    xs, ys = jnp.ones((2, 4, 16, 16, 3)), jnp.zeros((2, 4), jnp.int32)

    def step(params, xy):
        loss = lambda p: -jax.nn.log_softmax(model.apply({"params": p}, xy[0], train=True).logits)[:, 0].sum()  # noqa: E731
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params)), None

    return jax.jit(lambda p, xs, ys: lax.scan(step, p, (xs, ys))[0]).lower(params, xs, ys).compile().as_text()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's convolution forms")
def test_every_convolution_of_a_scanned_sgd_step_is_canonical():
    """Both forward passes and both kernel gradients: each a b01f_01io->b01f convolution without window
    padding, the form XLA:CPU gives to its library kernels (conv1's input gradient, 6x6 -> 2x2, is im2col's
    adjoint: 9x padded work); JAX's own gradients are not in that form."""
    labels = lambda impl: re.findall(r"convolution\(.*?dim_labels=([\w>-]+)", _compiled_scan_step(impl))  # noqa: E731
    assert labels("direct") == ["b01f_01io->b01f"] * 4, labels("direct")
    assert not re.search(r"convolution\([^\n]*pad=", _compiled_scan_step("direct"))
    assert set(labels("native")) != {"b01f_01io->b01f"}


def test_gradient_inside_shard_map_over_clients():
    """The engine's client mesh (sharding.py) runs each device's clients under shard_map: every gradient piece
    must carry the manual axis of its inputs (a zeros-built transpose did not)."""
    mesh = jax.make_mesh((1,), ("clients",))
    spec = jax.sharding.PartitionSpec("clients")
    x, k, _ = _arrays((2, 9, 10, 4), (3, 3, 4, 6), (2, 2), ((1, 1), (1, 1)), clients=2, dtype=jnp.float32)
    reference, direct = _pair((2, 2), ((1, 1), (1, 1)))

    def grads(f):
        per_client = jax.vmap(jax.grad(lambda k, x: jnp.sum(jnp.sin(f(x, k))), argnums=(0, 1)))
        args = jax.device_put((k, x), jax.sharding.NamedSharding(mesh, spec))
        return jax.jit(jax.shard_map(per_client, mesh=mesh, in_specs=spec, out_specs=spec))(*args)

    for a, b in zip(grads(direct), grads(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_kernel_gradient_form_is_chosen_by_channels_and_positions():
    from fedjax_pfl.models import direct_conv
    from fedjax_pfl.models.conv_vjp import ConvStatic

    def chosen(shape, kernel_shape, strides, pads):
        x, k, dy = _arrays(shape, kernel_shape, strides, pads, dtype=jnp.float32)
        spec = ConvStatic(shape[1:], kernel_shape, strides, pads)
        return direct_conv._im2col_kernel_grad(dy, spec)

    assert [chosen(*case) for case in CASES[-2:]] == [True, True]
    assert not any(chosen(*case) for case in CASES[:-2])  # few channels or positions: the convolution


def test_im2col_transpose_is_the_adjoint_of_im2col(x64):
    from fedjax_pfl.models.im2col import im2col_patches, im2col_transpose

    patches_of = jax.jit(im2col_patches, static_argnums=(1, 2, 3))  # one program a case, not op by op
    transpose_of = jax.jit(im2col_transpose, static_argnums=(1, 2, 3, 4))
    for shape, kernel_shape, strides, pads in CASES:
        x = jax.random.normal(jax.random.key(3), shape, jnp.float64)
        patches = patches_of(x, kernel_shape[:2], strides, pads)
        d = jax.random.normal(jax.random.key(4), patches.shape, jnp.float64)
        back = transpose_of(d, shape[1:], kernel_shape[:2], strides, pads)
        assert back.shape == x.shape
        np.testing.assert_allclose(jnp.vdot(patches, d), jnp.vdot(x, back), rtol=1e-12)
