"""conv_impl='pallas' (models/pallas_conv.py, implicit_gemm.py): lax.conv's values and gradients in Pallas
interpret mode (on a GPU, its Triton kernels), one kernel launch per piece under vmap over clients, and a Triton
lowering for a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jax_core

from fedjax_pfl.models.conv import resolve_conv_impl
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.models.pallas_conv import conv2d_pallas

NHWC = ("NHWC", "HWIO", "NHWC")
# input [B, H, W, C], kernel [kh, kw, C, O], strides, pads: one tiny shape with every form the models use at once:
# a 5x5 window (FedAvgCNN's, LeNet's), a stride (ResNet's downsampling) in H only, uneven pads, O = 17 (masked
# columns) and a contraction of 75 (three tiles, the last one masked)
CASE = ((2, 9, 10, 3), (5, 5, 3, 17), (2, 1), ((1, 0), (2, 1)))
CLIENTS = 2
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


def test_forward_and_both_gradients_per_client_equal_lax_conv_in_float64(x64):
    shape, kernel_shape, strides, pads = CASE
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.float64)
    reference, pallas = _per_client(strides, pads)
    _assert_close(pallas(x, k, ct), reference(x, k, ct), 1e-12)


def test_float32_with_one_kernel_for_every_client():
    """float32 (accumulated in float32, as lax's), one kernel for every client: the mapped axis joins the batch."""
    shape, kernel_shape, strides, pads = CASE
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.float32)
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
    shape, kernel_shape, strides, pads = CASE
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.float32, clients=3)
    grids, names = _pallas_calls(jax.vmap(_conv_and_vjp(strides, pads)), x, k, ct)
    assert len(grids) == 3 and all(g[0] == 3 for g in grids), grids
    assert "conv_general_dilated" not in names


def _triton_module(fn, *args) -> str:
    """``fn``'s StableHLO lowered for a CUDA GPU (no GPU needed): the Pallas kernels' Triton lowering runs."""
    from fedjax_pfl.models import implicit_gemm

    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(implicit_gemm, "interpret_mode", lambda: False)
        return jax.export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=checks)(*shapes).mlir_module()


def test_kernels_lower_to_triton_for_a_gpu():
    """Every kernel passes Pallas's Triton lowering (power-of-two tiles, 2-D dots, masked gathers), forward and
    both gradients under vmap, bfloat16 operands accumulated in float32: what a GPU would compile."""
    shape, kernel_shape, strides, pads = CASE
    x, k, ct = _arrays(shape, kernel_shape, strides, pads, jnp.bfloat16)
    module = _triton_module(jax.vmap(_conv_and_vjp(strides, pads)), x, k, ct)
    assert module.count("__gpu$xla.gpu.triton") == 3


def test_a_model_built_with_pallas_trains_through_its_kernels():
    """FedAvgCNN with conv_impl='pallas': a traced gradient step holds the three kernels of each of its two
    convolutions and no XLA convolution (the values are the kernels', checked above)."""
    model = build_model("fedavgcnn", (16, 16, 1), 10, conv_impl="pallas")
    params = jax.eval_shape(model.init, jax.random.key(0))["params"]
    x = jax.ShapeDtypeStruct((2, 16, 16, 1), jnp.float32)
    grid_list, names = _pallas_calls(jax.grad(lambda p, x: jnp.sum(model.apply({"params": p}, x).logits)), params, x)
    assert len(grid_list) == 6 and "conv_general_dilated" not in names, (grid_list, names)


def test_auto_never_selects_pallas():
    assert {resolve_conv_impl("auto", backend) for backend in ("cpu", "gpu", "tpu")} == {"direct", "native"}
    assert resolve_conv_impl("pallas") == "pallas"
