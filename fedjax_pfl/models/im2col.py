"""The im2col patches of an NHWC input: every kernel window as one row, so a convolution is one matmul.

Used by the ``'im2col'`` convolution (conv.py) and by the ``'direct'`` one
(direct_conv.py) when clients with their own kernels are vmapped.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax


def im2col_patches(
    x: jax.Array, kernel_size: Sequence[int], strides: Sequence[int],
    pads: Sequence[tuple[int, int]],
) -> jax.Array:
    """Patches ``[..., Ho, Wo, kh*kw*C]`` of an NHWC input, ordered (kh, kw, C).

    The kh*kw shifted windows of the padded input are cut with static strided
    slices and stacked; (kh, kw, C) is the row-major flattening of an HWIO
    kernel, so ``patches @ kernel.reshape(kh*kw*C, O)`` is the convolution.

    >>> im2col_patches(jnp.arange(9.0).reshape(1, 3, 3, 1), (2, 2), (1, 1), [(0, 0), (0, 0)])[0, 0, 0]
    Array([0., 1., 3., 4.], dtype=float32)
    """
    kh, kw = kernel_size
    sh, sw = strides
    lead = x.ndim - 3
    x = jnp.pad(x, [(0, 0)] * lead + [tuple(pads[0]), tuple(pads[1]), (0, 0)])
    h, w, c = x.shape[-3:]
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    if ho <= 0 or wo <= 0:
        raise ValueError(
            f"a {kh}x{kw} window does not fit a padded {h}x{w} input")

    def window(i, j):
        start = (0,) * lead + (i, j, 0)
        limit = x.shape[:lead] + (i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1, c)
        return lax.slice(x, start, limit, (1,) * lead + (sh, sw, 1))

    if kh == kw == 1:
        return window(0, 0)
    cols = [window(i, j) for i in range(kh) for j in range(kw)]
    patches = jnp.stack(cols, axis=-2)  # [..., Ho, Wo, kh*kw, C]
    return patches.reshape(patches.shape[:-2] + (kh * kw * c,))


def im2col_transpose(
    dpatches: jax.Array, in_shape: Sequence[int], kernel_size: Sequence[int], strides: Sequence[int],
    pads: Sequence[tuple[int, int]],
) -> jax.Array:
    """The adjoint of `im2col_patches`: ``[..., Ho, Wo, kh*kw*C]`` -> ``[..., H, W, C]`` (``in_shape`` = (H, W, C)).

    Every window's gradient is zero-padded back to its place in the padded
    input (interior padding for the strides) and the windows are summed;
    the convolution's own padding is then cropped.

    >>> im2col_transpose(jnp.ones((1, 2, 2, 4)), (3, 3, 1), (2, 2), (1, 1), [(0, 0), (0, 0)])[0, :, :, 0]
    Array([[1., 2., 1.],
           [2., 4., 2.],
           [1., 2., 1.]], dtype=float32)
    """
    kh, kw = kernel_size
    sh, sw = strides
    h, w, c = in_shape
    hp, wp = h + pads[0][0] + pads[0][1], w + pads[1][0] + pads[1][1]
    ho, wo = dpatches.shape[-3:-1]
    lead = dpatches.ndim - 3
    windows = dpatches.reshape(dpatches.shape[:-1] + (kh * kw, c))
    zero = jnp.zeros((), dpatches.dtype)
    total = None
    for i in range(kh):
        for j in range(kw):
            config = [(0, 0, 0)] * lead + [(i, hp - i - (ho - 1) * sh - 1, sh - 1),
                                           (j, wp - j - (wo - 1) * sw - 1, sw - 1), (0, 0, 0)]
            placed = lax.pad(windows[..., i * kw + j, :], zero, config)
            total = placed if total is None else total + placed
    # crop the padding (a negative pad; a negative pad on the high side only where the pad was)
    crop = [(0, 0, 0)] * lead + [(-pads[0][0], -pads[0][1], 0), (-pads[1][0], -pads[1][1], 0), (0, 0, 0)]
    return lax.pad(total, zero, crop)
