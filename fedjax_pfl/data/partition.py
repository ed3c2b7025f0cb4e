"""Seeded client partitions of a labelled pool, and their summaries.

Every partition is a pure function of (labels, parameters, seed): it draws from
`np.random.default_rng(seed)` only, so the same seed gives the same partition
and a different seed a different one. A partition is a list with one sorted
int64 index array per client; no index appears twice (except across clients
of `client_dirichlet`, which samples each client independently). Schemes:

- `iid`: a random permutation cut into near-equal parts.
- `dirichlet`: label skew, each class split over clients by Dir(alpha), then a
  deterministic repair lifts small clients to `min_size` (no retry loop).
- `pathological`: each client holds exactly k classes (shards).
- `practical`: FedPAC / DiversiFed groups with dominant classes.
- `client_dirichlet`: pFedKD-WCL's authors: each client draws a Dir(alpha)
  class mix, keeps its top k classes and samples a fixed size from the pool.

Per-client train/test: `split_train_test` (stratified fraction),
`sample_per_client` (exact per-client sizes), and
`distribute_test_by_label_distribution` (deal an official test set).
`make_partition` is the one front door by scheme name. This module knows
nothing about images or devices; `client_data.stack_clients` builds arrays.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Sequence

import numpy as np

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.min_size_repair import lift_small_clients, lift_small_clients_top_k

Partition = list[np.ndarray]


# --------------------------------------------------------------------------
# Validation and small helpers
# --------------------------------------------------------------------------

def _check_labels(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise UserError(f"labels must be a non-empty 1-D array, got shape {labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"labels must be integers (class ids), got dtype {labels.dtype}.")
    if labels.min() < 0:
        raise UserError("labels must be non-negative class ids; found a negative label.")
    return labels.astype(np.int64, copy=False)


def _check_clients(labels: np.ndarray, num_clients: int) -> int:
    if int(num_clients) != num_clients or num_clients < 1:
        raise UserError(f"num_clients must be a positive integer, got {num_clients}.")
    if num_clients > labels.size:
        raise UserError(
            f"{num_clients} clients but only {labels.size} samples: every client needs at "
            "least one sample; use fewer clients or a larger dataset.")
    return int(num_clients)


def _num_classes(*label_arrays: np.ndarray) -> int:
    return int(max(int(a.max()) for a in label_arrays if a.size)) + 1


def indices_by_owner(owner, num_clients: int | None = None) -> Partition:
    """Per-client sorted sample indices from a per-sample client id (-1: unused), for clients 0 .. num_clients-1
    (default: the largest id + 1); one sort of the pool, whatever the number of clients.

    Examples:
        >>> [p.tolist() for p in indices_by_owner(np.array([1, 0, 1, -1, 2]))]
        [[1], [0, 2], [4]]
    """
    owner = np.asarray(owner, np.int64)
    return _from_owner(owner, int(owner.max()) + 1 if num_clients is None else int(num_clients))


def _from_owner(owner: np.ndarray, num_clients: int) -> Partition:
    """Turn a per-sample client id (-1 = unused) into sorted per-client index arrays."""
    used = np.flatnonzero(owner >= 0)
    order = np.argsort(owner[used], kind="stable")
    sizes = np.bincount(owner[used], minlength=num_clients)
    return [a.astype(np.int64) for a in np.split(used[order], np.cumsum(sizes)[:-1])]


def _shuffled_class_indices(labels: np.ndarray, c: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.flatnonzero(labels == c))


def _proportional_counts(weights: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Integer counts summing to `total`, proportional to integer `weights`.

    Largest-remainder rounding with exact integer arithmetic; ties broken at
    random. When total <= sum(weights), no count exceeds its weight.
    """
    weights = np.asarray(weights, dtype=np.int64)
    w_sum = int(weights.sum())
    if total == 0 or w_sum == 0:
        return np.zeros_like(weights)
    scaled = weights * int(total)
    base, rem = scaled // w_sum, scaled % w_sum
    short = int(total) - int(base.sum())
    if short:
        order = np.lexsort((rng.random(weights.size), -rem))
        base[order[:short]] += 1
    return base


