"""Pure server rules over stacked client trees (leading axis S = uploading clients).

Weights are non-negative [S]; a zero weight excludes an upload (a dropped
straggler). Every rule is jit-able and usable without the engine.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normalize_weights(weights):
    """weights [S] -> weights / sum (all zeros stays all zeros).

    Examples:
        >>> normalize_weights(jnp.array([1.0, 3.0])).tolist(), normalize_weights(jnp.zeros(2)).tolist()
        ([0.25, 0.75], [0.0, 0.0])
    """
    w = jnp.asarray(weights, jnp.float32)
    return w / jnp.maximum(jnp.sum(w), 1e-30)


def weighted_mean(stacked, weights):
    """sum_i w_i tree_i / sum_i w_i over the leading axis of every leaf.

    Examples:
        >>> stacked = {"w": jnp.array([[0.0, 2.0], [4.0, 6.0]])}  # S=2 uploads
        >>> weighted_mean(stacked, jnp.array([3.0, 1.0]))["w"].tolist()  # n_i weights
        [1.0, 3.0]
    """
    w = normalize_weights(weights)
    return jax.tree.map(lambda a: jnp.tensordot(w, a.astype(jnp.float32), axes=1).astype(a.dtype), stacked)


def weighted_mean_or(stacked, weights, fallback):
    """`weighted_mean`, or ``fallback`` when every weight is zero (nobody uploaded).

    Examples:
        >>> stacked, fallback = {"w": jnp.array([[0.0], [4.0]])}, {"w": jnp.array([9.0])}
        >>> weighted_mean_or(stacked, jnp.array([1.0, 1.0]), fallback)["w"].tolist()
        [2.0]
        >>> weighted_mean_or(stacked, jnp.zeros(2), fallback)["w"].tolist()  # nobody uploaded
        [9.0]
    """
    mean = weighted_mean(stacked, weights)
    any_upload = jnp.sum(weights) > 0
    return jax.tree.map(lambda m, f: jnp.where(any_upload, m, f), mean, fallback)


def fisher_weights(traces, uploaded):
    """FedAS: alpha_i = F_i / sum_{j uploaded} F_j. traces [S], uploaded [S] bool.

    Examples:
        >>> fisher_weights(jnp.array([1.0, 3.0, 4.0]), jnp.array([True, True, False])).tolist()  # client 2's upload lost
        [0.25, 0.75, 0.0]
    """
    return normalize_weights(jnp.where(uploaded, traces, 0.0))


PROTO_WEIGHTS = ("clients", "counts")


def prototype_weights(counts, uploaded, mode: str):
    """[S, C] weights of each upload's class prototypes: n_ik ('counts') or 1 where n_ik > 0 ('clients').

    Examples:
        >>> w = prototype_weights(jnp.array([[2.0, 0.0], [5.0, 1.0]]), jnp.array([True, True]), "clients")
        >>> w.tolist()
        [[1.0, 0.0], [1.0, 1.0]]
    """
    counts = counts.astype(jnp.float32) * uploaded[:, None].astype(jnp.float32)
    return counts if mode == "counts" else (counts > 0).astype(jnp.float32)


def prototype_aggregate(prototypes, counts):
    """Global class prototypes: c^k = sum_i n_ik c_i^k / sum_i n_ik.

    prototypes [S, C, d], counts [S, C]. Returns (global [C, d], present [C] bool);
    a class no client holds gets a zero row and present=False.

    Examples:
        >>> prototypes = jnp.array([[[1.0, 0.0], [0.0, 0.0]], [[3.0, 0.0], [0.0, 0.0]]])  # S=2, C=2, d=2
        >>> counts = jnp.array([[1.0, 0.0], [3.0, 0.0]])  # nobody holds class 1
        >>> global_, present = prototype_aggregate(prototypes, counts)
        >>> global_.tolist(), present.tolist()
        ([[2.5, 0.0], [0.0, 0.0]], [True, False])
    """
    counts = jnp.asarray(counts, jnp.float32)
    total = counts.sum(axis=0)  # [C]
    summed = jnp.einsum("sc,scd->cd", counts, prototypes.astype(jnp.float32))
    return summed / jnp.maximum(total, 1e-30)[:, None], total > 0


def softmax_weights(losses, mask=None, temperature: float = 1.0):
    """Row-wise softmax of -losses / T: losses [S, M] -> weights [S, M] (rows sum to 1).

    ``mask`` [M] excludes columns (e.g. clients that did not upload).

    Examples:
        >>> import numpy as np
        >>> losses = jnp.array([[0.0, 1.0, 0.5]])  # S=1 row over M=3 candidates
        >>> print(np.asarray(softmax_weights(losses)).round(3))
        [[0.506 0.186 0.307]]
        >>> print(np.asarray(softmax_weights(losses, mask=jnp.array([True, True, False]))).round(3))
        [[0.731 0.269 0.   ]]
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
    pairwise_distances,
    pairwise_sq_distances,
    similarities,
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
