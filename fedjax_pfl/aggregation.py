"""Pure server rules over stacked client trees (leading axis S = uploading clients).

Weights are non-negative [S]; a zero weight excludes an upload (a dropped
straggler). Every rule is jit-able and usable without the engine.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normalize_weights(weights):
    """weights [S] -> weights / sum (all zeros stays all zeros)."""
    w = jnp.asarray(weights, jnp.float32)
    return w / jnp.maximum(jnp.sum(w), 1e-30)


def weighted_mean(stacked, weights):
    """sum_i w_i tree_i / sum_i w_i over the leading axis of every leaf."""
    w = normalize_weights(weights)
    return jax.tree.map(lambda a: jnp.tensordot(w, a.astype(jnp.float32), axes=1).astype(a.dtype), stacked)


def weighted_mean_or(stacked, weights, fallback):
    """`weighted_mean`, or ``fallback`` when every weight is zero (nobody uploaded)."""
    mean = weighted_mean(stacked, weights)
    any_upload = jnp.sum(weights) > 0
    return jax.tree.map(lambda m, f: jnp.where(any_upload, m, f), mean, fallback)


def fisher_weights(traces, uploaded):
    """FedAS: alpha_i = F_i / sum_{j uploaded} F_j. traces [S], uploaded [S] bool."""
    return normalize_weights(jnp.where(uploaded, traces, 0.0))


def prototype_aggregate(prototypes, counts):
    """Global class prototypes: c^k = sum_i n_ik c_i^k / sum_i n_ik.

    prototypes [S, C, d], counts [S, C]. Returns (global [C, d], present [C] bool);
    a class no client holds gets a zero row and present=False.
    """
    counts = jnp.asarray(counts, jnp.float32)
    total = counts.sum(axis=0)  # [C]
    summed = jnp.einsum("sc,scd->cd", counts, prototypes.astype(jnp.float32))
    return summed / jnp.maximum(total, 1e-30)[:, None], total > 0


def softmax_weights(losses, mask=None, temperature: float = 1.0):
    """Row-wise softmax of -losses / T: losses [S, M] -> weights [S, M] (rows sum to 1).

    ``mask`` [M] excludes columns (e.g. clients that did not upload).
    """
    logits = -jnp.asarray(losses, jnp.float32) / temperature
    if mask is not None:
        logits = jnp.where(mask[None, :], logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


# DiversiFed: pairwise model distances (one Gram matmul), the mixing matrix Xi
# from the model-distance loss, and U = Xi @ W (fedjax_pfl/kernels/model_distance.py).
from fedjax_pfl.kernels.model_distance import (  # noqa: E402,F401
    apply_mixing,
    mix_models,
    mixing_matrix,
    normalize_distances,
    pairwise_distances,
    pairwise_sq_distances,
)

# FedPAC's simplex QP (classifier-combination weights), from its own module.
from fedjax_pfl.kernels.simplex_qp import (  # noqa: E402,F401
    combination_weights,
    combination_weights_batch,
    project_simplex,
    repair_psd,
    solve_simplex_qp,
    solve_simplex_qp_batch,
)

# FedAMP's attentive message passing: attention weights from pairwise squared
# distances and the personalized cloud models U = Xi @ W (fedjax_pfl/kernels/attentive_mixing.py).
from fedjax_pfl.kernels.attentive_mixing import attention_weights, personalized_cloud_models  # noqa: E402,F401
