"""The steps of the methods whose server mixes stored personal models into per-client anchors (DiversiFed,
FedAMP).

Each client keeps a full personalized model w_i. The server keeps the latest
uploaded parameters of EVERY client (``server['params']``, leaves [N, ...]).
In round t the method's own mixing rule computes, for the selected clients,
anchors u_i from all N stored models (its ``prepare`` puts them in
``client['anchor']``). `proximal_training` then trains E epochs of
CE(w) + (weight/2) ||w - u_i||^2 from the client's own w_i (or from u_i) and
uploads w_i; `server_update` stores the arrived uploads (a dropped upload leaves
the stored copy as it was, while the client keeps its trained model).
Evaluation: each client's own model w_i. All clients start from the same
initial model (`init`). `mixing_diagnostics`: the selected rows' mixing
weights and the distances of the stored models.

Only trainable parameters (``params``) are stored and mixed; BatchNorm
statistics, if any, stay private.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import collaboration, model_store
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import LocalTraining

START_POINTS = ("anchor", "own")  # local training starts from u_i, or from the client's own w_i


def init(m, key, num_clients: int):
    """Every client, its anchor and the server's stored copy start from one initial model."""
    _, clients = training.shared_init(m, key, num_clients)
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  distinct buffers: the engine donates state
    return {"params": copy(clients["params"])}, {"variables": clients, "anchor": copy(clients["params"])}


def proximal_training(m, local: LocalTraining, client, data, key, epochs, weight, from_anchor: bool):
    """E epochs of CE(w) + (``weight``/2) ||w - u_i||^2, from the client's own w_i (or from its anchor u_i)
    -> (client, upload of w_i's parameters)."""
    anchor = client["anchor"]
    objective = training.proximal_objective(m, anchor, weight)
    start = client["variables"]
    if from_anchor:
        start = tree_ops.with_trainable(start, "all", anchor)
    variables, loss = training.train(local, objective, start, data, key, epochs)
    return {**client, "variables": variables}, {"params": variables["params"], "loss": loss}


def server_update(m, server, clients, uploads, info):
    """Store the arrived uploads in their clients' rows of the server's parameters."""
    stored = model_store.store_arrived(server["params"], info.selected, info.uploaded, uploads["params"])
    return {**server, "params": stored}, clients


def mixing_diagnostics(server, weights, selected):
    """The selected clients' rows [S, N] of the round's mixing weights and the distances of the N stored models
    they were computed from (kernels/collaboration.py)."""
    return {**collaboration.weight_summary(weights, selected), **collaboration.distance_summary(server["params"])}
