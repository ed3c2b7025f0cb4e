"""GPFL's global guidance losses on the global-route feature f_G (Zhang et al., ICCV 2023).

Both take f_G [B, d] (the conditional valve's output under the generic input),
labels [B] and a mask [B] of real samples.

* `angle_level_guidance`: cross-entropy of the cosine similarities between f_G
  and the category embeddings E [C, d] (trainable, the GCE layer), no scale:
  -log softmax_c(cos(f_G, E_c))[y], averaged over real samples (the authors'
  ``GCE.forward``; PyTorch's F.normalize eps 1e-12).
* `magnitude_level_guidance`: distance of f_G to the received (frozen) global
  embedding of its label, t = E_frozen[y].
  ``reduction='code'`` (default, the authors' code ``torch.norm(feat_G - emb, 2)``):
  the Frobenius norm over the batch, sqrt(sum_i ||f_i - t_i||^2), real rows only;
  ``reduction='paper'`` (this library's reading of the paper's expectation):
  the mean over real samples of ||f_i - t_i||_2.
Square roots have gradient 0 at 0 (model_distance.safe_sqrt).
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_pfl.kernels.batch_losses import cross_entropy, masked_mean, sample_mask
from fedjax_pfl.kernels.model_distance import safe_sqrt

REDUCTIONS = ("code", "paper")


def _normalize_rows(x):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def angle_level_guidance(features, labels, embeddings, mask=None):
    """Cross-entropy of cos(f_G, E_c) over classes c: features [B, d], labels [B], embeddings [C, d].

    Examples:
        >>> features = jnp.array([[1.0, 0.0], [0.0, 3.0]])
        >>> embeddings = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # C=2 category embeddings
        >>> round(float(angle_level_guidance(features, jnp.array([0, 1]), embeddings)), 4)  # cosines 1 and 0
        0.3133
    """
    cosine = _normalize_rows(features.astype(jnp.float32)) @ _normalize_rows(embeddings.astype(jnp.float32)).T
    return cross_entropy(cosine, labels, mask)


def magnitude_level_guidance(features, targets, mask=None, reduction: str = "code"):
    """Distance of features [B, d] to targets [B, d] (E_frozen[y]): Frobenius ('code') or mean L2 ('paper').

    Examples:
        >>> features, targets = jnp.array([[3.0, 0.0], [0.0, 4.0]]), jnp.zeros((2, 2))
        >>> round(float(magnitude_level_guidance(features, targets)), 4)  # sqrt(9 + 16)
        5.0
        >>> round(float(magnitude_level_guidance(features, targets, reduction="paper")), 4)  # (3 + 4) / 2
        3.5
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    m = sample_mask(mask, features.shape[0])
    per_sample = jnp.sum(jnp.square(features.astype(jnp.float32) - targets), axis=-1) * m
    if reduction == "code":
        return safe_sqrt(jnp.sum(per_sample))
    return masked_mean(safe_sqrt(per_sample), m)

