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
    """``mask`` as float32 [B] (1 = real sample); None means every sample is real.

    Examples:
        >>> sample_mask(None, 3).tolist()
        [1.0, 1.0, 1.0]
        >>> sample_mask(jnp.array([True, False]), 2).tolist()
        [1.0, 0.0]
    """
    if mask is None:
        return jnp.ones((batch,), jnp.float32)
    return jnp.asarray(mask, jnp.float32)


def masked_mean(values, mask=None):
    """Mean of ``values`` [B] over real samples.

    Examples:
        >>> values = jnp.array([1.0, 2.0, 30.0])
        >>> round(float(masked_mean(values, jnp.array([1, 1, 0]))), 4)  # the padded 30 is ignored
        1.5
    """
    m = sample_mask(mask, values.shape[0])
    return jnp.sum(values * m) / jnp.maximum(jnp.sum(m), 1.0)


def cross_entropy(logits, labels, mask=None):
    """Mean softmax cross-entropy. logits [B, C], labels [B] int.

    Examples:
        >>> logits = jnp.array([[2.0, 0.0], [0.0, 2.0]])
        >>> round(float(cross_entropy(logits, jnp.array([0, 0]))), 4)
        1.1269
        >>> round(float(cross_entropy(logits, jnp.array([0, 0]), mask=jnp.array([1, 0]))), 4)
        0.1269
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    return masked_mean(nll, mask)


def class_counts(labels, num_classes: int, mask=None):
    """Number of real samples of each class: labels [B] -> float32 [C].

    Examples:
        >>> class_counts(jnp.array([0, 2, 2, 1]), 3, mask=jnp.array([1, 1, 1, 0])).tolist()
        [1.0, 0.0, 2.0]
    """
    m = sample_mask(mask, labels.shape[0])
    return jax.nn.one_hot(labels, num_classes, dtype=jnp.float32).T @ m


def balanced_softmax_cross_entropy(logits, labels, counts, mask=None):
    """Balanced softmax (Ren et al. 2020; FedRoD's generic loss): cross-entropy of
    ``logits + log(counts)``, counts [C] the client's train samples per class.

    A class the client lacks (count 0) gets a shift of -1e30 instead of -inf, so
    its probability is exactly 0 and padded rows stay finite.

    Examples:
        >>> logits = jnp.zeros((2, 3))
        >>> counts = jnp.array([30.0, 10.0, 0.0])  # class 2 absent on this client
        >>> round(float(balanced_softmax_cross_entropy(logits, jnp.array([0, 1]), counts)), 4)
        0.837
    """
    counts = jnp.asarray(counts, jnp.float32)
    shift = jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.0)), -1e30)
    return cross_entropy(logits.astype(jnp.float32) + shift, labels, mask)


def accuracy_counts(logits, labels, mask=None):
    """(number correct, number of real samples) for a batch.

    Examples:
        >>> logits = jnp.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
        >>> correct, real = accuracy_counts(logits, jnp.array([0, 0, 0]), mask=jnp.array([1, 1, 0]))
        >>> float(correct), float(real)
        (1.0, 2.0)
    """
    m = sample_mask(mask, labels.shape[0])
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(correct * m), jnp.sum(m)


def feature_mse(features, targets, mask=None):
    """Mean over real samples and feature dims of (features - targets)^2. [B, d] each.

    PFAKD's distillation to the frozen global body (targets = teacher features)
    and FedPAC's alignment to class prototypes (targets = prototype of each label).

    Examples:
        >>> features = jnp.array([[1.0, 1.0], [0.0, 2.0]])
        >>> targets = jnp.array([[0.0, 1.0], [0.0, 0.0]])
        >>> round(float(feature_mse(features, targets)), 4)  # (0.5 + 2.0) / 2
        1.25
    """
    per_sample = jnp.mean(jnp.square(features - targets), axis=-1)
    return masked_mean(per_sample, mask)


feature_distillation = feature_mse


def class_mean_alignment(features, labels, class_means, mask=None):
    """FedAS alignment (authors' code): sum over classes present in the batch of
    the mean over that class's samples and feature dims of (f(x) - mu_c)^2.

    features [B, d], labels [B], class_means [C, d].

    Examples:
        >>> features = jnp.array([[1.0, 1.0], [3.0, 1.0], [0.0, 0.0]])
        >>> labels = jnp.array([0, 0, 1])
        >>> class_means = jnp.array([[2.0, 1.0], [0.0, 1.0]])
        >>> round(float(class_mean_alignment(features, labels, class_means)), 4)  # class 0: 0.5, class 1: 0.5
        1.0
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
    feature (the old body's feature of the same sample). [B, d] each.

    Examples:
        >>> round(float(sample_alignment(jnp.array([[1.0, 3.0]]), jnp.array([[1.0, 1.0]]))), 4)
        2.0
    """
    return feature_mse(features, targets, mask)


def kd_kl(teacher_logits, student_logits, temperature: float = 1.0, mask=None):
    """T^2 * mean over samples of KL(p_teacher || p_student) at temperature T.

    Gradients flow into both arguments; stop them where a side is fixed.

    Examples:
        >>> teacher = jnp.array([[2.0, 0.0]])
        >>> round(float(kd_kl(teacher, teacher)), 4)
        0.0
        >>> round(float(kd_kl(teacher, jnp.array([[0.0, 0.0]]))), 4)
        0.3278
    """
    t = temperature
    log_pt = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / t)
    log_ps = jax.nn.log_softmax(student_logits.astype(jnp.float32) / t)
    kl = jnp.sum(jnp.exp(log_pt) * (log_pt - log_ps), axis=-1)
    return (t * t) * masked_mean(kl, mask)


def weighted_kd_loss(student_logits, teacher_logits, labels, alpha: float, temperature: float = 1.0, mask=None):
    """pFedKD-WCL client loss: (1 - alpha) * NLL + alpha * KL(p_teacher || p_student).

    The teacher (global model) is held fixed (stop_gradient).

    Examples:
        >>> student = jnp.array([[0.0, 0.0]])
        >>> teacher = jnp.array([[2.0, 0.0]])
        >>> round(float(weighted_kd_loss(student, teacher, jnp.array([0]), alpha=0.1)), 4)
        0.6566
    """
    teacher_logits = jax.lax.stop_gradient(teacher_logits)
    nll = cross_entropy(student_logits, labels, mask)
    return (1.0 - alpha) * nll + alpha * kd_kl(teacher_logits, student_logits, temperature, mask)


def proximal(params, anchor):
    """0.5 * ||params - anchor||^2 over a pytree (scale by mu or lambda outside).

    Examples:
        >>> params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(0.5)}
        >>> anchor = {"w": jnp.array([0.0, 0.0]), "b": jnp.array(0.5)}
        >>> round(float(proximal(params, anchor)), 4)  # 0.5 * (1 + 4)
        2.5
    """
    return 0.5 * tree_ops.squared_norm(tree_ops.sub(params, jax.lax.stop_gradient(anchor)))


def output_mixture_cross_entropy(personal_logits, global_logits, alpha, labels, mask=None):
    """APFL's mixed-model loss as the authors' code computes it: CE of
    alpha * personal_logits + (1 - alpha) * global_logits. [B, C] each, alpha a scalar.

    Gradients flow into all three; stop the global side outside where it is fixed.

    Examples:
        >>> personal = jnp.array([[2.0, 0.0]])
        >>> global_ = jnp.array([[0.0, 2.0]])
        >>> round(float(output_mixture_cross_entropy(personal, global_, 0.5, jnp.array([0]))), 4)  # logits [1, 1]
        0.6931
    """
    mixed = alpha * personal_logits.astype(jnp.float32) + (1.0 - alpha) * global_logits.astype(jnp.float32)
    return cross_entropy(mixed, labels, mask)


def attention_map(feature_map):
    """Attention transfer map: sum over channels of A^2, flattened, unit L2 norm.

    feature_map [B, H, W, C] -> [B, H*W].

    Examples:
        >>> fmap = jnp.ones((1, 2, 2, 3)).at[0, 0, 0].set(2.0)  # B=1, H=W=2, C=3
        >>> import numpy as np
        >>> print(np.asarray(attention_map(fmap)).round(3))
        [[0.918 0.229 0.229 0.229]]
    """
    q = jnp.sum(jnp.square(feature_map.astype(jnp.float32)), axis=-1).reshape(feature_map.shape[0], -1)
    return q / jnp.maximum(jnp.linalg.norm(q, axis=-1, keepdims=True), 1e-12)


def attention_transfer(student_map, teacher_map, mask=None):
    """0.5 * ||Q_student - Q_teacher||_2 averaged over real samples (PFAKD+AT,
    this library's reading). Multiply by gamma outside.

    Examples:
        >>> student = jnp.ones((1, 2, 2, 3))
        >>> round(float(attention_transfer(student, 2.0 * student)), 4)  # the same map after normalisation
        0.0
        >>> round(float(attention_transfer(student, student.at[0, 0, 0].set(2.0))), 4)
        0.3139
    """
    diff = attention_map(student_map) - attention_map(teacher_map)
    dist = jnp.sqrt(jnp.sum(jnp.square(diff), axis=-1) + 1e-12)
    return 0.5 * masked_mean(dist, mask)
