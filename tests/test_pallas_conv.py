"""conv_impl='pallas' (models/pallas_conv.py, implicit_gemm.py) and the fused SGD update (models/fused_sgd.py):
lax.conv's values and gradients in Pallas interpret mode, one kernel launch per piece under vmap over clients,
and a Triton lowering for a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.extend import core as jax_core

from fedjax_pfl.kernels.optim import make_optimizer
from fedjax_pfl.models import fused_sgd
from fedjax_pfl.models.conv import resolve_conv_impl
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.models.pallas_conv import conv2d_pallas

NHWC = ("NHWC", "HWIO", "NHWC")
VALID = ((0, 0), (0, 0))
CASES = {  # input [B, H, W, C], kernel [kh, kw, C, O], strides, pads: the layers of FedAvgCNN and LeNet, B = 2
    "fedavgcnn_conv1": ((2, 28, 28, 1), (5, 5, 1, 32), (1, 1), VALID),
    "fedavgcnn_conv2": ((2, 12, 12, 32), (5, 5, 32, 64), (1, 1), VALID),
    "lenet_conv1": ((2, 32, 32, 3), (5, 5, 3, 6), (1, 1), VALID),
    "lenet_conv2": ((2, 14, 14, 6), (5, 5, 6, 16), (1, 1), VALID),
    "strided_padded": ((2, 9, 10, 4), (3, 3, 4, 6), (2, 2), ((1, 1), (1, 1))),  # ResNet's downsampling form
    "uneven_pads": ((2, 7, 8, 3), (3, 3, 3, 2), (2, 1), ((1, 0), (2, 1))),
}
CLIENTS = 3
# float32 tolerance: exact float32 products in interpret mode; on a GPU the kernels' dots (and lax's) use TF32
F32_TOL = 2e-5 if jax.default_backend() != "gpu" else 5e-3


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _arrays(shape, kernel_shape, strides, pads, dtype, clients=CLIENTS):
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (clients, *shape), dtype)
    k = jax.random.normal(keys[1], (clients, *kernel_shape), dtype)
    out = jax.eval_shape(lambda x, k: lax.conv_general_dilated(x, k, strides, pads, dimension_numbers=NHWC),
                         x[0], k[0]).shape
    return x, k, jax.random.normal(keys[2], (clients, *out), dtype)


def _per_client(strides, pads, kernel_axis=0):
    """(reference, pallas): each ``(x, k, ct) -> (conv, its VJP)`` of every client. The Pallas one is a vmap over
    clients; the reference lax's convolution client by client (a vmap of it is a grouped convolution, which
    XLA:CPU runs slowly in float64)."""
    def of(conv):
        f = lambda x, k: conv(x, k, strides, pads)  # noqa: E731
        return lambda x, k, c: (f(x, k), jax.vjp(f, x, k)[1](c))

    reference = jax.jit(of(lambda x, k, s, p: lax.conv_general_dilated(x, k, s, p, dimension_numbers=NHWC)))

    def per_client(x, k, ct):
        outs = [reference(x[i], k if kernel_axis is None else k[i], ct[i]) for i in range(x.shape[0])]
        return jax.tree.map(lambda *a: jnp.stack(a), *outs)

    return per_client, jax.jit(jax.vmap(of(conv2d_pallas), (0, kernel_axis, 0)))


def _assert_close(a, b, tol):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        scale = max(float(jnp.abs(v).max()), 1.0)
        np.testing.assert_allclose(np.asarray(u) / scale, np.asarray(v) / scale, rtol=0, atol=tol)


@pytest.mark.parametrize("case", CASES)
def test_forward_and_both_gradients_per_client_equal_lax_conv_in_float64(x64, case):
    shape, kernel_shape, strides, pads = CASES[case]
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.float64)
    reference, pallas = _per_client(strides, pads)
    _assert_close(pallas(x, k, ct), reference(x, k, ct), 1e-12)


def test_float32_and_a_shared_kernel():
    """float32 (accumulated in float32, as lax's), and one kernel for every client (the mapped axis joins the
    batch: one launch)."""
    shape, kernel_shape, strides, pads = CASES["fedavgcnn_conv2"]
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.float32)
    reference, pallas = _per_client(strides, pads)
    _assert_close(pallas(x, k, ct), reference(x, k, ct), F32_TOL)
    reference, pallas = _per_client(strides, pads, kernel_axis=None)
    _assert_close(pallas(x, k[0], ct), reference(x, k[0], ct), F32_TOL)


def _conv_and_vjp(strides, pads):
    """(x, k, ct) -> (the Pallas convolution, its VJP): one forward pass and the two gradient pieces."""
    def f(x, k, c):
        y, vjp = jax.vjp(lambda x, k: conv2d_pallas(x, k, strides, pads), x, k)
        return y, vjp(c)
    return f


def _pallas_calls(fn, *args):
    """(the grids of the pallas_call equations in ``fn``'s jaxpr, every primitive's name), nested jaxprs included."""
    grids, names = [], set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            if eqn.primitive.name == "pallas_call":
                grids.append(eqn.params["grid_mapping"].grid)
            for sub in jax_core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return grids, names


def test_a_vmap_of_clients_is_one_kernel_launch_per_piece():
    """Forward, input gradient, kernel gradient: three launches for any number of clients, the client the
    grid's first axis (not a grouped convolution, not a loop)."""
    shape, kernel_shape, strides, pads = CASES["strided_padded"]
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.float32, clients=5)
    grids, names = _pallas_calls(jax.vmap(_conv_and_vjp(strides, pads)), x, k, ct)
    assert len(grids) == 3 and all(g[0] == 5 for g in grids), grids
    assert "conv_general_dilated" not in names


