"""Pure per-batch losses (re-exported by ``fedjax_pfl.losses``, the public face).

Every function is jit-able and usable without the engine.

Shapes: B batch, C classes, d feature width. ``mask`` [B] (bool or 0/1) marks
real samples; padded samples contribute nothing and the mean is over real ones
(a batch with no real sample gives 0, never NaN).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_pfl.core import tree_ops


def sample_mask(mask, batch: int):
    """``mask`` as float32 [B] (1 = real sample); None means every sample is real."""
    if mask is None:
        return jnp.ones((batch,), jnp.float32)
    return jnp.asarray(mask, jnp.float32)


def masked_mean(values, mask=None):
    """Mean of ``values`` [B] over real samples."""
    m = sample_mask(mask, values.shape[0])
    return jnp.sum(values * m) / jnp.maximum(jnp.sum(m), 1.0)


def cross_entropy(logits, labels, mask=None):
    """Mean softmax cross-entropy. logits [B, C], labels [B] int."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    return masked_mean(nll, mask)


def class_counts(labels, num_classes: int, mask=None):
    """Number of real samples of each class: labels [B] -> float32 [C]."""
    m = sample_mask(mask, labels.shape[0])
    return jax.nn.one_hot(labels, num_classes, dtype=jnp.float32).T @ m


def balanced_softmax_cross_entropy(logits, labels, counts, mask=None):
    """Balanced softmax (Ren et al. 2020; FedRoD's generic loss): cross-entropy of
    ``logits + log(counts)``, counts [C] the client's train samples per class.

    A class the client lacks (count 0) gets a shift of -1e30 instead of -inf, so
    its probability is exactly 0 and padded rows stay finite.
    """
    counts = jnp.asarray(counts, jnp.float32)
    shift = jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.0)), -1e30)
    return cross_entropy(logits.astype(jnp.float32) + shift, labels, mask)


def accuracy_counts(logits, labels, mask=None):
    """(number correct, number of real samples) for a batch."""
    m = sample_mask(mask, labels.shape[0])
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(correct * m), jnp.sum(m)


def feature_mse(features, targets, mask=None):
    """Mean over real samples and feature dims of (features - targets)^2. [B, d] each.

    PFAKD's distillation to the frozen global body (targets = teacher features)
    and FedPAC's alignment to class prototypes (targets = prototype of each label).
    """
    per_sample = jnp.mean(jnp.square(features - targets), axis=-1)
    return masked_mean(per_sample, mask)


feature_distillation = feature_mse


def class_mean_alignment(features, labels, class_means, mask=None):
    """FedAS alignment (authors' code): sum over classes present in the batch of
    the mean over that class's samples and feature dims of (f(x) - mu_c)^2.

    features [B, d], labels [B], class_means [C, d].
    """
    m = sample_mask(mask, labels.shape[0])
    num_classes = class_means.shape[0]
    onehot = jax.nn.one_hot(labels, num_classes) * m[:, None]  # [B, C]
    sq = jnp.mean(jnp.square(features - class_means[labels]), axis=-1)  # [B]
    per_class_sum = onehot.T @ sq  # [C]
    per_class_count = onehot.sum(axis=0)
    return jnp.sum(per_class_sum / jnp.maximum(per_class_count, 1.0))


def sample_alignment(features, targets, mask=None):
    """FedAS alignment as the paper's text reads: each sample to its own target
    feature (the old body's feature of the same sample). [B, d] each."""
    return feature_mse(features, targets, mask)


def kd_kl(teacher_logits, student_logits, temperature: float = 1.0, mask=None):
    """T^2 * mean over samples of KL(p_teacher || p_student) at temperature T.

    Gradients flow into both arguments; stop them where a side is fixed.
    """
    t = temperature
    log_pt = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / t)
    log_ps = jax.nn.log_softmax(student_logits.astype(jnp.float32) / t)
    kl = jnp.sum(jnp.exp(log_pt) * (log_pt - log_ps), axis=-1)
    return (t * t) * masked_mean(kl, mask)


def weighted_kd_loss(student_logits, teacher_logits, labels, alpha: float, temperature: float = 1.0, mask=None):
    """pFedKD-WCL client loss: (1 - alpha) * NLL + alpha * KL(p_teacher || p_student).

    The teacher (global model) is held fixed (stop_gradient).
    """
    teacher_logits = jax.lax.stop_gradient(teacher_logits)
    nll = cross_entropy(student_logits, labels, mask)
    return (1.0 - alpha) * nll + alpha * kd_kl(teacher_logits, student_logits, temperature, mask)


def proximal(params, anchor):
    """0.5 * ||params - anchor||^2 over a pytree (scale by mu or lambda outside)."""
    return 0.5 * tree_ops.squared_norm(tree_ops.sub(params, jax.lax.stop_gradient(anchor)))


def output_mixture_cross_entropy(personal_logits, global_logits, alpha, labels, mask=None):
    """APFL's mixed-model loss as the authors' code computes it: CE of
    alpha * personal_logits + (1 - alpha) * global_logits. [B, C] each, alpha a scalar.

    Gradients flow into all three; stop the global side outside where it is fixed.
    """
    mixed = alpha * personal_logits.astype(jnp.float32) + (1.0 - alpha) * global_logits.astype(jnp.float32)
    return cross_entropy(mixed, labels, mask)


def attention_map(feature_map):
    """Attention transfer map: sum over channels of A^2, flattened, unit L2 norm.

    feature_map [B, H, W, C] -> [B, H*W].
    """
    q = jnp.sum(jnp.square(feature_map.astype(jnp.float32)), axis=-1).reshape(feature_map.shape[0], -1)
    return q / jnp.maximum(jnp.linalg.norm(q, axis=-1, keepdims=True), 1e-12)


def attention_transfer(student_map, teacher_map, mask=None):
    """0.5 * ||Q_student - Q_teacher||_2 averaged over real samples (PFAKD+AT,
    this library's reading). Multiply by gamma outside."""
    diff = attention_map(student_map) - attention_map(teacher_map)
    dist = jnp.sqrt(jnp.sum(jnp.square(diff), axis=-1) + 1e-12)
    return 0.5 * masked_mean(dist, mask)
