"""FedAvg (McMahan et al. 2017) and FedAvg-FT.

FedAvg: every selected client trains the global model E epochs; the server
averages the full models with weights n_i. Evaluation (``eval.model``):
``global``, the global model on every client's test data.
FedAvg-FT: the same training; evaluation ``global_finetuned``: each client
fine-tunes the global model E epochs on its own train data (a
personalization baseline).
"""

from fedjax_pfl import aggregation
from fedjax_pfl.methods.base import Method


class FedAvg(Method):
    name = "fedavg"
    eval_models = ("global",)

    def init(self, key, num_clients):
        return {"variables": self.init_variables(key)}, {}

    def local_objective(self, server):
        """The client's loss; FedProx adds its proximal term here."""
        return self.supervised_objective()

    def client_update(self, server, client, data, key, info):
        variables, loss = self.train(self.local_objective(server), server["variables"], data, key, info.epochs)
        return client, {"variables": variables, "loss": loss}

    def server_update(self, server, clients, uploads, info):
        new = aggregation.weighted_mean_or(uploads["variables"], info.sample_weights, server["variables"])
        return {"variables": new}, clients

    def eval_variables(self, server, client, data, key):
        return server["variables"]


class FedAvgFT(FedAvg):
    name = "fedavg_ft"
    eval_models = ("global_finetuned",)

    def eval_variables(self, server, client, data, key):
        variables, _ = self.train(self.supervised_objective(), server["variables"], data, key, self.setup.local_epochs)
        return variables
