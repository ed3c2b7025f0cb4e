"""FedAvg (McMahan et al. 2017), optionally fine-tuned at evaluation (FedAvg-FT).

Every selected client trains the global model E epochs; the server averages
the full models with weights n_i. Evaluation (``eval.model``): ``global``, the global model, or,
with ``method.finetune_epochs=k`` (methods/finetune.py), the global model
fine-tuned k epochs on each client's train data (FedAvg-FT; docs/methods/conventions.md uses
k = E). The fine-tuned copy is not stored.
"""

from fedjax_pfl import aggregation
from fedjax_pfl.methods.base import Method
from fedjax_pfl.methods.finetune import FineTuneConfig, finetuned


class FedAvg(Method):
    name = "fedavg"
    eval_models = ("global",)
    hparams_type = FineTuneConfig
    keeps_optimizer_state = True  # persistent_optimizer: each client's momentum across its participations (PFLlib)

    def init(self, key, num_clients):
        variables = self.init_variables(key)
        return {"variables": variables}, self.with_optimizer_state({}, variables, num_clients)

    def local_objective(self, server):
        """The client's loss; FedProx adds its proximal term here."""
        return self.supervised_objective()

    def client_update(self, server, client, data, key, info):
        variables, loss, kept = self.train_kept(self.local_objective(server), client, server["variables"], data, key,
                                                info.epochs)
        return {**client, **kept}, {"variables": variables, "loss": loss}

    def server_update(self, server, clients, uploads, info):
        new = aggregation.weighted_mean_or(uploads["variables"], info.sample_weights, server["variables"])
        return {"variables": new}, clients

    def eval_variables(self, server, client, data, key):
        return finetuned(self, server["variables"], data, key, self.hparams)
