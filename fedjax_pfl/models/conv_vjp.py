"""A convolution as three ops bound by one custom VJP: forward, input gradient, kernel gradient.

The 'direct' and 'pallas' convolutions (direct_conv.py, pallas_conv.py) each
write the forward pass ``forward(x, kernel)`` and both gradients,
``input_grad(dy, kernel)`` and ``kernel_grad(x, dy)``, as ops of their own
(each with a vmap rule over clients); `three_op_conv` makes them one
differentiable convolution. The ops depend on the convolution's static part
(`ConvStatic`), given to an ``ops(static)`` function that should cache.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax


class ConvStatic(NamedTuple):
    """The static part of one convolution (the batch size is read from the arrays)."""

    in_shape: tuple  # [H, W, C]
    kernel_shape: tuple  # [kh, kw, C, O]
    strides: tuple
    pads: tuple  # ((lo, hi), (lo, hi))


def conv_static(x, kernel, strides, pads) -> ConvStatic:
    """The `ConvStatic` of NHWC ``x`` [B, H, W, C] and HWIO ``kernel`` with ``strides`` and ``pads``."""
    return ConvStatic(tuple(x.shape[1:]), tuple(kernel.shape), tuple(int(s) for s in strides),
                      tuple((int(lo), int(hi)) for lo, hi in pads))


def three_op_conv(ops: Callable[[ConvStatic], tuple]) -> Callable:
    """``conv(x, kernel, strides, pads)`` whose value is ``ops(static)[0](x, kernel)`` and whose VJP is
    ``(ops(static)[1](dy, kernel), ops(static)[2](x, dy))``.

    >>> import jax.numpy as jnp
    >>> ops = lambda s: (lambda x, k: x * k, lambda dy, k: dy * k, lambda x, dy: x * dy)
    >>> conv = three_op_conv(ops)
    >>> jax.grad(lambda k: conv(jnp.ones((1, 1, 1, 1)) * 3.0, k, (1, 1), ((0, 0), (0, 0))).sum())(jnp.ones((1, 1, 1, 1)))
    Array([[[[3.]]]], dtype=float32)
    """
    @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
    def conv(x, kernel, static):
        return ops(static)[0](x, kernel)

    def conv_fwd(x, kernel, static):
        return ops(static)[0](x, kernel), (x, kernel)

    def conv_bwd(static, residuals, dy):
        x, kernel = residuals
        _, input_grad, kernel_grad = ops(static)
        return input_grad(dy, kernel), kernel_grad(x, dy)

    conv.defvjp(conv_fwd, conv_bwd)
    return lambda x, kernel, strides, pads: conv(x, kernel, conv_static(x, kernel, strides, pads))
