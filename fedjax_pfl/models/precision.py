"""The arithmetic a model computes in: ``'fp32'`` (the default) or ``'bf16'`` mixed precision.

With ``'bf16'`` every layer casts its input and its float32 parameters to
bfloat16 before its matmul or convolution, so activations and matmul inputs
are bfloat16 (half the bytes a step moves once it is memory-bound), while the
parameters, their gradients (the cast's transpose brings them back to
float32), the optimizer state and the BatchNorm statistics stay float32.
`to_float32` casts what the model hands out (logits, features, maps) back to
float32, so every loss, softmax and reduction a method computes on them is
float32: methods need no change. ``'fp32'`` changes nothing in the program
(float64 inputs, as in the reference tests, stay float64).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_pfl.core.errors import UserError

PRECISIONS = {"fp32": None, "bf16": jnp.bfloat16}


def compute_dtype(precision: str):
    """The layers' compute dtype of a ``train.precision`` value (None: the inputs' own, float32 or float64).

    >>> compute_dtype("bf16"), compute_dtype("fp32")
    (<class 'jax.numpy.bfloat16'>, None)
    """
    if precision not in PRECISIONS:
        raise UserError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def to_float32(tree, precision: str):
    """``tree``'s bfloat16 leaves as float32 under ``'bf16'``; ``tree`` itself under ``'fp32'``.

    >>> to_float32((jnp.ones(2, jnp.bfloat16),), "bf16")[0].dtype
    dtype('float32')
    """
    if compute_dtype(precision) is None:
        return tree
    return jax.tree.map(lambda a: a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a, tree)
