"""The minimum-size repair of a Dirichlet partition: lift every client below ``min_size`` by moving samples to it.

The rule (data/partition.py's `dirichlet`): small clients are lifted one after
another in index order; each move takes what the small client still needs
(at most what the source can spare) from

- plain: the currently largest client (the first of the largest), which keeps
  at least ``min_size``;
- top-k (each client at most k classes): unused samples of a class the client
  may hold (its held classes first, then the most plentiful), else the
  (client, class) with the most to spare of such a class.

Every move draws its samples with ``rng.choice(len(source), give,
replace=False)`` from the source's samples in index order, so the result is a
pure function of the seed. A move adds at least one sample, so a client needs
at most ``min_size`` moves and the repair always ends: in time about
(moves x log of the pool), without a pass over the pool per move, so 100,000
clients of a pool of millions repair in seconds. `lift_small_clients` never
fails once the pool holds ``num_clients * min_size`` samples;
`lift_small_clients_top_k` returns the clients that nothing is left for.
"""

from __future__ import annotations

import heapq

import numpy as np

BLOCK = 512  # samples per block of a `RankedPool`


class RankedPool:
    """A sorted set of sample indices from which samples leave by rank: ``take(ranks)`` returns the samples at
    those ranks (0 = the smallest index still present) and removes them, in time O(blocks + ranks x BLOCK)."""

    def __init__(self, samples: np.ndarray):
        self.samples = np.asarray(samples, np.int64)
        self.present = np.ones(self.samples.size, bool)
        self.counts = np.bincount(np.arange(self.samples.size) // BLOCK,
                                  minlength=-(-self.samples.size // BLOCK)).astype(np.int64)
        self.size = int(self.samples.size)

    def take(self, ranks: np.ndarray) -> np.ndarray:
        ranks = np.asarray(ranks, np.int64)
        ends = np.cumsum(self.counts)
        blocks = np.searchsorted(ends, ranks, side="right")
        within = ranks - (ends[blocks] - self.counts[blocks])
        positions = np.array([b * BLOCK + np.flatnonzero(self.present[b * BLOCK:(b + 1) * BLOCK])[w]
                              for b, w in zip(blocks.tolist(), within.tolist())], np.int64)
        self.present[positions] = False
        np.subtract.at(self.counts, blocks, 1)
        self.size -= positions.size
        return self.samples[positions]


def _grouped(keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices sorted by key, ascending within a key; start offsets of each key 0..count) of ``keys`` >= 0."""
    used = np.flatnonzero(keys >= 0)
    order = used[np.argsort(keys[used], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(np.bincount(keys[used], minlength=count))])
    return order, starts


class _Pools:
    """Each group's samples (clients, or (client, class) pairs), made a `RankedPool` when a sample first leaves."""

    def __init__(self, keys: np.ndarray, count: int):
        self.order, self.starts = _grouped(keys, count)
        self.pools: dict[int, RankedPool] = {}

    def draw(self, group: int, give: int, rng: np.random.Generator) -> np.ndarray:
        pool = self.pools.get(group)
        if pool is None:
            pool = self.pools[group] = RankedPool(self.order[self.starts[group]:self.starts[group + 1]])
        return pool.take(rng.choice(pool.size, give, replace=False))


def lift_small_clients(owner: np.ndarray, num_clients: int, min_size: int, rng: np.random.Generator) -> None:
    """Lift every client of ``owner`` (per-sample client id, all >= 0) below ``min_size`` (in place): while a
    client holds fewer, random samples move to it from the largest client, which keeps ``min_size``. Needs
    ``num_clients * min_size <= owner.size`` (then some client always has samples to spare)."""
    sizes = np.bincount(owner, minlength=num_clients)
    small = np.flatnonzero(sizes < min_size)
    if not small.size:
        return
    pools = _Pools(owner, num_clients)
    largest = [(-int(s), i) for i, s in enumerate(sizes.tolist())]  # np.argmax's order: size down, index up
    heapq.heapify(largest)
    for r in small.tolist():
        while sizes[r] < min_size:
            while -largest[0][0] != sizes[largest[0][1]]:  # an entry from before the client gave samples away
                heapq.heappop(largest)
            donor = largest[0][1]
            give = int(min(min_size - sizes[r], sizes[donor] - min_size))
            owner[pools.draw(donor, give, rng)] = r
            sizes[donor] -= give
            sizes[r] += give
            heapq.heappush(largest, (-int(sizes[donor]), donor))
            heapq.heappush(largest, (-int(sizes[r]), r))


def lift_small_clients_top_k(owner: np.ndarray, labels: np.ndarray, num_clients: int, num_classes: int, k: int,
                             min_size: int, rng: np.random.Generator) -> np.ndarray:
    """Lift clients below ``min_size`` without giving any client more than k classes (in place; owner -1: unused).

    A small client takes, one class at a time, samples of a class it may hold
    (its own classes; any class while it holds fewer than k): first unused
    samples (its held classes first, then the most plentiful), else random
    samples from the client with the most to spare of such a class (which
    keeps at least ``min_size``; ties: the lowest client, then the lowest
    class). Returns the clients still below ``min_size`` (nothing was left
    that they may hold), in index order.
    """
    used = owner >= 0
    hist = np.bincount(owner[used] * num_classes + labels[used],
                       minlength=num_clients * num_classes).reshape(num_clients, num_classes)
    sizes = hist.sum(1)
    small = np.flatnonzero(sizes < min_size)
    if not small.size:
        return small
    unused_order, unused_starts = _grouped(np.where(owner < 0, labels, -1), num_classes)
    unused = [RankedPool(unused_order[unused_starts[c]:unused_starts[c + 1]]) for c in range(num_classes)]
    left = np.array([pool.size for pool in unused], np.int64)
    owned = _Pools(np.where(owner >= 0, owner * num_classes + labels, -1), num_clients * num_classes)
    spare = [[] for _ in range(num_classes)]  # per class: heap of (-spare, client), spare = min(held, surplus)

    def push_spares(i: int) -> None:
        surplus = sizes[i] - min_size
        for c in np.flatnonzero(hist[i] > 0).tolist():
            value = int(min(hist[i, c], surplus))
            if value > 0:
                heapq.heappush(spare[c], (-value, i))

    for i in np.flatnonzero(sizes > min_size).tolist():
        push_spares(i)

    def best_spare(c: int) -> tuple[int, int]:
        """(spare, client) of the client with the most to spare of class c (the lowest on ties), or (0, -1)."""
        heap = spare[c]
        while heap:
            value, i = -heap[0][0], heap[0][1]
            if value == min(hist[i, c], sizes[i] - min_size):
                return value, i
            heapq.heappop(heap)  # from before the client gave samples away
        return 0, -1

    stuck = []
    for r in small.tolist():
        while (need := int(min_size - sizes[r])) > 0:
            held = hist[r] > 0
            allowed = held if held.sum() >= k else np.ones(num_classes, bool)
            free = np.where(allowed & (left > 0), left + held * labels.size, 0)  # held classes first
            if free.max() > 0:
                c = int(np.argmax(free))
                give = int(min(need, left[c]))
                left[c] -= give
                taken = unused[c].take(rng.choice(unused[c].size, give, replace=False))
            else:
                offers = [(*best_spare(c), c) for c in np.flatnonzero(allowed).tolist()]
                value, donor, c = min(offers, key=lambda o: (-o[0], o[1], o[2]))
                if value == 0:
                    stuck.append(r)
                    break
                give = int(min(need, value))
                taken = owned.draw(donor * num_classes + c, give, rng)
                hist[donor, c] -= give
                sizes[donor] -= give
                push_spares(donor)
            owner[taken] = r
            hist[r, c] += give
            sizes[r] += give
    return np.asarray(stuck, np.int64)
