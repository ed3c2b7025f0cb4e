"""The common shape of body-sharing methods (FedPer, FedRep, FedAS, PFAKD, FedPAC).

Each client keeps its full model; at the start of its round it takes the
received global body, trains locally (`local_phase`, what differs between
methods), and uploads its body. The server averages bodies with weights n_i
(`aggregate_bodies`, overridden by FedAS). Heads stay private.

BatchNorm statistics travel with the body when ``setup.share_batch_stats`` is
True (the default, as in FedPer/FedRep code that averages the whole body
state dict); otherwise each client keeps its own.

Evaluation (``eval.model``): ``global`` (the default) evaluates each client
with the current global body and its own head, the model it holds right after
receiving the body (FedRep's and PFAKD's authors and PFLlib evaluate after
sending the new global model); ``local`` evaluates the body each client
trained itself in its last round (a client never selected: the initial body).
A model without body parameters (``mlr``) cannot share a body: the run stops.
"""

from fedjax_pfl import aggregation, tree_ops
from fedjax_pfl.methods.base import Method, shared_init


class SharedBodyMethod(Method):
    eval_models = ("global", "local")
    needs_body_head_split = True

    def init(self, key, num_clients):
        variables, clients = shared_init(self, key, num_clients)
        return {"body": self.shared_body(variables)}, {"variables": clients}

    def shared_body(self, variables):
        body = tree_ops.part_of(variables, "body")
        if not getattr(self.setup, "share_batch_stats", True):
            body = {k: v for k, v in body.items() if k == "params"}
        return body

    def receive(self, server, client):
        """The client's variables with the global body in place."""
        return tree_ops.with_part(client["variables"], "body", server["body"])

    def local_phase(self, server, client, variables, data, key, info):
        """Local training from ``variables`` (global body + own head) -> (variables, loss, extras)."""
        variables, loss = self.train(self.supervised_objective(), variables, data, key, info.epochs)
        return variables, loss, {}

    def client_update(self, server, client, data, key, info):
        variables = self.receive(server, client)
        variables, loss, extras = self.local_phase(server, client, variables, data, key, info)
        upload = {"body": self.shared_body(variables), "loss": loss, **extras}
        return {**client, "variables": variables}, upload

    def eval_variables(self, server, client, data, key):
        if self.eval_model == "global":
            return self.receive(server, client)
        return client["variables"]

    def aggregation_weights(self, uploads, info):
        return info.sample_weights

    def server_update(self, server, clients, uploads, info):
        weights = self.aggregation_weights(uploads, info)
        body = aggregation.weighted_mean_or(uploads["body"], weights, server["body"])
        return {**server, "body": body}, clients
