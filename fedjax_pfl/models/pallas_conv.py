"""A convolution whose forward pass and both gradients write no patch tensor (``conv_impl='pallas'``).

Each piece is one implicit GEMM (implicit_gemm.py) over the flat NHWC input,
HWIO kernel and NHWC output gradient; the im2col matrix exists only as index
arithmetic inside the kernel:

* forward: rows (b, ho, wo), columns o, contraction (i, j, c):
  ``y[b, ho, wo, o] = sum x[b, ho*s + i - pad, wo*s + j - pad, c] k[i, j, c, o]``,
  window positions in the padding read as zero;
* input gradient: rows (b, h, w), columns c, contraction (i, j, o):
  ``dx[b, h, w, c] = sum dy[b, (h + pad - i) / s, (w + pad - j) / s, o] k[i, j, c, o]``
  over the taps where the division is exact and in range (strided
  convolutions skip the others by the mask);
* kernel gradient: rows (i, j, c), columns o, contraction (b, ho, wo):
  ``dk[i, j, c, o] = sum x[b, ho*s + i - pad, wo*s + j - pad, c] dy[b, ho, wo, o]``;
  its A operand is the forward pass's A, transposed by swapping the indices.

Under ``vmap`` with a kernel per client each piece is one kernel launch with
the client as the grid's first axis (client_batching.py); with one kernel for
all, the mapped axis joins the batch. Values equal ``lax.conv_general_dilated``
up to float rounding (tests/test_pallas_conv.py, Pallas interpret mode,
float32 and float64, under vmap over clients). As for ``'direct'``, ``jax.jvp``
of the convolution itself and gradients of gradients are not defined (custom
VJP); ``'native'`` and ``'im2col'`` give them.

On a GPU the kernels lower through Pallas's Triton backend; on the CPU they
run in interpret mode, which is for tests only (slow). ``conv_impl='auto'``
does not select this implementation (conv.py).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from fedjax_pfl.models import implicit_gemm as gemm_lib
from fedjax_pfl.models.client_batching import client_mapped, one_client
from fedjax_pfl.models.conv_vjp import ConvStatic, three_op_conv

# tile caps: (rows, columns, contraction); the kernel gradient contracts over the batch's positions (long)
TILES = (64, 64, 32)
KERNEL_GRAD_TILES = (64, 64, 64)


class Geometry(NamedTuple):
    """The static part of one convolution of a batch."""

    batch: int
    in_shape: tuple  # (H, W, C)
    kernel_shape: tuple  # (kh, kw, C, O)
    strides: tuple
    pads: tuple  # ((lo, hi), (lo, hi))

    @property
    def out_hw(self) -> tuple:
        (h, w, _), (kh, kw, _, _), (sh, sw), ((pt, pb), (pl_, pr)) = (
            self.in_shape, self.kernel_shape, self.strides, self.pads)
        return (h + pt + pb - kh) // sh + 1, (w + pl_ + pr - kw) // sw + 1


def conv2d_pallas(x: jax.Array, kernel: jax.Array, strides, pads) -> jax.Array:
    """NHWC ``x`` [B, H, W, C] convolved with HWIO ``kernel`` [kh, kw, C, O]; ``pads`` = ((lo, hi), (lo, hi)).

    >>> y = conv2d_pallas(jnp.ones((1, 3, 3, 2)), jnp.ones((2, 2, 2, 4)), (1, 1), ((0, 0), (0, 0)))
    >>> y.shape, float(y[0, 0, 0, 0])  # 2 x 2 window, 2 channels of ones
    ((1, 2, 2, 4), 8.0)
    """
    return _conv(x, kernel, strides, pads)


# ------------------------------------------------------------ index maps --


def _divmod(a, q: int):
    """(a // q, a % q) for non-negative int32 ``a`` (truncating division: what the Triton lowering takes)."""
    q = jnp.int32(q)
    return lax.div(a, q), lax.rem(a, q)


def input_window(g: Geometry):
    """(v, rows (b, ho, wo), cols (i, j, c)) -> the input element the im2col matrix holds there."""
    (h, w, c), (kh, kw, _, _), (sh, sw), ((pt, _), (pl_, _)) = g.in_shape, g.kernel_shape, g.strides, g.pads
    ho_n, wo_n = g.out_hw
    m, k = g.batch * ho_n * wo_n, kh * kw * c

    def index(v, rows, cols):
        b, rest = _divmod(rows, ho_n * wo_n)
        ho, wo = _divmod(rest, wo_n)
        i, rest = _divmod(cols, kw * c)
        j, ch = _divmod(rest, c)
        hi, wi = ho * sh + i - pt, wo * sw + j - pl_
        valid = (rows < m) & (cols < k) & (hi >= 0) & (hi < h) & (wi >= 0) & (wi < w)
        return v * (g.batch * h * w * c) + ((b * h + hi) * w + wi) * c + ch, valid

    return index


def transposed(index):
    """The index map of the transposed matrix: ``(v, rows, cols) -> index(v, cols, rows)``."""
    return lambda v, rows, cols: index(v, cols, rows)


def kernel_taps(g: Geometry):
    """(v, rows (i, j, c), cols o) -> the kernel element; the forward pass's B operand."""
    kh, kw, c, o = g.kernel_shape

    def index(v, rows, cols):
        return v * (kh * kw * c * o) + rows * o + cols, (rows < kh * kw * c) & (cols < o)

    return index


def flipped_kernel_taps(g: Geometry):
    """(v, rows (i, j, o), cols c) -> k[i, j, c, o]; the input gradient's B operand."""
    kh, kw, c, o = g.kernel_shape

    def index(v, rows, cols):
        tap, oc = _divmod(rows, o)
        return v * (kh * kw * c * o) + (tap * c + cols) * o + oc, (rows < kh * kw * o) & (cols < c)

    return index


def output_window(g: Geometry):
    """(v, rows (b, h, w), cols (i, j, o)) -> the output gradient element that input position meets through
    tap (i, j), where one exists; the input gradient's A operand."""
    (h, w, _), (kh, kw, _, o), (sh, sw), ((pt, _), (pl_, _)) = g.in_shape, g.kernel_shape, g.strides, g.pads
    ho_n, wo_n = g.out_hw

    def index(v, rows, cols):
        b, rest = _divmod(rows, h * w)
        hi, wi = _divmod(rest, w)
        i, rest = _divmod(cols, kw * o)
        j, oc = _divmod(rest, o)
        th, tw = hi + pt - i, wi + pl_ - j
        ho, rh = _divmod(jnp.maximum(th, 0), sh)
        wo, rw = _divmod(jnp.maximum(tw, 0), sw)
        valid = ((rows < g.batch * h * w) & (cols < kh * kw * o) & (th >= 0) & (tw >= 0) & (rh == 0) & (rw == 0)
                 & (ho < ho_n) & (wo < wo_n))
        return v * (g.batch * ho_n * wo_n * o) + ((b * ho_n + ho) * wo_n + wo) * o + oc, valid

    return index


def output_rows(g: Geometry):
    """(v, rows (b, ho, wo), cols o) -> the output (gradient) element; the kernel gradient's B operand."""
    ho_n, wo_n = g.out_hw
    m, o = g.batch * ho_n * wo_n, g.kernel_shape[3]
    return gemm_lib.out_index(o, m)


# --------------------------------------------------------------- products --


def forward_gemm(g: Geometry) -> gemm_lib.Gemm:
    kh, kw, c, o = g.kernel_shape
    m, k = g.batch * g.out_hw[0] * g.out_hw[1], kh * kw * c
    tiles = tuple(gemm_lib.tile(s, cap) for s, cap in zip((m, o, k), TILES))
    return gemm_lib.Gemm(m, o, k, input_window(g), kernel_taps(g), tiles)


def input_grad_gemm(g: Geometry) -> gemm_lib.Gemm:
    (h, w, c), (kh, kw, _, o) = g.in_shape, g.kernel_shape
    m, k = g.batch * h * w, kh * kw * o
    tiles = tuple(gemm_lib.tile(s, cap) for s, cap in zip((m, c, k), TILES))
    return gemm_lib.Gemm(m, c, k, output_window(g), flipped_kernel_taps(g), tiles)


def kernel_grad_gemm(g: Geometry) -> gemm_lib.Gemm:
    kh, kw, c, o = g.kernel_shape
    m, k = kh * kw * c, g.batch * g.out_hw[0] * g.out_hw[1]
    tiles = tuple(gemm_lib.tile(s, cap) for s, cap in zip((m, o, k), KERNEL_GRAD_TILES))
    return gemm_lib.Gemm(m, o, k, transposed(input_window(g)), output_rows(g), tiles)


def _batched_forward(x, kernel, spec):
    """One client's convolution per leading index: x [V, B, H, W, C], kernel [V, kh, kw, C, O]."""
    v, g = x.shape[0], _geometry(spec, x.shape[1])
    y = gemm_lib.run(forward_gemm(g), v, x.reshape(-1), kernel.reshape(-1), x.dtype)
    return y.reshape((v, g.batch, *g.out_hw, g.kernel_shape[3]))


def _batched_input_grad(dy, kernel, spec):
    v, g = dy.shape[0], _geometry(spec, dy.shape[1])
    dx = gemm_lib.run(input_grad_gemm(g), v, dy.reshape(-1), kernel.reshape(-1), dy.dtype)
    return dx.reshape((v, g.batch, *g.in_shape))


def _batched_kernel_grad(x, dy, spec):
    v, g = x.shape[0], _geometry(spec, x.shape[1])
    dk = gemm_lib.run(kernel_grad_gemm(g), v, x.reshape(-1), dy.reshape(-1), x.dtype)
    return dk.reshape((v, *g.kernel_shape))


@functools.lru_cache(maxsize=None)
def _ops(spec: ConvStatic):
    """(forward(x, kernel), input_grad(dy, kernel), kernel_grad(x, dy)) of one convolution, each with its vmap rule."""
    forward = functools.partial(_batched_forward, spec=spec)
    input_grad = functools.partial(_batched_input_grad, spec=spec)
    kernel_grad = functools.partial(_batched_kernel_grad, spec=spec)
    return (client_mapped(one_client(forward), forward, fold=(0, 1)),
            client_mapped(one_client(input_grad), input_grad, fold=(0, 1)),
            client_mapped(one_client(kernel_grad), kernel_grad))


def _geometry(static: ConvStatic, batch: int) -> Geometry:
    return Geometry(batch, *static)


_conv = three_op_conv(_ops)