def _triton_module(fn, *args) -> str:
    """``fn``'s StableHLO lowered for a CUDA GPU (no GPU needed): the Pallas kernels' Triton lowering runs."""
    from fedjax_pfl.models import implicit_gemm

    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(implicit_gemm, "interpret_mode", lambda: False)
        return jax.export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=checks)(*shapes).mlir_module()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernels_lower_to_triton_for_a_gpu(dtype):
    """Every kernel passes Pallas's Triton lowering (power-of-two tiles, 2-D dots, masked gathers), forward and
    both gradients under vmap, the fused updates too; what a GPU would compile from the custom calls."""
    shape, kernel_shape, strides, pads = CASES["strided_padded"]
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, dtype)
    module = _triton_module(jax.vmap(_conv_and_vjp(strides, pads)), x, k, ct)
    assert module.count("__gpu$xla.gpu.triton") == 3
    sgd = fused_sgd.SGD(momentum=0.9, weight_decay=1e-3)
    w = k.astype(jnp.float32)
    fused = _triton_module(jax.vmap(lambda x, c, w: fused_sgd.conv_kernel_grad_sgd(
        x, c, w, w, 0.1, strides, pads, sgd)), x, ct, w)
    dense = _triton_module(jax.vmap(lambda x, c, w: fused_sgd.dense_kernel_grad_sgd(
        x, c, w, w, 0.1, sgd)), x.reshape(CLIENTS, 2, -1), ct.reshape(CLIENTS, 2, -1)[..., :6],
        jnp.zeros((CLIENTS, x[0, 0].size, 6), jnp.float32))
    assert fused.count("__gpu$xla.gpu.triton") == 1 and dense.count("__gpu$xla.gpu.triton") == 1


def test_models_equal_native_outputs_and_grads():
    """FedAvgCNN (on 16x16 inputs: a smaller compile): logits and every parameter gradient as with lax's
    convolution."""
    pallas, native = (build_model("fedavgcnn", (16, 16, 1), 10, conv_impl=impl) for impl in ("pallas", "native"))
    variables = native.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 16, 16, 1))

    def grads(model):
        loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, x).logits))  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(variables["params"])

    _assert_close(grads(pallas), grads(native), F32_TOL)


def test_auto_never_selects_pallas():
    assert {resolve_conv_impl("auto", backend) for backend in ("cpu", "gpu", "tpu")} == {"direct", "native"}
    assert resolve_conv_impl("pallas") == "pallas"


# ------------------------------------------------------------------ fused SGD --


def _optax_step(grad, w, trace, lr, sgd):
    """The unfused reference: the gradient, then kernels/optim.py's SGD (optax, PyTorch's semantics)."""
    opt = make_optimizer("sgd", lr, sgd.momentum, sgd.weight_decay)
    state = opt.init(w)
    if sgd.momentum:  # start from the given momentum buffer
        state = jax.tree.map(lambda s: trace if s.shape == w.shape else s, state)
    updates, state = opt.update(grad, state, w)
    new_trace = [s for s in jax.tree.leaves(state) if s.shape == w.shape]
    return optax.apply_updates(w, updates), (new_trace[0] if new_trace else trace)


@pytest.mark.parametrize("sgd", [fused_sgd.SGD(), fused_sgd.SGD(momentum=0.9, weight_decay=0.01)],
                         ids=["plain", "momentum_decay"])
def test_fused_conv_and_dense_updates_equal_gradient_then_optimizer_in_float64(x64, sgd):
    """Per client (vmap, each its own learning rate): the new kernel and momentum buffer of one step equal
    lax's kernel gradient followed by make_optimizer('sgd', ...)'s update."""
    shape, kernel_shape, strides, pads = CASES["strided_padded"]
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.float64)
    trace, lr = jnp.cos(k), jnp.array([0.1, 0.05, 0.2])

    def conv_reference(x, c, w, m, lr):
        grad = jax.vjp(lambda w: lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=NHWC), w)[1](c)[0]
        return _optax_step(grad, w, m, lr, sgd)

    fused = jax.jit(jax.vmap(lambda *a: fused_sgd.conv_kernel_grad_sgd(*a, strides, pads, sgd)))
    _assert_close(fused(x, ct, k, trace, lr), jax.vmap(conv_reference)(x, ct, k, trace, lr), 1e-12)

    xd, dy = x.reshape(CLIENTS, 2, -1), ct.reshape(CLIENTS, 2, -1)
    w = jax.random.normal(jax.random.key(5), (CLIENTS, xd.shape[-1], dy.shape[-1]), jnp.float64)
    dense_reference = lambda x, c, w, m, lr: _optax_step(x.T @ c, w, m, lr, sgd)  # noqa: E731
    fused = jax.jit(jax.vmap(lambda *a: fused_sgd.dense_kernel_grad_sgd(*a, sgd)))
    _assert_close(fused(xd, dy, w, jnp.sin(w), lr), jax.vmap(dense_reference)(xd, dy, w, jnp.sin(w), lr), 1e-12)
