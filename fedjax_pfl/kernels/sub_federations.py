"""FedFomo's server-side sub-federations (the authors' ``-nf k``): cluster averages offered to clients.

After each round the FedFomo authors' server (NVlabs/FedFomo, server.py
``update_server_models``) groups ALL clients into k "sub-federations" and
offers each client, beside the other clients' models, every sub-federation's
model and a global model:

1. affinity graph: each client's affinity row through a softmax (their
   ``--softmax_client_weights``), symmetrised, (P + P^T) / 2 (`affinity_graph`);
2. k spectral clusters of that graph (kernels/spectral_clustering.py);
3. each cluster's model: the train-size-weighted mean of its members that were
   active in the most recent round any member was (their ``Federation``),
   here of the models the server stores (`cluster_weights`);
4. the global model: the unweighted mean of the cluster models (`federation_models`).

A cluster none of whose members ever uploaded has no model here (the
authors' server reads every client's model, uploaded or not; this library's
server has only uploads): its slot is marked not valid. Pure, jit-able.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def affinity_graph(rows):
    """Symmetric [N, N] graph from affinity rows [N, N]: (P + P^T) / 2 with P = row-wise softmax.

    Examples:
        >>> g = affinity_graph(jnp.array([[0.0, 0.0], [jnp.log(3.0), 0.0]]))
        >>> g.tolist()  # rows softmax to [.5, .5] and [.75, .25]
        [[0.5, 0.625], [0.625, 0.25]]
    """
    p = jax.nn.softmax(jnp.asarray(rows, jnp.float32), axis=1)
    return 0.5 * (p + p.T)


def cluster_weights(labels, last_round, sizes, num_clusters: int):
    """([k, N] weights, [k] valid): member i of cluster c weighs sizes[i] if its ``last_round`` is the
    cluster's latest, else 0; ``last_round`` -1 = never uploaded; a cluster with no upload is not valid.

    Examples:
        >>> labels, last = jnp.array([0, 0, 1, 1, 0]), jnp.array([3, 5, 2, -1, 5])
        >>> w, valid = cluster_weights(labels, last, jnp.array([10.0, 20.0, 30.0, 40.0, 50.0]), 3)
        >>> w.tolist(), valid.tolist()  # cluster 0: the two clients of round 5; cluster 2: empty
        ([[0.0, 20.0, 0.0, 0.0, 50.0], [0.0, 0.0, 30.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]], [True, True, False])
    """
    member = (labels[None, :] == jnp.arange(num_clusters)[:, None]) & (last_round[None, :] >= 0)
    latest = jnp.max(jnp.where(member, last_round[None, :], -1), axis=1)
    chosen = member & (last_round[None, :] == latest[:, None])
    return jnp.where(chosen, sizes[None, :].astype(jnp.float32), 0.0), jnp.any(member, axis=1)


def federation_models(models, weights, valid):
    """Stacked [k + 1, ...]: the k clusters' weighted means of ``models`` [N, ...] (rows of ``weights``
    [k, N]), then the unweighted mean of the valid ones (the global model); invalid rows are zeros.

    Examples:
        >>> models = {"w": jnp.array([[0.0], [2.0], [10.0]])}
        >>> w, valid = jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0]]), jnp.array([True, True, False])
        >>> federation_models(models, w, valid)["w"][:, 0].tolist()  # clusters 1, 10, none; global (1 + 10) / 2
        [1.0, 10.0, 0.0, 5.5]
    """
    share = weights / jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), jnp.finfo(jnp.float32).tiny)
    pick = valid.astype(jnp.float32) / jnp.maximum(jnp.sum(valid), 1)

    def stack(leaf):
        clusters = jnp.tensordot(share, leaf.astype(jnp.float32), axes=1)
        overall = jnp.tensordot(pick, clusters, axes=1)
        return jnp.concatenate([clusters, overall[None]], axis=0).astype(leaf.dtype)

    return jax.tree.map(stack, models)
