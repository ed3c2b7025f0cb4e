"""Per-class feature statistics of ONE client: class prototypes, counts, and
FedPAC's (V_i, h_i). Pure, jit-able functions; no method logic, no loops over clients.

A statistics pass reduces every batch of a client's train data to `ClassSums`
(per class: number of samples, sum of features, sum of squared feature norms)
and adds them up; everything else is a function of those sums:

* `prototypes`: c^k = mean feature of class k (zero row for an absent class)
  and the per-class counts n_k.
* `feature_statistics`: FedPAC's h_i [C, d] and V_i (scalar). With the class
  prior pi_k = n_k / n, the class mean mu_k and E_k||f||^2 the mean squared
  feature norm of class k:
    h_i[k] = pi_k * mu_k
    ``variance='code'`` (default, the authors' code, tools/fedpac.py
    ``statistics_extraction``):
        V_i = (1/n) * sum_k [ pi_k * E_k||f||^2 - pi_k^2 * ||mu_k||^2 ]
    (the variance of the sample-mean estimator of h_i, summed over classes);
    ``variance='paper'`` (this library's reading of the paper's text, the
    prior-weighted within-class variance):
        V_i = (1/n) * sum_k pi_k * ( E_k||f||^2 - ||mu_k||^2 ).
  Absent classes contribute nothing.
* `nearest_prototype_logits`: classification by the nearest class prototype
  (FedProto's prototype-based inference), as logits -||f - c^k||^2.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_pfl.kernels import local_training
from fedjax_pfl.kernels.counted_loop import PLAIN, Loops

VARIANCES = ("code", "paper")


class ClassSums(NamedTuple):
    count: jax.Array  # [C] samples of each class
    sum: jax.Array  # [C, d] sum of features
    sq: jax.Array  # [C] sum of squared feature norms


def class_sums(features, labels, num_classes: int, mask=None) -> ClassSums:
    """Per-class sums of one batch: features [B, d], labels [B], mask [B] (real samples).

    Examples:
        >>> sums = class_sums(jnp.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]]), jnp.array([0, 0, 1]), num_classes=3)
        >>> sums.count.tolist(), sums.sum.tolist(), sums.sq.tolist()
        ([2.0, 1.0, 0.0], [[4.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [10.0, 4.0, 0.0])
    """
    features = jnp.asarray(features, jnp.float32)
    m = jnp.ones(labels.shape, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
    onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32) * m[:, None]  # [B, C]
    return ClassSums(
        count=onehot.sum(axis=0),
        sum=onehot.T @ features,
        sq=onehot.T @ jnp.sum(jnp.square(features), axis=-1),
    )


def add_sums(a: ClassSums, b: ClassSums) -> ClassSums:
    """The `ClassSums` of two batches together.

    Examples:
        >>> a = class_sums(jnp.array([[1.0, 0.0]]), jnp.array([0]), 2)
        >>> b = class_sums(jnp.array([[3.0, 0.0]]), jnp.array([0]), 2)
        >>> add_sums(a, b).count.tolist(), add_sums(a, b).sum.tolist()
        ([2.0, 0.0], [[4.0, 0.0], [0.0, 0.0]])
    """
    return ClassSums(*(x + y for x, y in zip(a, b)))


def client_class_sums(feature_fn: Callable, data, num_classes: int, batch_size: int,
                      normalize: Callable, loops: Loops = PLAIN) -> ClassSums:
    """`ClassSums` over all of one client's train samples.

    ``feature_fn(x) -> [B, d]`` (e.g. the model's features in inference mode);
    ``data`` is one client's padded (x, y, n); batches in storage order; ``loops``: how the pass runs
    (kernels/counted_loop.py).

    Examples:
        >>> from fedjax_pfl.data.client_data import ClientData
        >>> data = ClientData(jnp.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [9.0, 9.0]]), jnp.array([0, 0, 1, 0]),
        ...                   jnp.asarray(3))  # 3 real samples, one padding row
        >>> sums = client_class_sums(lambda x: x, data, num_classes=2, batch_size=2, normalize=lambda x: x)
        >>> sums.count.tolist(), sums.sum.tolist()
        ([2.0, 1.0], [[4.0, 0.0], [0.0, 2.0]])
    """

    def per_batch(batch):
        return class_sums(feature_fn(batch.x), batch.y, num_classes, batch.mask)

    return local_training.sum_batches(per_batch, data, batch_size, normalize, loops)


def prototypes(sums: ClassSums):
    """(prototypes [C, d], counts [C]): class means, a zero row where a class is absent.

    Examples:
        >>> sums = class_sums(jnp.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]]), jnp.array([0, 0, 1]), num_classes=3)
        >>> protos, counts = prototypes(sums)
        >>> protos.tolist(), counts.tolist()  # class 2 is absent: a zero row
        ([[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [2.0, 1.0, 0.0])
    """
    protos = sums.sum / jnp.maximum(sums.count, 1.0)[:, None]
    return protos, sums.count


def feature_statistics(sums: ClassSums, variance: str = "code"):
    """FedPAC's (V_i scalar, h_i [C, d]) from a client's `ClassSums` (see module docstring).

    Examples:
        >>> sums = class_sums(jnp.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 2.0]]), jnp.array([0, 0, 1, 1]), 2)
        >>> v, h = feature_statistics(sums)
        >>> round(float(v), 4), h.tolist()
        (0.625, [[1.0, 0.0], [0.0, 1.0]])
    """
    if variance not in VARIANCES:
        raise ValueError(f"variance must be one of {VARIANCES}, got {variance!r}")
    n = jnp.maximum(sums.count.sum(), 1.0)
    prior = sums.count / n  # [C]
    safe = jnp.maximum(sums.count, 1.0)
    mu = sums.sum / safe[:, None]
    mean_sq = sums.sq / safe  # E_k ||f||^2
    mu_sq = jnp.sum(jnp.square(mu), axis=-1)
    if variance == "code":
        per_class = prior * mean_sq - prior ** 2 * mu_sq
    else:
        per_class = prior * (mean_sq - mu_sq)
    present = sums.count > 0
    v = jnp.sum(jnp.where(present, per_class, 0.0)) / n
    h = prior[:, None] * mu
    return v, h


ABSENT_LOGIT = -1e30  # a class without a prototype is never the nearest (finite: the loss stays finite)


def nearest_prototype_logits(features, protos, present):
    """-||f - c^k||^2 for every class k: features [B, d], protos [C, d], present [C] bool -> [B, C].

    The argmax is the nearest present prototype; a class without a prototype
    gets `ABSENT_LOGIT`.

    Examples:
        >>> protos = jnp.array([[0.0, 0.0], [4.0, 0.0], [1.0, 0.0]])
        >>> logits = nearest_prototype_logits(jnp.array([[1.0, 0.0]]), protos, jnp.array([True, True, False]))
        >>> logits[0, :2].tolist(), int(logits.argmax())  # class 2 has no prototype
        ([-1.0, -9.0], 0)
    """
    features = jnp.asarray(features, jnp.float32)
    protos = jnp.asarray(protos, jnp.float32)
    cross = jnp.matmul(features, protos.T, precision=jax.lax.Precision.HIGHEST)
    sq = jnp.sum(features ** 2, axis=-1)[:, None] - 2.0 * cross + jnp.sum(protos ** 2, axis=-1)[None, :]
    return jnp.where(present[None, :], -jnp.maximum(sq, 0.0), ABSENT_LOGIT)


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
