"""FedAvg (McMahan et al. 2017), optionally fine-tuned at evaluation (FedAvg-FT).

Every selected client trains the global model E epochs; the server averages
the full models with weights n_i. ``method.local_steps=R`` trains R steps
instead, each on one random batch of B samples, with a fresh optimizer (the
step-counted protocol of methods/step_counted.py: how pFedKD-WCL's paper
states its baselines ran). Evaluation (``eval.model``): ``global``, the global model, or,
with ``method.finetune_epochs=k`` (methods/finetune.py), the global model
fine-tuned k epochs on each client's train data (FedAvg-FT; docs/methods/conventions.md uses
k = E). The fine-tuned copy is not stored.
"""

import dataclasses

from fedjax_pfl import aggregation
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.base import Method
from fedjax_pfl.methods.finetune import FineTuneConfig, finetuned
from fedjax_pfl.methods.options import option
from fedjax_pfl.methods.step_counted import optimizer_steps, straggler_steps


@dataclasses.dataclass(frozen=True)
class FedAvgConfig(FineTuneConfig):
    local_steps: int | None = option(None, "R local steps per round, each on one random batch of B samples",
                                     at_least=1, none="train.local_epochs epochs")


class FedAvg(Method):
    name = "fedavg"
    eval_models = ("global",)
    hparams_type = FedAvgConfig
    keeps_optimizer_state = True  # persistent_optimizer: each client's momentum across its participations (PFLlib)

    def init(self, key, num_clients):
        variables = self.init_variables(key)
        return {"variables": variables}, self.with_optimizer_state({}, variables, num_clients)

    def local_objective(self, server):
        """The client's loss; FedProx adds its proximal term here."""
        return self.supervised_objective()

    def client_update(self, server, client, data, key, info):
        r = getattr(self.hparams, "local_steps", None)  # subclasses with their own config train epochs
        if r:
            if self.setup.persistent_optimizer:
                raise UserError(f"method {self.name!r} with method.local_steps starts each round's optimizer fresh: "
                                "leave train.persistent_optimizer false")
            s = self.setup
            variables, loss = optimizer_steps(self.local_objective(server), s.optimizer, server["variables"], data,
                                              key, steps=straggler_steps(r, info.epochs, s.local_epochs),
                                              max_steps=r, batch_size=s.batch_size, normalize=s.normalize,
                                              augment=s.augment)
            return client, {"variables": variables, "loss": loss}
        variables, loss, kept = self.train_kept(self.local_objective(server), client, server["variables"], data, key,
                                                info.epochs)
        return {**client, **kept}, {"variables": variables, "loss": loss}

    def server_update(self, server, clients, uploads, info):
        new = aggregation.weighted_mean_or(uploads["variables"], info.sample_weights, server["variables"])
        return {"variables": new}, clients

    def eval_variables(self, server, client, data, key):
        return finetuned(self, server["variables"], data, key, self.hparams)
