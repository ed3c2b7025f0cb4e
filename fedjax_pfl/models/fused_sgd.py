"""The SGD / momentum update fused into the kernel gradient's Pallas kernel (dense and conv layers).

An unfused step writes a layer's kernel gradient, then reads it back with
the weights (and the momentum buffer) to update them. Here the kernel
gradient's implicit GEMM (implicit_gemm.py) ends in an epilogue that applies
PyTorch's SGD (the update of kernels/optim.py's ``make_optimizer('sgd', lr,
momentum, weight_decay)``) to the finished tile and writes the new weights
and buffer: the gradient never reaches memory. Per tile, with ``g`` the
gradient:

    g <- g + weight_decay * w
    m <- momentum * m + g          (only with momentum > 0)
    w <- w - lr * (m or g)

``lr`` is an array (one per client under vmap: a traced learning-rate
schedule); ``momentum`` and ``weight_decay`` are static. Under ``vmap`` each
op is one kernel launch with the client as the first grid axis.

These ops compute one layer's update from that layer's input and output
gradient; wiring them into a training step (the gradient of a layer's kernel
must come from that layer alone, no other loss term) is the caller's part.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_pfl.models import implicit_gemm as gemm_lib
from fedjax_pfl.models import pallas_conv
from fedjax_pfl.models.client_batching import client_mapped, one_client

DENSE_TILES = (64, 64, 16)  # rows (inputs), columns (outputs), contraction (the batch: short)


class SGD(NamedTuple):
    """The static part of the update."""

    momentum: float = 0.0
    weight_decay: float = 0.0


def sgd_tile(g, w, m, lr, sgd: SGD):
    """One tile's (new weights, new momentum buffer or None) from gradient ``g`` (in the accumulation dtype).

    >>> w, m = sgd_tile(jnp.ones(2), jnp.ones(2), jnp.zeros(2), 0.1, SGD(momentum=0.9, weight_decay=0.5))
    >>> [round(float(a), 4) for a in (w[0], m[0])]
    [0.85, 1.5]
    """
    g = g + sgd.weight_decay * w if sgd.weight_decay else g
    if sgd.momentum:
        m = sgd.momentum * m + g
        g = m
    return w - lr * g, (m if sgd.momentum else None)


def _epilogue(gemm: gemm_lib.Gemm, sgd: SGD):
    """Writes the updated weights (and buffer) of a tile instead of the gradient."""
    index = gemm_lib.out_index(gemm.n, gemm.m)

    def epilogue(value, v, rows, cols, extra_refs, out_refs):
        w_ref, lr_ref, *m_ref = extra_refs
        w = gemm_lib.load(w_ref, index, v, rows, cols).astype(value.dtype)
        m = gemm_lib.load(m_ref[0], index, v, rows, cols).astype(value.dtype) if m_ref else None
        lr = gemm_lib.load(lr_ref, lambda v, r, c: (v + 0 * (r + c), (r >= 0) & (c >= 0)), v, rows, cols)
        w, m = sgd_tile(value, w, m, lr.astype(value.dtype), sgd)
        gemm_lib.store(out_refs[0], index, v, rows, cols, w)
        if m is not None:
            gemm_lib.store(out_refs[1], index, v, rows, cols, m)

    return epilogue


def _fused(gemm: gemm_lib.Gemm, sgd: SGD, a, b, kernel, trace, lr):
    """(new kernel, new trace or None) of ``clients`` = kernel.shape[0] clients, flat operands ``a``, ``b``."""
    clients, shape = kernel.shape[0], kernel.shape
    flat = jax.ShapeDtypeStruct((kernel.size,), kernel.dtype)
    extra = (kernel.reshape(-1), jnp.broadcast_to(lr, (clients,)).astype(kernel.dtype))
    outs = (flat,)
    if sgd.momentum:
        extra, outs = extra + (trace.reshape(-1),), (flat, flat)
    new = gemm_lib.run(gemm, clients, a, b, kernel.dtype, _epilogue(gemm, sgd), extra, outs)
    return new[0].reshape(shape), (new[1].reshape(shape) if sgd.momentum else None)


def conv_kernel_grad_sgd(x, dy, kernel, trace, lr, strides, pads, sgd: SGD = SGD()):
    """(kernel, trace) after one SGD step on the kernel gradient of ``conv2d(x, kernel, strides, pads)`` given
    output gradient ``dy``: x [B, H, W, C], dy [B, Ho, Wo, O], kernel and trace [kh, kw, C, O] (trace: the
    momentum buffer; ignored and returned as given without momentum), lr a scalar."""
    spec = pallas_conv.Geometry(None, tuple(x.shape[1:]), tuple(kernel.shape), tuple(strides),
                                tuple(tuple(p) for p in pads))
    return _conv_op(spec, sgd)(x, dy, kernel, trace, jnp.asarray(lr))


def dense_kernel_grad_sgd(x, dy, kernel, trace, lr, sgd: SGD = SGD()):
    """(kernel, trace) after one SGD step on the kernel gradient of ``x @ kernel`` given output gradient
    ``dy``: x [B, in], dy [B, out], kernel and trace [in, out], lr a scalar."""
    return _dense_op(sgd)(x, dy, kernel, trace, jnp.asarray(lr))


def _with_trace(fn, sgd: SGD):
    """``fn`` returning the trace as given when there is no momentum (the op's outputs keep one structure)."""
    def call(x, dy, kernel, trace, lr):
        new_kernel, new_trace = fn(x, dy, kernel, trace, lr)
        return new_kernel, (trace if new_trace is None else new_trace)
    return call


@functools.lru_cache(maxsize=None)
def _conv_op(spec: pallas_conv.Geometry, sgd: SGD):
    def batched(x, dy, kernel, trace, lr):
        gemm = pallas_conv.kernel_grad_gemm(spec._replace(batch=x.shape[1]))
        return _fused(gemm, sgd, x.reshape(-1), dy.reshape(-1), kernel, trace, lr)

    batched = _with_trace(batched, sgd)
    return client_mapped(one_client(batched), batched)


def dense_grad_gemm(batch: int, n_in: int, n_out: int) -> gemm_lib.Gemm:
    """``dk [in, out] = x^T dy`` per client: rows the inputs, columns the outputs, contraction the batch."""
    def x_t(v, rows, cols):  # (v, i, b) -> x[v, b, i]
        return v * (batch * n_in) + cols * n_in + rows, (rows < n_in) & (cols < batch)

    tiles = tuple(gemm_lib.tile(s, cap) for s, cap in zip((n_in, n_out, batch), DENSE_TILES))
    return gemm_lib.Gemm(n_in, n_out, batch, x_t, gemm_lib.out_index(n_out, batch), tiles)


@functools.lru_cache(maxsize=None)
def _dense_op(sgd: SGD):
    def batched(x, dy, kernel, trace, lr):
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        dy = dy.reshape(dy.shape[0], -1, dy.shape[-1])
        gemm = dense_grad_gemm(x.shape[1], *kernel.shape[1:])
        return _fused(gemm, sgd, x.reshape(-1), dy.reshape(-1), kernel, trace, lr)

    batched = _with_trace(batched, sgd)
    return client_mapped(one_client(batched), batched)
