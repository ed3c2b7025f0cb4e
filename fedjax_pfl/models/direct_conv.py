"""A convolution whose forward pass and both gradients are each one NHWC x HWIO convolution (``conv_impl='direct'``).

XLA:CPU gives a convolution to its library kernels (YNNPACK in the jax this
project pins) only in the canonical form: NHWC input, HWIO kernel, NHWC
output (``dim_labels=b01f_01io->b01f``), no padding in the window. JAX's
own transpose rules give the two gradients other dimension orders; at the
top of a program XLA:CPU rewrites those with transposes, inside a loop body
(``lax.scan``, ``lax.map``, a while loop: every local training loop) it does
not, and runs them with naive loops (benchmarks/RESULTS.md). Here each piece
is written in the canonical form itself (a custom VJP):

* forward: the input, explicitly padded, convolved VALID with the kernel;
* input gradient, stride 1: the output gradient padded by ``k - 1 - pad``
  convolved with the kernel flipped in space, its in/out axes swapped. That
  form computes every input position from a full window, so it multiplies
  zeros of the padding where the output is much smaller than the input (a
  5x5 VALID convolution of a 12x12 map: 2.25x the useful work), and for
  strides > 1 it would convolve mostly inserted zeros. Past
  `PADDED_WORK_LIMIT` it is the transpose of im2col's matmul instead (one
  matmul, then the patches' pads and adds);
* kernel gradient: the padded input with its batch and channel axes swapped
  (``[C, H, W, B]``) convolved with the output gradient as the kernel
  (``[Ho, Wo, B, O]``, dilated by the strides), then transposed to HWIO; with
  many input channels and output positions (`IM2COL_KERNEL_GRAD_CHANNELS`)
  im2col's matmul instead, its patches transposed first (one canonical
  matmul).

Pads and transposes sit behind ``lax.optimization_barrier``: XLA would fold
them back into the convolution's window and dimension numbers.

Under ``vmap`` with a kernel per mapped element (clients with their own
weights: the ``vmap`` and ``chunked`` client mappings) a convolution would
become a grouped one, which XLA:CPU runs slowly; each piece is then one
batched matmul over im2col patches (the client axis as a ``dot_general``
batch dimension). With one kernel for all (evaluating a global model) the
mapped axis joins the batch instead.

Values equal ``lax.conv_general_dilated``'s up to float rounding
(tests/test_direct_conv.py: float64, forward, both gradients, under vmap,
Hessian-vector products). ``jax.jvp`` of a gradient (forward-over-reverse,
as Per-FedAvg's Hessian-vector product) is defined; ``jax.jvp`` of the
convolution itself (a custom VJP) and a gradient of a gradient (the vmap
rules have no transpose) are not: no method here takes either, and
``conv_impl='im2col'`` or ``'native'`` give both.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from fedjax_pfl.models.client_batching import client_mapped
from fedjax_pfl.models.conv_vjp import ConvStatic, three_op_conv
from fedjax_pfl.models.im2col import im2col_patches, im2col_transpose

NHWC = ("NHWC", "HWIO", "NHWC")
# Input positions / output positions above which the input gradient is im2col's transpose, not a padded
# convolution: where the padded convolution multiplies this much more than the useful work, im2col is the
# faster on XLA:CPU (benchmarks/RESULTS.md, "Convolutions without the patch tax").
PADDED_WORK_LIMIT = 1.5
# The kernel gradient is im2col's matmul (patches^T @ dy, the patches' transpose materialised) instead of the
# convolution whose window is the whole output map when the input has at least this many channels (half as
# many with a stride) and the batch at least `IM2COL_KERNEL_GRAD_ROWS` output positions: where it measured
# faster (benchmarks/RESULTS.md, "Direct convolution: the kernel gradient's two forms").
IM2COL_KERNEL_GRAD_CHANNELS = 32
IM2COL_KERNEL_GRAD_ROWS = 1024


def conv2d_direct(x: jax.Array, kernel: jax.Array, strides, pads) -> jax.Array:
    """NHWC ``x`` [B, H, W, C] convolved with HWIO ``kernel`` [kh, kw, C, O]; ``pads`` = ((lo, hi), (lo, hi)).

    >>> x, k = jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 5))
    >>> conv2d_direct(x, k, (1, 1), ((1, 1), (1, 1)))[0, :, :, 0]
    Array([[ 8., 12., 12.,  8.],
           [12., 18., 18., 12.],
           [12., 18., 18., 12.],
           [ 8., 12., 12.,  8.]], dtype=float32)
    """
    return _conv(x, kernel, strides, pads)


def _pad(x, pads):
    """``x`` [B, H, W, C] zero-padded in H and W, as its own op (not folded into a convolution's window)."""
    if not any(p for pair in pads for p in pair):
        return x
    return lax.optimization_barrier(jnp.pad(x, [(0, 0), *pads, (0, 0)]))


def _forward(x, kernel, spec):
    return lax.conv_general_dilated(_pad(x, spec.pads), kernel, spec.strides, "VALID", dimension_numbers=NHWC)


def _input_grad(dy, kernel, spec):
    (h, w, _), (kh, kw, _, _), strides = spec.in_shape, spec.kernel_shape, spec.strides
    ho, wo = dy.shape[1:3]
    if strides != (1, 1) or h * w > PADDED_WORK_LIMIT * ho * wo:
        return _batched_input_grad(dy[None], kernel[None], spec)[0]
    flipped = lax.optimization_barrier(jnp.transpose(kernel[::-1, ::-1], (0, 1, 3, 2)))
    lo = (kh - 1 - spec.pads[0][0], kw - 1 - spec.pads[1][0])
    pads = ((lo[0], h + kh - 1 - ho - lo[0]), (lo[1], w + kw - 1 - wo - lo[1]))
    full = lax.pad(dy, jnp.zeros((), dy.dtype), [(0, 0, 0), (*pads[0], 0), (*pads[1], 0), (0, 0, 0)])
    return lax.conv_general_dilated(lax.optimization_barrier(full), flipped, (1, 1), "VALID",
                                    dimension_numbers=NHWC)


def _im2col_kernel_grad(dy, spec) -> bool:
    """Whether the kernel gradient goes by im2col's matmul (see `IM2COL_KERNEL_GRAD_CHANNELS`)."""
    c, strided = spec.kernel_shape[2], spec.strides != (1, 1)
    wide = c >= IM2COL_KERNEL_GRAD_CHANNELS or (strided and 2 * c >= IM2COL_KERNEL_GRAD_CHANNELS)
    return wide and dy.shape[0] * dy.shape[1] * dy.shape[2] >= IM2COL_KERNEL_GRAD_ROWS


def _kernel_grad(x, dy, spec):
    (kh, kw, c, o), strides = spec.kernel_shape, spec.strides
    if _im2col_kernel_grad(dy, spec):
        patches = im2col_patches(x, (kh, kw), strides, spec.pads).reshape(-1, kh * kw * c)
        grad = jnp.dot(lax.optimization_barrier(patches.T), dy.reshape(-1, o))  # [kh*kw*C, O], canonical
        return grad.reshape(spec.kernel_shape)
    x = _pad(x, spec.pads)
    h, w = x.shape[1:3]
    ho, wo = dy.shape[1:3]
    x_t = lax.optimization_barrier(jnp.transpose(x, (3, 1, 2, 0)))  # [C, H, W, B]
    dy_t = lax.optimization_barrier(jnp.transpose(dy, (1, 2, 0, 3)))  # [Ho, Wo, B, O]
    # rows (ho - 1) * s + kh .. h - 1 of the input feed no output: cropped by a negative high pad
    crop = ((0, (ho - 1) * strides[0] + kh - h), (0, (wo - 1) * strides[1] + kw - w))
    grad = lax.conv_general_dilated(x_t, dy_t, (1, 1), crop, rhs_dilation=strides, dimension_numbers=NHWC)
    return jnp.transpose(grad, (1, 2, 0, 3))  # [C, kh, kw, O] -> [kh, kw, C, O]


# ------------------------------------------- clients with their own kernels --


def _batched_forward(x, kernel, spec):
    """One client's convolution per leading index: x [V, B, H, W, C], kernel [V, kh, kw, C, O]."""
    kh, kw, c, o = spec.kernel_shape
    patches = im2col_patches(x, (kh, kw), spec.strides, spec.pads)  # [V, B, Ho, Wo, kh*kw*C]
    return jnp.einsum("vbhwk,vko->vbhwo", patches, kernel.reshape(-1, kh * kw * c, o))


def _batched_input_grad(dy, kernel, spec):
    kh, kw, c, o = spec.kernel_shape
    dpatches = jnp.einsum("vbhwo,vko->vbhwk", dy, kernel.reshape(-1, kh * kw * c, o))
    return im2col_transpose(dpatches, spec.in_shape, (kh, kw), spec.strides, spec.pads)


def _batched_kernel_grad(x, dy, spec):
    kh, kw, c, o = spec.kernel_shape
    patches = im2col_patches(x, (kh, kw), spec.strides, spec.pads)
    return jnp.einsum("vbhwk,vbhwo->vko", patches, dy).reshape((-1,) + spec.kernel_shape)


@functools.lru_cache(maxsize=None)
def _ops(spec: ConvStatic):
    """(forward(x, kernel), input_grad(dy, kernel), kernel_grad(x, dy)) of one convolution, each with its vmap rule."""
    forward = client_mapped(lambda x, kernel: _forward(x, kernel, spec),
                            lambda x, k: _batched_forward(x, k, spec), fold=(0, 1))
    input_grad = client_mapped(lambda dy, kernel: _input_grad(dy, kernel, spec),
                               lambda dy, k: _batched_input_grad(dy, k, spec), fold=(0, 1))
    kernel_grad = client_mapped(lambda x, dy: _kernel_grad(x, dy, spec),
                                lambda x, dy: _batched_kernel_grad(x, dy, spec))
    return forward, input_grad, kernel_grad


_conv = three_op_conv(_ops)
