"""2-D convolution and pooling layers whose implementation is chosen per backend.

On XLA:CPU a convolution inside a loop body (``lax.scan``/``lax.map``/while)
gets naive backward kernels (jax-ml/jax#12868), and it is worse under ``vmap``
with per-client weights. This file holds layers that compute the same values
four ways:

* ``'direct'`` (direct_conv.py): the forward pass and both gradients are
  each one convolution in the form XLA:CPU gives to its library kernels
  (YNNPACK), written out by a custom VJP so that no patch tensor is built;
  under ``vmap`` with a kernel per client, one batched matmul over im2col
  patches per piece. The CPU default: less CPU time per FedAvgCNN /
  ResNet-8 SGD step than im2col inside ``lax.scan`` (benchmarks/RESULTS.md),
  and the GPU default too (faster than native on an H200, see resolve_conv_impl).
* ``'im2col'``: the kh*kw shifted windows of the padded input are cut with
  static strided slices and stacked into patches ``[B, Ho, Wo, kh*kw*C]``
  (im2col.py), then one matmul with the kernel reshaped to ``[kh*kw*C, O]``.
  Its backward pass is matmuls plus pads and adds (the transpose of the
  slices): no convolution at all. Measured faster in ``scan`` + ``vmap`` on
  CPU than ``lax.conv_general_dilated_patches`` (which is itself a grouped
  convolution whose transpose is a convolution) and than native convolution.
* ``'native'``: ``lax.conv_general_dilated`` with JAX's own gradients (the
  default on TPU, where nothing was measured; on an H200 inside the engine's
  client loop it ran slower than 'direct').
* ``'pallas'`` (pallas_conv.py): the forward pass and both gradients as
  implicit-GEMM Pallas kernels that write no patch tensor, the client as a
  grid axis under ``vmap``; for GPUs (Pallas's Triton lowering), on the CPU
  only in Pallas's interpret mode (tests; slow). 'auto' does not select it
  (see `resolve_conv_impl`).

All use the same parameter tree (``kernel [kh, kw, C, O]``, ``bias [O]``,
flax's default initialisers), so parameters move freely between them.
Max/avg pooling with non-overlapping windows is a reshape plus a reduction
(fast inside ``scan`` on every backend; ``reduce_window``'s backward,
select_and_scatter, is slower on CPU, more so under ``vmap``). Where a window
holds tied maxima the gradient is shared equally between them (JAX's rule for
``max``), not given to the first one.

This file holds no models; see ``networks.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.dtypes import promote_dtype
from jax import lax

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.models.direct_conv import conv2d_direct
from fedjax_pfl.models.im2col import im2col_patches
from fedjax_pfl.models.pallas_conv import conv2d_pallas

CONV_IMPLS = ("direct", "im2col", "native", "pallas")

Padding = Union[str, int, Sequence[tuple[int, int]]]


def resolve_conv_impl(impl: str = "auto", backend: str | None = None) -> str:
    """Returns one of `CONV_IMPLS`; 'auto' picks 'direct' on CPU and GPU (measured faster on both), else 'native'.

    On an H200, FedAvg over 100 clients ran more rounds a second with 'direct' than 'native' for every model
    measured (benchmarks/RESULTS.md, the GPU suites). No TPU was measured, so a TPU keeps JAX's own.
    'pallas' is chosen only by name: 'auto' never selects it."""
    if impl == "auto":
        backend = backend or jax.default_backend()
        return "direct" if backend in ("cpu", "gpu") else "native"
    if impl not in CONV_IMPLS:
        raise UserError(
            f"Unknown conv implementation {impl!r}; use one of 'auto', "
            f"{', '.join(repr(i) for i in CONV_IMPLS)}."
        )
    return impl


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise ValueError(f"expected an int or a pair, got {v}")
    return v


def explicit_padding(
    spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
    padding: Padding,
) -> list[tuple[int, int]]:
    """Padding as ``[(lo, hi), (lo, hi)]``; strings follow ``lax`` exactly."""
    if isinstance(padding, str):
        return list(lax.padtype_to_pads(spatial, kernel, strides, padding.upper()))
    if isinstance(padding, int):
        return [(padding, padding)] * 2
    pads = [tuple(int(a) for a in p) for p in padding]
    if len(pads) != 2 or any(len(p) != 2 for p in pads):
        raise ValueError(f"padding must be 'SAME', 'VALID', an int or 2 pairs, got {padding}")
    return pads


def conv2d(
    x: jax.Array, kernel: jax.Array, strides: int | Sequence[int] = 1,
    padding: Padding = "SAME", impl: str = "auto",
) -> jax.Array:
    """NHWC x HWIO -> NHWC convolution (cross-correlation, like every DL library)."""
    impl = resolve_conv_impl(impl)
    kh, kw, cin, cout = kernel.shape
    strides = _pair(strides)
    pads = explicit_padding(x.shape[-3:-1], (kh, kw), strides, padding)
    if impl == "native":
        return lax.conv_general_dilated(
            x, kernel, strides, pads, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    if impl == "direct":
        return conv2d_direct(x, kernel, strides, pads)
    if impl == "pallas":
        return conv2d_pallas(x, kernel, strides, pads)
    patches = im2col_patches(x, (kh, kw), strides, pads)
    return jnp.dot(patches, kernel.reshape(kh * kw * cin, cout))


class Conv2D(nn.Module):
    """A 2-D convolution over NHWC inputs with a selectable implementation.

    Attributes: ``features`` (output channels), ``kernel_size`` (int or pair),
    ``strides``, ``padding`` ('SAME', 'VALID', an int or ((lo, hi), (lo, hi))),
    ``use_bias``, ``impl`` ('direct', 'im2col', 'native', 'pallas' or 'auto': resolved when traced).
    Parameters: ``kernel [kh, kw, C, features]`` and ``bias [features]``,
    initialised as ``flax.linen.Conv`` does.
    """

    features: int
    kernel_size: int | Sequence[int] = 3
    strides: int | Sequence[int] = 1
    padding: Padding = "SAME"
    use_bias: bool = True
    impl: str = "auto"
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kh, kw = _pair(self.kernel_size)
        kernel = self.param(
            "kernel", self.kernel_init, (kh, kw, x.shape[-1], self.features),
            self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        x, kernel, bias = promote_dtype(x, kernel, bias, dtype=self.dtype)
        y = conv2d(x, kernel, self.strides, self.padding, self.impl)
        return y + bias if bias is not None else y


def _pool(x: jax.Array, window: int, stride: int | None, reduce: str) -> jax.Array:
    stride = window if stride is None else stride
    if stride != window:  # overlapping windows: no reshape form
        fn = nn.max_pool if reduce == "max" else nn.avg_pool
        return fn(x, (window, window), (stride, stride), "VALID")
    h, w, c = x.shape[-3:]
    ho, wo = h // window, w // window
    if ho == 0 or wo == 0:
        raise ValueError(f"a {window}x{window} pool does not fit a {h}x{w} input")
    x = x[..., : ho * window, : wo * window, :]  # floor mode, like PyTorch
    x = x.reshape(x.shape[:-3] + (ho, window, wo, window, c))
    return x.max(axis=(-4, -2)) if reduce == "max" else x.mean(axis=(-4, -2))


def max_pool(x: jax.Array, window: int = 2, stride: int | None = None) -> jax.Array:
    """VALID max pooling over the H, W axes of ``[..., H, W, C]`` (stride defaults to window)."""
    return _pool(x, window, stride, "max")


def avg_pool(x: jax.Array, window: int = 2, stride: int | None = None) -> jax.Array:
    """VALID average pooling over the H, W axes of ``[..., H, W, C]``."""
    return _pool(x, window, stride, "avg")
