"""GPFL's Conditional Valve (CoV; Zhang et al., ICCV 2023) and its conditional inputs.

The valve splits the feature f [B, d] into a global and a personalized route
by feature-wise affine modulation with a conditional input z [d]:

    gamma = LayerNorm(ReLU(Dense(z))),  beta = LayerNorm(ReLU(Dense(z)))
    CoV(f, z) = ReLU(f * (gamma + 1) + beta)

(the authors' ``CoV`` module: two Dense(d, d) + ReLU + LayerNorm branches,
LayerNorm epsilon 1e-5 as PyTorch's). The conditional inputs come from the
global category embeddings E [C, d] (the GCE layer):

    generic      z_G = (1/C) sum_c E_c
    personalized z_P = sum_c pi_c E_c,   pi = the client's train label prior.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class ConditionalValve(nn.Module):
    features: int

    @nn.compact
    def __call__(self, x, context):
        def branch(name):
            h = nn.relu(nn.Dense(self.features, name=f"{name}_dense")(context))
            return nn.LayerNorm(epsilon=1e-5, name=f"{name}_norm")(h)

        gamma, beta = branch("gamma"), branch("beta")
        return nn.relu(x * (gamma + 1.0) + beta)


def label_prior(labels, n, num_classes: int):
    """pi [C]: class frequencies of the first ``n`` of a client's padded labels [n_max]."""
    valid = (jnp.arange(labels.shape[0]) < n).astype(jnp.float32)
    counts = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32).T @ valid
    return counts / jnp.maximum(jnp.sum(counts), 1.0)


def conditional_inputs(embeddings, prior):
    """(z_G, z_P), each [d], from category embeddings [C, d] and a label prior [C]."""
    return jnp.mean(embeddings, axis=0), prior @ embeddings