def _split_counts(counts: np.ndarray, n_first: int, rng: np.random.Generator) -> np.ndarray:
    """Per-class counts for the first of two parts, summing to `n_first`.

    Proportional to `counts`; where the sizes allow, every class with >= 2
    samples keeps at least one sample in each part.
    """
    first = _proportional_counts(counts, n_first, rng)
    lo = (counts >= 2).astype(np.int64)
    hi = counts - lo
    if not lo.sum() <= n_first <= hi.sum():
        return first
    first = np.clip(first, lo, hi)
    ideal = counts * (n_first / max(int(counts.sum()), 1))
    while (gap := n_first - int(first.sum())) != 0:   # at most one step per class
        step = 1 if gap > 0 else -1
        room = first < hi if step > 0 else first > lo
        score = np.where(room, step * (ideal - first), -np.inf)
        first[int(np.argmax(score))] += step
    return first


def _draw_two_parts(idx: np.ndarray, labels: np.ndarray, first: np.ndarray,
                    second: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw `first[c]` then `second[c]` samples of each class c from `idx`, at random."""
    idx = rng.permutation(idx)
    lab = labels[idx]
    order = np.argsort(lab, kind="stable")
    idx, lab = idx[order], lab[order]
    starts = np.searchsorted(lab, lab, side="left")
    rank = np.arange(idx.size) - starts
    in_first = rank < first[lab]
    in_second = ~in_first & (rank < first[lab] + second[lab])
    return np.sort(idx[in_first]), np.sort(idx[in_second])


def label_histograms(indices_per_client: Sequence[np.ndarray], labels, num_classes: int) -> np.ndarray:
    """Per-client label counts, int64 [num_clients, num_classes]."""
    labels = np.asarray(labels, dtype=np.int64)
    sizes = [len(i) for i in indices_per_client]
    flat = labels[np.concatenate([np.asarray(i, np.int64) for i in indices_per_client]
                                 + [np.zeros(0, np.int64)])]
    if flat.size and flat.max() >= num_classes:
        raise UserError(f"found label {flat.max()} but num_classes is {num_classes}.")
    client = np.repeat(np.arange(len(sizes)), sizes)
    hist = np.bincount(client * num_classes + flat, minlength=len(sizes) * num_classes)
    return hist.reshape(len(sizes), num_classes).astype(np.int64)


# --------------------------------------------------------------------------
# Schemes
# --------------------------------------------------------------------------

def iid(labels, num_clients: int, seed: int) -> Partition:
    """A random permutation of the pool cut into `num_clients` near-equal parts."""
    labels = _check_labels(labels)
    num_clients = _check_clients(labels, num_clients)
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(labels.size), num_clients)
    return [np.sort(p).astype(np.int64) for p in parts]


def dirichlet(labels, num_clients: int, alpha: float, seed: int, min_size: int = 10,
              max_classes_per_client: int | None = None) -> Partition:
    """Label skew: each class is split over clients with proportions ~ Dir(alpha).

    One draw, then a deterministic repair: while a client holds fewer than
    `min_size` samples, random samples move to it from the currently largest
    client (which keeps at least `min_size`). Uses the whole pool.

    `max_classes_per_client` = k keeps only each client's k largest classes of
    the draw (ties: lower class id); the other samples stay unused. The repair
    then respects the limit (data/min_size_repair.py). k >= the number of classes
    (or None) gives exactly the plain partition. pFedKD-WCL's MNIST: "each
    client predominantly holds data from a subset of digits"; the authors'
    script (HengruiH/pFedKD utils/MNIST_dirichlet.py) draws Dir(alpha) over the
    classes per client, keeps its top 3 (renormalised) and samples a fixed
    size (1165..3834) per client from the class pools, independently per client
    (clients may share samples): that is `client_dirichlet`. Here the classes
    are split over clients (disjoint, whole pool) and then cut to each client's
    top k.
    """
    labels = _check_labels(labels)
    num_clients = _check_clients(labels, num_clients)
    if not alpha > 0:
        raise UserError(f"Dirichlet alpha must be > 0 (small = more skew), got {alpha}.")
    if min_size < 0:
        raise UserError(f"min_size must be >= 0, got {min_size}.")
    if max_classes_per_client is not None and (int(max_classes_per_client) != max_classes_per_client
                                               or max_classes_per_client < 1):
        raise UserError(f"max_classes_per_client must be a whole number >= 1, got {max_classes_per_client}.")
    if num_clients * min_size > labels.size:
        raise UserError(
            f"{num_clients} clients x min_size {min_size} = {num_clients * min_size} samples "
            f"needed but the pool has {labels.size}; lower min_size or num_clients.")
    rng = np.random.default_rng(seed)
    owner = np.empty(labels.size, np.int64)
    for c in np.unique(labels):
        idx = _shuffled_class_indices(labels, c, rng)
        p = rng.dirichlet(np.full(num_clients, float(alpha)))
        counts = _proportional_counts(np.round(p * 2**32).astype(np.int64), idx.size, rng)
        owner[idx] = np.repeat(np.arange(num_clients), counts)
    num_classes = _num_classes(labels)
    if max_classes_per_client is not None and max_classes_per_client < num_classes:
        owner = _keep_top_classes(owner, labels, num_clients, num_classes, int(max_classes_per_client))
        stuck = lift_small_clients_top_k(owner, labels, num_clients, num_classes, int(max_classes_per_client),
                                         min_size, rng)
        if stuck.size:
            held = int(np.count_nonzero(owner == stuck[0]))
            raise UserError(
                f"dirichlet with max_classes_per_client={max_classes_per_client}: {stuck.size} client(s) cannot reach "
                f"min_size {min_size} (client {stuck[0]} holds {held}): no class it may hold has samples to spare; "
                "lower min_size, raise max_classes_per_client, or use fewer clients.")
        return _from_owner(owner, num_clients)
    lift_small_clients(owner, num_clients, min_size, rng)
    return _from_owner(owner, num_clients)


def _owner_histograms(owner: np.ndarray, labels: np.ndarray, num_clients: int, num_classes: int) -> np.ndarray:
    """[num_clients, num_classes] counts of the samples each client owns (owner -1: unused)."""
    used = owner >= 0
    flat = np.bincount(owner[used] * num_classes + labels[used], minlength=num_clients * num_classes)
    return flat.reshape(num_clients, num_classes)


def _keep_top_classes(owner: np.ndarray, labels: np.ndarray, num_clients: int, num_classes: int,
                      k: int) -> np.ndarray:
    """``owner`` with each client's samples outside its k largest classes set unused (-1)."""
    hist = _owner_histograms(owner, labels, num_clients, num_classes)
    top = np.argsort(-hist, axis=1, kind="stable")[:, :k]  # ties: lower class id first
    keep = np.zeros((num_clients, num_classes), bool)
    np.put_along_axis(keep, top, True, axis=1)
    owner = owner.copy()
    owner[(owner >= 0) & ~keep[np.maximum(owner, 0), labels]] = -1
    return owner


def pathological(labels, num_clients: int, classes_per_client: int, seed: int) -> Partition:
    """Each client holds exactly `classes_per_client` classes (shards, McMahan et al.).

    Clients pick, one after another, the k least-used classes (ties at
    random), so class use stays balanced and every class is held by someone
    when num_clients * k >= number of classes (otherwise some classes go
    unused). Each class's samples are split evenly among its holders.
    """
    labels = _check_labels(labels)
    num_clients = _check_clients(labels, num_clients)
    classes = np.unique(labels)
    k = classes_per_client
    if int(k) != k or not 1 <= k <= classes.size:
        raise UserError(
            f"classes_per_client must be in [1, {classes.size}] (the number of classes "
            f"present), got {k}.")
    rng = np.random.default_rng(seed)
    use = np.zeros(classes.size, np.int64)
    holders: list[list[int]] = [[] for _ in classes]
    for i in range(num_clients):
        chosen = np.lexsort((rng.random(classes.size), use))[:k]
        use[chosen] += 1
        for j in chosen:
            holders[j].append(i)
    owner = np.full(labels.size, -1, np.int64)
    for j, c in enumerate(classes):
        if not holders[j]:
            continue
        idx = _shuffled_class_indices(labels, c, rng)
        if idx.size < len(holders[j]):
            raise UserError(
                f"class {c} has {idx.size} samples but {len(holders[j])} clients must hold it; "
                "use fewer clients or fewer classes_per_client.")
        parts = np.array_split(idx, len(holders[j]))
        for client, part in zip(holders[j], parts):
            owner[part] = client
    return _from_owner(owner, num_clients)


def default_dominant_classes(num_classes: int, num_groups: int, per_group: int) -> list[list[int]]:
    """Group g dominates classes (g * stride + j) % C, j < per_group, stride = max(1, C // G).

    Reproduces FedPAC's CIFAR-10 groups [0,1,2], [2,3,4], ..., [8,9,0]
    (5 groups x 3) and gives disjoint groups when G * per_group <= C
    (e.g. DiversiFed's 3 groups x 3 on 10 classes: [0,1,2], [3,4,5], [6,7,8]).
    """
    stride = max(1, num_classes // num_groups)
    return [[(g * stride + j) % num_classes for j in range(per_group)] for g in range(num_groups)]


def practical(labels, num_clients: int, num_groups: int, dominant_classes_per_group: int,
              uniform_fraction: float, samples_per_client: int, seed: int,
              dominant_classes: Sequence[Sequence[int]] | None = None) -> Partition:
    """FedPAC / DiversiFed "practical" non-IID: groups sharing dominant classes.

    Client i belongs to group i % num_groups. It gets exactly
    `samples_per_client` samples: round(s * m) spread evenly over all classes
    (s = uniform_fraction) and the rest spread evenly over its group's dominant
    classes (`dominant_classes`, default `default_dominant_classes`).
    Remainders go to random classes. Sampling is without replacement; samples
    not drawn stay unused.
    """
    labels = _check_labels(labels)
    num_clients = _check_clients(labels, num_clients)
    C = _num_classes(labels)
    if int(num_groups) != num_groups or num_groups < 1:
        raise UserError(f"num_groups must be a positive integer, got {num_groups}.")
    if not 0.0 <= uniform_fraction <= 1.0:
        raise UserError(f"uniform_fraction must be in [0, 1], got {uniform_fraction}.")
    if int(samples_per_client) != samples_per_client or samples_per_client < 1:
        raise UserError(f"samples_per_client must be a positive integer, got {samples_per_client}.")
    if dominant_classes is None:
        d = dominant_classes_per_group
        if int(d) != d or not 1 <= d <= C:
            raise UserError(f"dominant_classes_per_group must be in [1, {C}], got {d}.")
        dominant_classes = default_dominant_classes(C, num_groups, d)
    groups = [np.asarray(g, np.int64) for g in dominant_classes]
    if len(groups) != num_groups or any(
            g.size == 0 or g.min() < 0 or g.max() >= C or np.unique(g).size != g.size for g in groups):
        raise UserError(
            f"dominant_classes must list {num_groups} groups of distinct class ids in [0, {C}), "
            f"got {dominant_classes}.")
    rng = np.random.default_rng(seed)
    n_uniform = int(round(uniform_fraction * samples_per_client))
    quota = np.zeros((num_clients, C), np.int64)
    for i in range(num_clients):
        quota[i] = _proportional_counts(np.ones(C, np.int64), n_uniform, rng)
        dom = groups[i % num_groups]
        quota[i, dom] += _proportional_counts(np.ones(dom.size, np.int64),
                                              samples_per_client - n_uniform, rng)
    available = np.bincount(labels, minlength=C)
    short = np.flatnonzero(quota.sum(0) > available)
    if short.size:
        c = int(short[0])
        raise UserError(
            f"practical partition needs {int(quota[:, c].sum())} samples of class {c} but the "
            f"pool has {int(available[c])} (classes short: {short.tolist()}); lower "
            "samples_per_client or num_clients, or raise uniform_fraction.")
    owner = np.full(labels.size, -1, np.int64)
    for c in range(C):
        idx = _shuffled_class_indices(labels, c, rng)
        take = quota[:, c]
        owner[idx[:take.sum()]] = np.repeat(np.arange(num_clients), take)
    return _from_owner(owner, num_clients)


def linspace_sizes(size_range: Sequence[int], num_clients: int) -> np.ndarray:
    """Client sizes floor(linspace(lo, hi, num_clients)), int64: the pFedKD-WCL authors' sizes.

    Examples:
        >>> linspace_sizes((1165, 3834), 4).tolist()
        [1165, 2054, 2944, 3834]
    """
    if len(size_range) != 2 or any(int(v) != v for v in size_range):
        raise UserError(f"size_range must be two whole numbers [smallest, largest], got {list(size_range)}.")
    lo, hi = (int(v) for v in size_range)
    if not 1 <= lo <= hi:
        raise UserError(f"size_range [{lo}, {hi}] must satisfy 1 <= smallest <= largest.")
    return np.floor(np.linspace(lo, hi, int(num_clients))).astype(np.int64)


def client_dirichlet(labels, num_clients: int, alpha: float, size_range: Sequence[int], seed: int,
                     max_classes_per_client: int | None = None, disjoint: bool = False) -> Partition:
    """Each client draws its own class mix and samples a fixed number of examples from the whole pool.

    The pFedKD-WCL authors' MNIST data (HengruiH/pFedKD utils/MNIST_dirichlet.py),
    written from what it computes. Client i: sizes n_i = `linspace_sizes`
    (size_range, num_clients); proportions p_i ~ Dir(alpha) over the classes;
    only its k = `max_classes_per_client` largest are kept (renormalised; ties:
    lower class id; None keeps all); n_i p_i is rounded to whole counts summing
    to n_i; then that many samples of each class are drawn without replacement
    from the class's whole pool.

    Overlap, as the authors': a client never holds a sample twice, but clients
    draw independently of each other, so two clients may hold the same sample
    (and one client's test sample may be another's train sample once
    `split_train_test` cuts each client). This scheme is the one that breaks
    this module's "no index appears twice" across clients. Not every sample is used.
    With ``disjoint`` (the pFedKD-WCL paper's reading: each client its own
    samples), every class's pool is shuffled once and dealt out in slices, so
    no sample is in two clients; where the clients ask more of a class than
    it holds, each client's count of that class is cut in proportion (its mix
    keeps its shape, its size shrinks).

    Where it differs from the authors' script: their rounding floors each count
    and adds the remainder (0 to k-1 samples) to class 9, whether or not class 9
    is among the client's top k, so a client can hold one or two samples of a
    (k+1)-th class; here the remainder goes to the kept classes by largest
    remainder, so a client holds at most k classes, as the paper describes.
    Their script is unseeded (numpy's and torch's global generators); here
    everything comes from `np.random.default_rng(seed)`. A class a client asks
    more of than the pool holds is an error, as in their script.
    """
    labels = _check_labels(labels)
    num_clients = _check_clients(labels, num_clients)
    if not alpha > 0:
        raise UserError(f"Dirichlet alpha must be > 0 (small = more skew), got {alpha}.")
    num_classes = _num_classes(labels)
    k = num_classes if max_classes_per_client is None else max_classes_per_client
    if int(k) != k or k < 1:
        raise UserError(f"max_classes_per_client must be a whole number >= 1, got {max_classes_per_client}.")
    sizes = linspace_sizes(size_range, num_clients)
    pools = [np.flatnonzero(labels == c) for c in range(num_classes)]
    most = int(np.sort([p.size for p in pools])[::-1][:int(k)].sum())
    if sizes.max() > most:
        raise UserError(f"a client of {sizes.max()} samples cannot be drawn from at most {k} classes that hold "
                        f"{most} samples together; lower size_range or raise max_classes_per_client.")
    if disjoint:
        counts = client_class_counts(labels, num_clients, alpha, size_range, seed, max_classes_per_client)
        return _disjoint_draw(counts, pools, np.random.default_rng((seed, 1)))
    rng = np.random.default_rng(seed)
    parts = []
    for i, n in enumerate(sizes):
        counts = _class_counts(rng, int(n), num_classes, alpha, int(k))
        short = np.flatnonzero(counts > [pool.size for pool in pools])
        if short.size:
            c = int(short[0])
            raise UserError(f"client {i} draws {counts[c]} samples of class {c} but the pool has "
                            f"{pools[c].size}; lower size_range or raise alpha (or try another seed).")
        picked = [rng.choice(pools[c], counts[c], replace=False) for c in np.flatnonzero(counts)]
        parts.append(np.sort(np.concatenate(picked)).astype(np.int64))
    return parts


def _class_counts(rng, n: int, num_classes: int, alpha: float, k: int) -> np.ndarray:
    """One client's class counts [C]: p ~ Dir(alpha), its k largest kept and renormalised, n split by them."""
    p = rng.dirichlet(np.full(num_classes, float(alpha)))
    kept = np.zeros(num_classes, np.int64)
    top = np.argsort(-p, kind="stable")[:k]
    kept[top] = np.round(p[top] * 2**32).astype(np.int64)
    return _proportional_counts(kept, n, rng)


def client_class_counts(labels, num_clients: int, alpha: float, size_range: Sequence[int], seed: int,
                        max_classes_per_client: int | None = None) -> np.ndarray:
    """[N, C] the class counts each client of `client_dirichlet` asks for (``disjoint`` deals them out).

    Examples:
        >>> counts = client_class_counts(np.repeat(np.arange(4), 50), 3, 0.5, (10, 30), seed=0, max_classes_per_client=2)
        >>> counts.sum(axis=1).tolist(), bool(((counts > 0).sum(axis=1) <= 2).all())
        ([10, 20, 30], True)
    """
    labels = _check_labels(labels)
    num_classes = _num_classes(labels)
    k = num_classes if max_classes_per_client is None else int(max_classes_per_client)
    rng = np.random.default_rng(seed)
    return np.stack([_class_counts(rng, int(n), num_classes, alpha, k)
                     for n in linspace_sizes(size_range, _check_clients(labels, num_clients))])


def _disjoint_draw(counts, pools, rng) -> Partition:
    """Clients' samples from one shuffled pool per class, no sample in two clients: ``counts`` [N, C] as drawn;
    where the clients ask more of a class than its pool holds, each one's count of it is cut in proportion
    (floor of count x pool / demand), so the mixes keep their shape and the sizes shrink."""
    demand = counts.sum(axis=0)
    supply = np.array([pool.size for pool in pools])
    scale = np.minimum(1.0, supply / np.maximum(demand, 1))
    counts = np.floor(counts * scale[None, :]).astype(np.int64)
    ends = np.cumsum(counts, axis=0)
    shuffled = [rng.permutation(pool) for pool in pools]
    return [np.sort(np.concatenate([shuffled[c][ends[i, c] - counts[i, c]:ends[i, c]] for c in range(len(pools))]))
            .astype(np.int64) for i in range(counts.shape[0])]


# --------------------------------------------------------------------------
# Per-client train / test
# --------------------------------------------------------------------------

def split_train_test(indices_per_client: Sequence[np.ndarray], labels, train_fraction: float = 0.75,
                     seed: int = 0) -> tuple[Partition, Partition]:
    """Stratified per-client split: round(train_fraction * n_i) train samples.

    Train and test keep the client's label distribution; each class with >= 2
    samples lands in both parts where the sizes allow.
    """
    labels = _check_labels(labels)
    if not 0.0 < train_fraction < 1.0:
        raise UserError(f"train_fraction must be in (0, 1), got {train_fraction}.")
    C = _num_classes(labels)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for idx in indices_per_client:
        idx = np.asarray(idx, np.int64)
        counts = np.bincount(labels[idx], minlength=C)
        first = _split_counts(counts, int(round(train_fraction * idx.size)), rng)
        tr, te = _draw_two_parts(idx, labels, first, counts - first, rng)
        train.append(tr)
        test.append(te)
    return train, test


def sample_per_client(indices_per_client: Sequence[np.ndarray], labels, n_train: int,
                      n_test: int = 0, seed: int = 0) -> tuple[Partition, Partition]:
    """Draw exactly `n_train` train and `n_test` test samples from each client's pool.

    Both parts follow the pool's label distribution (stratified); the rest of
    the pool is left unused. Raises UserError if a client's pool is too small.
    """
    labels = _check_labels(labels)
    if n_train < 1 or n_test < 0:
        raise UserError(f"need n_train >= 1 and n_test >= 0, got {n_train} and {n_test}.")
    sizes = np.array([len(i) for i in indices_per_client])
    small = np.flatnonzero(sizes < n_train + n_test)
    if small.size:
        raise UserError(
            f"{small.size} client(s) hold fewer than n_train + n_test = {n_train + n_test} "
            f"samples (client {small[0]} has {sizes[small[0]]}); lower the per-client sizes, "
            "use fewer clients, or raise min_size / samples_per_client of the partition.")
    C = _num_classes(labels)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for idx in indices_per_client:
        idx = np.asarray(idx, np.int64)
        take = _proportional_counts(np.bincount(labels[idx], minlength=C), n_train + n_test, rng)
        first = _split_counts(take, n_train, rng) if n_test else take
        tr, te = _draw_two_parts(idx, labels, first, take - first, rng)
        train.append(tr)
        test.append(te)
    return train, test


def distribute_test_by_label_distribution(
        train_indices_per_client: Sequence[np.ndarray], train_labels, test_labels, seed: int,
        test_per_client: int | Sequence[int] | None = None) -> Partition:
    """Deal an official test pool to clients following each client's train label mix.

    `test_per_client=None`: every test sample of class c is dealt to the
    clients holding class c in train, in proportion to their train counts of c
    (all test samples of classes seen in train are used).
    An integer (or one per client): client i asks for that many, split over
    classes in proportion to its train histogram. If a class runs out, its
    available samples are shared among the requesting clients in proportion
    to their requests, so those clients get fewer than asked (a warning names
    the classes). Test samples are never reused.
    """
    train_labels, test_labels = _check_labels(train_labels), _check_labels(test_labels)
    C = _num_classes(train_labels, test_labels)
    hist = label_histograms(train_indices_per_client, train_labels, C)
    N = hist.shape[0]
    available = np.bincount(test_labels, minlength=C)
    rng = np.random.default_rng(seed)
    if test_per_client is None:
        quota = np.stack([_proportional_counts(hist[:, c], int(available[c]), rng)
                          for c in range(C)], axis=1)
    else:
        asked = np.asarray(test_per_client, np.int64)
        if asked.ndim > 1 or asked.size not in (1, N) or asked.min() < 0:
            raise UserError(f"test_per_client must be one count >= 0 or one per client ({N}), "
                            f"got {test_per_client}.")
        asked = np.broadcast_to(asked.reshape(-1), (N,))
        quota = np.stack([_proportional_counts(hist[i], int(asked[i]), rng) for i in range(N)])
        short = np.flatnonzero(quota.sum(0) > available)
        for c in short:
            quota[:, c] = _proportional_counts(quota[:, c], int(available[c]), rng)
        if short.size:
            warnings.warn(
                f"test classes {short.tolist()} ran out: clients asking for them get fewer "
                "than test_per_client test samples.", stacklevel=2)
    owner = np.full(test_labels.size, -1, np.int64)
    for c in range(C):
        idx = _shuffled_class_indices(test_labels, c, rng)
        owner[idx[:quota[:, c].sum()]] = np.repeat(np.arange(N), quota[:, c])
    return _from_owner(owner, N)


# --------------------------------------------------------------------------
# Front door and summaries
# --------------------------------------------------------------------------

SCHEMES = {"iid": iid, "dirichlet": dirichlet, "pathological": pathological, "practical": practical,
           "client_dirichlet": client_dirichlet}


def make_partition(scheme: str, labels, num_clients: int, seed: int, **params: Any) -> Partition:
    """Partition `labels` over `num_clients` clients with the named scheme.

    `params` are the scheme's own arguments, e.g. alpha=0.1 for 'dirichlet',
    classes_per_client=2 for 'pathological'. Raises UserError for an unknown
    scheme or a missing / unknown parameter.
    """
    if scheme not in SCHEMES:
        raise UserError(f"unknown partition scheme {scheme!r}; choose one of {sorted(SCHEMES)}.")
    fn = SCHEMES[scheme]
    fixed = {"labels", "num_clients", "seed"}
    sig = inspect.signature(fn).parameters
    accepted = [p for p in sig if p not in fixed]
    unknown = sorted(set(params) - set(accepted))
    missing = [p for p in accepted if sig[p].default is inspect.Parameter.empty and p not in params]
    if unknown or missing:
        raise UserError(
            f"partition {scheme!r} takes parameters {accepted}; "
            + (f"unknown: {unknown}. " if unknown else "")
            + (f"missing: {missing}." if missing else ""))
    return fn(labels, num_clients, seed=seed, **params)


def _part_stats(indices_per_client: Sequence[np.ndarray], labels, num_classes: int) -> dict:
    hist = label_histograms(indices_per_client, labels, num_classes)
    sizes = hist.sum(1)
    share = hist.max(1) / np.maximum(sizes, 1)
    return {
        "sizes": sizes.tolist(),
        "histograms": hist.tolist(),
        "total": int(sizes.sum()),
        "min": int(sizes.min()), "max": int(sizes.max()), "mean": float(sizes.mean()),
        "classes_per_client": (hist > 0).sum(1).tolist(),
        "mean_max_class_share": float(share.mean()),
    }


def summary(train_indices_per_client: Sequence[np.ndarray], train_labels, num_classes: int,
            test_indices_per_client: Sequence[np.ndarray] | None = None, test_labels=None,
            info: dict | None = None) -> dict:
    """JSON-serialisable description of a partition (saved with a run).

    `test_labels` defaults to `train_labels` (both parts cut from one pool).
    `info` (e.g. {"scheme": "dirichlet", "alpha": 0.1, "seed": 0}) is stored as is.
    """
    out = {"num_clients": len(train_indices_per_client), "num_classes": int(num_classes),
           "info": dict(info or {}),
           "train": _part_stats(train_indices_per_client, train_labels, num_classes),
           "test": None}
    if test_indices_per_client is not None:
        labels = train_labels if test_labels is None else test_labels
        out["test"] = _part_stats(test_indices_per_client, labels, num_classes)
    return out


def format_summary(s: dict, max_rows: int = 10) -> str:
    """A short text table of a `summary` dict: sizes and label mix per client."""
    train, test = s["train"], s["test"]
    head = f"{s['num_clients']} clients, {s['num_classes']} classes"
    if s["info"]:
        head += " | " + ", ".join(f"{k}={v}" for k, v in s["info"].items())
    lines = [head, f"{'client':>6} {'train':>7} {'test':>6} {'classes':>7} {'top share':>9}"]
    for i in range(min(max_rows, s["num_clients"])):
        n = train["sizes"][i]
        top = max(train["histograms"][i]) / n if n else 0.0
        n_test = test["sizes"][i] if test else "-"
        lines.append(f"{i:>6} {n:>7} {n_test:>6} {train['classes_per_client'][i]:>7} {top:>9.2f}")
    if s["num_clients"] > max_rows:
        lines.append(f"   ... {s['num_clients'] - max_rows} more clients")
    for name, part in (("train", train), ("test", test)):
        if part:
            lines.append(f"{name}: total {part['total']}, per client min {part['min']} / mean "
                         f"{part['mean']:.1f} / max {part['max']}, mean top-class share "
                         f"{part['mean_max_class_share']:.2f}")
    return "\n".join(lines)
