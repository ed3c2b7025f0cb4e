"""FedFomo's kernel (Zhang et al., ICLR 2021): first-order model weights and the update.

For a client with baseline model theta_b and received models theta_1..theta_M
(one of them may be its own latest model), with validation losses L:

    raw_m = (L(theta_b) - L(theta_m)) / ||theta_m - theta_b||      (`raw_weights`)
    w_m   = max(raw_m, 0) / sum_k max(raw_k, 0)                     (`positive_weights`)
    theta = theta_b + sum_m w_m (theta_m - theta_b)                 (`apply_weights`)

so a model that is worse than the baseline on the client's validation data
gets weight 0 and the client never moves toward it; if no model is better, the
client keeps theta_b. The client-to-client affinity row grows by
``raw / |sum raw|`` (`affinity_increment`, the authors' code) and decides,
epsilon-greedily, whose models are downloaded next (`egreedy_select`), or, as
PFLlib's FedFomo, the highest entries of the row (`top_m_select`).

The norm is L1 by default (the authors' ``--model_delta_norm l1`` default,
which produced the published numbers) or L2 (the paper's ||.||). Pairs at
distance 0 (a model identical to the baseline) get weight 0. Pure, jit-able
functions of one client; nothing here knows about the engine.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NORMS = ("l1", "l2")


def parameter_distance(a, b, norm: str = "l1"):
    """||a - b|| over all leaves of two parameter trees: 'l1' (sum |.|) or 'l2' (Euclidean).

    Examples:
        >>> a, b = {"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([4.0, -2.0])}
        >>> float(parameter_distance(a, b, "l1")), float(parameter_distance(a, b, "l2"))
        (7.0, 5.0)
    """
    diffs = [jnp.ravel(x - y).astype(jnp.float32) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    if norm == "l1":
        return sum(jnp.sum(jnp.abs(d)) for d in diffs)
    if norm == "l2":
        return jnp.sqrt(sum(jnp.sum(jnp.square(d)) for d in diffs))
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


def raw_weights(base_loss, losses, distances, valid=None):
    """(L_b - L_m) / d_m for each received model [M]; 0 where d_m == 0 or the slot is not ``valid``.

    Examples:
        >>> losses, distances = jnp.array([0.5, 1.5, 0.8]), jnp.array([2.0, 1.0, 0.0])
        >>> raw_weights(1.0, losses, distances).tolist()  # better, worse, and a model at distance 0
        [0.25, -0.5, 0.0]
    """
    ok = distances > 0
    if valid is not None:
        ok = ok & valid
    return jnp.where(ok, (base_loss - losses) / jnp.where(ok, distances, 1.0), 0.0)


def positive_weights(raw):
    """max(raw, 0) normalised to sum 1; all zeros when no model beats the baseline.

    Examples:
        >>> positive_weights(jnp.array([0.25, -0.5, 0.75])).tolist()
        [0.25, 0.0, 0.75]
        >>> positive_weights(jnp.array([-1.0, -2.0])).tolist()  # nobody beats the baseline
        [0.0, 0.0]
    """
    pos = jnp.maximum(raw, 0.0)
    total = jnp.sum(pos)
    return jnp.where(total > 0, pos / jnp.where(total > 0, total, 1.0), 0.0)


def apply_weights(base, models, weights):
    """theta_b + sum_m w_m (theta_m - theta_b). ``models`` is a stacked tree [M, ...].

    Examples:
        >>> base = {"w": jnp.array([0.0, 0.0])}
        >>> models = {"w": jnp.array([[2.0, 0.0], [0.0, 4.0]])}  # M=2 received models
        >>> apply_weights(base, models, jnp.array([0.5, 0.25]))["w"].tolist()
        [1.0, 1.0]
    """

    def leaf(b, m):
        diff = m.astype(jnp.float32) - b.astype(jnp.float32)[None]
        return (b + jnp.tensordot(weights.astype(jnp.float32), diff, axes=1)).astype(b.dtype)

    return jax.tree.map(leaf, base, models)


def affinity_increment(raw):
    """raw / |sum raw| (the authors' client-to-client weight update; 1e-9 floor on the sum).

    Examples:
        >>> affinity_increment(jnp.array([0.5, -0.25, 0.75])).tolist()
        [0.5, -0.25, 0.75]
    """
    return raw / jnp.maximum(jnp.abs(jnp.sum(raw)), 1e-9)


def exploration_rate(round_index, epsilon: float, decay: float):
    """epsilon - round * decay, floored at 0 (the authors' schedule).

    Examples:
        >>> [round(float(exploration_rate(t, epsilon=0.3, decay=0.05)), 3) for t in (0, 2, 10)]
        [0.3, 0.2, 0.0]
    """
    return jnp.maximum(epsilon - decay * round_index, 0.0)


def egreedy_select(key, affinity, available, count: int, epsilon):
    """Pick ``count`` clients to download from -> (indices [count], valid [count]).

    Each slot explores with probability ``epsilon``; the greedy slots take the
    highest-affinity ``available`` clients (ties broken at random), the
    exploring slots uniform random ones among the remaining available. Slots
    left empty (fewer available clients than ``count``) are not ``valid``.

    Examples:
        >>> affinity = jnp.array([0.1, 0.9, 0.5, 0.7])
        >>> available = jnp.array([True, True, True, False])
        >>> index, valid = egreedy_select(jax.random.PRNGKey(0), affinity, available, count=2, epsilon=0.0)
        >>> sorted(index.tolist()), valid.tolist()  # the two highest-affinity available clients
        ([1, 2], [True, True])
    """
    n = affinity.shape[0]
    k_explore, k_tie, k_random = jax.random.split(key, 3)
    n_explore = jnp.sum(jax.random.uniform(k_explore, (count,)) < epsilon)
    tie = jax.random.uniform(k_tie, (n,))
    greedy_order = jnp.lexsort((-tie, -jnp.where(available, affinity, -jnp.inf)))
    greedy_rank = jnp.zeros(n, jnp.int32).at[greedy_order].set(jnp.arange(n, dtype=jnp.int32))
    greedy = available & (greedy_rank < count - n_explore)
    rest = available & ~greedy
    random_order = jnp.argsort(-jnp.where(rest, jax.random.uniform(k_random, (n,)), -1.0))
    random_rank = jnp.zeros(n, jnp.int32).at[random_order].set(jnp.arange(n, dtype=jnp.int32))
    chosen = greedy | (rest & (random_rank < n_explore))
    index = jnp.argsort(~chosen, stable=True)[:count]
    return index, chosen[index]


def top_m_select(key, affinity, count: int):
    """The ``count`` clients of highest affinity (ties broken at random) -> indices [count], highest first
    (PFLlib's ``torch.topk`` of the affinity row, the client itself a candidate like any other).

    Examples:
        >>> top_m_select(jax.random.PRNGKey(0), jnp.array([1.0, 0.2, 0.7, -0.5]), count=2).tolist()
        [0, 2]
    """
    tie = jax.random.uniform(key, affinity.shape)
    return jnp.lexsort((-tie, -affinity))[:count]
