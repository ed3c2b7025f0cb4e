"""Parameter initialisation schemes: Flax's defaults, or PyTorch's defaults.

The published numbers of the papers this library reproduces come from PyTorch
code, whose layers start from torch's default initialisation; Flax's layers
start elsewhere. ``model.init`` picks one:

* ``'flax'``: the layers' own initialisers (Dense and Conv kernels
  LeCun-normal, N(0, 1/fan_in) truncated; biases 0; norm layers scale 1, bias 0).
* ``'torch'``: as ``nn.Linear`` / ``nn.Conv2d`` / ``nn.BatchNorm2d`` /
  ``nn.LayerNorm`` / ``nn.Embedding`` start in PyTorch. A weight is drawn by
  kaiming_uniform with a = sqrt(5): bound gain * sqrt(3 / fan_in) with gain
  sqrt(2 / (1 + a^2)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)); its bias from
  the same U(-1/sqrt(fan_in), 1/sqrt(fan_in)). fan_in = in_features for a Dense
  kernel [in, out] and in_channels * kh * kw for a conv kernel [kh, kw, in, out]
  (the product of all axes but the last). Norm layers: scale 1, bias 0 (as
  Flax). Embeddings: N(0, 1).

`reinitialize` applies a scheme to a parameter tree that Flax initialised:
every mapping holding a ``kernel`` is one layer (its ``bias``, if any, belongs
to it); a mapping with ``scale`` and no kernel is a norm layer. It does not
depend on how a layer computes (native or im2col convolution), only on the
parameter shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from fedjax_pfl.core.errors import UserError

INITS = ("flax", "torch")


def torch_bound(kernel_shape) -> float:
    """1/sqrt(fan_in) of a kernel shaped [..., in, out]: fan_in = product of all axes but the last.

    Examples:
        >>> torch_bound((784, 10)) == 1 / 28
        True
        >>> torch_bound((5, 5, 32, 64)) == 1 / math.sqrt(5 * 5 * 32)
        True
    """
    return 1.0 / math.sqrt(math.prod(kernel_shape[:-1]))


def _torch_layer(layer: dict, key, where: str) -> dict:
    """One layer's parameters redrawn as PyTorch's defaults (see the module docstring)."""
    layer = dict(layer)
    if "kernel" in layer:
        bound = torch_bound(layer["kernel"].shape)
        out = {}
        for name, k in zip(sorted(layer), jax.random.split(key, len(layer))):
            if name not in ("kernel", "bias"):
                raise UserError(f"no torch initialisation for parameter {where}/{name}; use model.init=flax")
            a = layer[name]
            out[name] = jax.random.uniform(k, a.shape, a.dtype, -1.0, 1.0) * bound
        return out
    if "embedding" in layer and len(layer) == 1:
        a = layer["embedding"]
        return {"embedding": jax.random.normal(key, a.shape, a.dtype)}
    if set(layer) <= {"scale", "bias"} and "scale" in layer:
        return {name: (jnp.ones_like if name == "scale" else jnp.zeros_like)(a) for name, a in layer.items()}
    raise UserError(f"no torch initialisation for the layer {where} ({sorted(layer)}); use model.init=flax")


def _is_layer(node) -> bool:
    return isinstance(node, Mapping) and bool(node) and not any(isinstance(v, Mapping) for v in node.values())


def torch_defaults(params: dict, key) -> dict:
    """``params`` (a Flax parameter tree) with every layer redrawn as PyTorch initialises it.

    Examples:
        >>> params = {"dense": {"kernel": jnp.zeros((100, 3)), "bias": jnp.zeros(3)},
        ...           "norm": {"scale": jnp.zeros(3), "bias": jnp.ones(3)}}
        >>> out = torch_defaults(params, jax.random.key(0))
        >>> float(jnp.abs(out["dense"]["kernel"]).max()) <= 0.1, float(jnp.abs(out["dense"]["bias"]).max()) <= 0.1
        (True, True)
        >>> out["norm"]["scale"].tolist(), out["norm"]["bias"].tolist()
        ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    """
    def walk(node, key, where):
        if _is_layer(node):
            return _torch_layer(node, key, where)
        if not isinstance(node, Mapping):
            raise UserError(f"no torch initialisation for the parameter {where}; use model.init=flax")
        keys = jax.random.split(key, max(len(node), 1))
        return {name: walk(child, k, f"{where}/{name}") for (name, child), k in zip(sorted(node.items()), keys)}

    return walk(dict(params), key, "params")


def reinitialize(params: dict, key, init: str) -> dict:
    """``params`` as scheme ``init`` starts them: 'flax' returns them unchanged, 'torch' `torch_defaults`."""
    if init not in INITS:
        raise UserError(f"unknown model.init {init!r}; choose one of: {', '.join(INITS)}")
    return params if init == "flax" else torch_defaults(params, key)
