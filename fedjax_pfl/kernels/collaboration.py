"""How much each client's model is built from other clients' models: the scalars of a round's
collaboration diagnostics (`Method.round_diagnostics`, docs/methods/conventions.md).

A method that weights other clients' models per client (FedAMP's and
DiversiFed's mixing matrix, FedFomo's first-order weights, APPLE's
relationship vectors, FedCAC's collaborators, FedPAC's head combination)
reports, per round:

    self_weight    mean over the round's clients of the weight w_ii of a client's own model,
    other_weight   mean over them of sum_{j != i} |w_ij|, the weight mass on other clients
                   (1 - self_weight for a convex mix; larger when some weights are negative),
    distance_mean  mean Euclidean distance between two different stored models,
    distance_max   the largest such distance.

A method whose self-weight stays at 1 learns nothing from the others. Pure,
jit-able; scalars come back as float32.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_pfl.kernels import model_distance


def weight_summary(weights, own):
    """{'self_weight', 'other_weight'} of mixing rows ``weights`` [S, N]; ``own`` [S]: each row's own column.

    Examples:
        >>> w = jnp.array([[0.5, 0.5, 0.0], [-0.25, 1.0, 0.25]])  # rows of clients 0 and 1
        >>> {k: float(v) for k, v in weight_summary(w, jnp.array([0, 1])).items()}
        {'self_weight': 0.75, 'other_weight': 0.5}
    """
    weights = jnp.asarray(weights, jnp.float32)
    rows = jnp.arange(weights.shape[0])
    own_weight = weights[rows, own]
    others = jnp.sum(jnp.abs(weights), axis=1) - jnp.abs(own_weight)
    return client_means({"self_weight": own_weight, "other_weight": others})


def own_and_others(weights, is_own):
    """{'self_weight', 'other_weight'} of ONE client's weights [M] over candidate models, ``is_own`` [M]
    marking those that are the client's own: per-client values for `client_means`.

    Examples:
        >>> out = own_and_others(jnp.array([0.25, 0.75, 0.0]), jnp.array([True, False, False]))
        >>> {k: float(v) for k, v in out.items()}
        {'self_weight': 0.25, 'other_weight': 0.75}
    """
    weights = jnp.asarray(weights, jnp.float32)
    return {"self_weight": jnp.sum(jnp.where(is_own, weights, 0.0)),
            "other_weight": jnp.sum(jnp.where(is_own, 0.0, jnp.abs(weights)))}


def client_means(per_client: dict) -> dict:
    """Each per-client value [S] (bools as shares) averaged over the round's clients, as float32.

    Examples:
        >>> {k: float(v) for k, v in client_means({"all_zero": jnp.array([True, False])}).items()}
        {'all_zero': 0.5}
    """
    return {k: jnp.mean(jnp.asarray(v, jnp.float32)) for k, v in per_client.items()}


def distance_summary(models):
    """{'distance_mean', 'distance_max'} over the pairs of different rows of ``models``
    (a stacked tree [N, ...] or a matrix [N, P]); 0 for fewer than two models.

    Examples:
        >>> out = distance_summary(jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]))
        >>> {k: round(float(v), 3) for k, v in out.items()}  # distances 5, 1 and sqrt(18)
        {'distance_mean': 3.414, 'distance_max': 5.0}
    """
    sq = model_distance.pairwise_sq_distances(models)
    n = sq.shape[0]
    distances = jnp.sqrt(jnp.maximum(sq, 0.0))
    pairs = max(n * (n - 1), 1)
    return {"distance_mean": (jnp.sum(distances) / pairs).astype(jnp.float32),
            "distance_max": jnp.max(distances).astype(jnp.float32)}
