"""A fully connected layer whose gradients XLA:CPU gives to its library kernels (``conv_impl='direct'``).

JAX's gradient of ``x @ kernel`` with respect to the kernel is a dot that
contracts the batch axis of both operands (``lhs_contracting_dims={0}``).
XLA:CPU hands only canonical matmuls ([M, K] x [K, N]) to YNNPACK and runs
that one with its own, slower, loop: in an MLP step at B=10 (784-100-10) it
took half of the step (benchmarks/RESULTS.md, "Dense kernel gradients as canonical matmuls"). `dense_direct`
writes both gradients as canonical matmuls by a custom VJP, the transposes
behind ``lax.optimization_barrier`` so that XLA does not fold them back into
the dot (the same trick as direct_conv.py):

* forward: ``x @ kernel``;
* input gradient: ``dy @ kernel^T``;
* kernel gradient: ``x^T @ dy`` (x flattened to [B, in]).

`Dense` is the layer (the parameter tree of ``flax.linen.Dense``: ``kernel
[in, out]`` with LeCun-normal, ``bias [out]`` with zeros), computing through
`dense_direct` when its ``impl`` is ``'direct'`` (the CPU default, as for
convolutions) and through ``jnp.dot`` with JAX's own gradients otherwise.
Values equal ``x @ kernel + bias`` and its JAX gradients up to float rounding
(tests/test_dense.py, float64, also under ``vmap`` with a kernel per
client and forward-over-reverse Hessian-vector products).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
from flax.linen.dtypes import promote_dtype
import jax.numpy as jnp
from jax import lax


@jax.custom_vjp
def dense_direct(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x [..., in] @ kernel [in, out]`` with both gradients as canonical matmuls.

    >>> dense_direct(jnp.ones((2, 3)), jnp.ones((3, 4)))
    Array([[3., 3., 3., 3.],
           [3., 3., 3., 3.]], dtype=float32)
    """
    return jnp.dot(x, kernel)


def _dense_fwd(x, kernel):
    return jnp.dot(x, kernel), (x, kernel)


def _dense_bwd(residuals, dy):
    x, kernel = residuals
    input_grad = jnp.dot(dy, lax.optimization_barrier(kernel.T))
    rows = x.reshape(-1, x.shape[-1])
    kernel_grad = jnp.dot(lax.optimization_barrier(rows.T), dy.reshape(-1, dy.shape[-1]))
    return input_grad, kernel_grad


dense_direct.defvjp(_dense_fwd, _dense_bwd)


class Dense(nn.Module):
    """``x @ kernel + bias``, the parameters of ``flax.linen.Dense``; ``impl`` 'direct' (`dense_direct`) or
    anything else (JAX's own dot and gradients); ``dtype`` the compute dtype (models/precision.py; None: the
    input's)."""

    features: int
    impl: str = "native"
    dtype: Any = None

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        x, kernel, bias = promote_dtype(x, kernel, bias, dtype=self.dtype)  # as flax.linen.Dense (float64 stays)
        y = dense_direct(x, kernel) if self.impl == "direct" else jnp.dot(x, kernel)
        return y + bias
