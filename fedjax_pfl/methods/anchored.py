"""The common shape of methods whose server mixes stored personal models into
per-client anchors (DiversiFed, FedAMP).

Each client keeps a full personalized model w_i. The server keeps the latest
uploaded parameters of EVERY client (``server['params']``, leaves [N, ...]).
In round t, for the selected clients only (`prepare`), the method's mixing
rule `anchors` computes u_i from all N stored models. The client trains E
epochs on CE(w) + (weight/2) ||w - u_i||^2 (`proximal_weight`), starting from
its own w_i, or from u_i when `start_from_anchor` is True, and uploads w_i;
`server_update` stores the arrived uploads (a dropped upload leaves the stored
copy as it was, while the client keeps its trained model). Evaluation: each
client's own model w_i. All clients start from the same initial model.
Diagnostics (`round_diagnostics`): the selected rows' self-weight xi_ii and
mass on the others, and the distances of the stored models.

Only trainable parameters (``params``) are stored and mixed; BatchNorm
statistics, if any, stay private.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import collaboration
from fedjax_pfl.methods.base import Method, shared_init

START_POINTS = ("anchor", "own")  # local training starts from u_i, or from the client's own w_i


class AnchoredPersonalMethod(Method):
    needs_selected_state = True  # `prepare` sets the selected clients' anchors u_i

    def proximal_weight(self) -> float:
        """The weight of (1/2) ||w - u_i||^2 in the client loss."""
        raise NotImplementedError

    def start_from_anchor(self) -> bool:
        """Whether local training starts from u_i (else from the client's own w_i)."""
        return False

    def anchors(self, server, selected):
        """u_i for the ``selected`` clients from all N stored models -> (stacked params [S, ...], weights [S, N])."""
        raise NotImplementedError

    def init(self, key, num_clients):
        _, clients = shared_init(self, key, num_clients)
        copy = lambda tree: jax.tree.map(jnp.copy, tree)  # distinct buffers: the engine donates state
        return {"params": copy(clients["params"])}, {"variables": clients, "anchor": copy(clients["params"])}

    def prepare(self, server, clients, selected):
        u, _ = self.anchors(server, selected)
        return {**clients, "anchor": u}

    def client_update(self, server, client, data, key, info):
        weight, anchor = self.proximal_weight(), client["anchor"]
        objective = self.supervised_objective(lambda v, batch, out, k: weight * losses.proximal(v["params"], anchor))
        start = client["variables"]
        if self.start_from_anchor():
            start = tree_ops.with_trainable(start, "all", anchor)
        variables, loss = self.train(objective, start, data, key, info.epochs)
        return {**client, "variables": variables}, {"params": variables["params"], "loss": loss}

    def round_diagnostics(self, server, new_server, uploads, info):
        """The selected clients' rows of this round's mixing weights and the distances of the N stored
        models they were computed from (kernels/collaboration.py)."""
        _, weights = self.anchors(server, info.selected)
        return {**collaboration.weight_summary(weights, info.selected),
                **collaboration.distance_summary(server["params"])}

    def server_update(self, server, clients, uploads, info):
        keep = info.uploaded

        def store(all_rows, new_rows):
            old = all_rows[info.selected]
            mask = keep.reshape((-1,) + (1,) * (new_rows.ndim - 1))
            return all_rows.at[info.selected].set(jnp.where(mask, new_rows, old))

        return {**server, "params": jax.tree.map(store, server["params"], uploads["params"])}, clients
