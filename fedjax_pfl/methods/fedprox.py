"""FedProx (Li et al. 2020): FedAvg plus (mu/2)||w - w_global||^2 in the local loss.

Evaluation (``eval.model``): ``global``, as FedAvg: the global model, optionally fine-tuned per client
(``method.finetune_epochs``, FedProx-FT; methods/finetune.py)."""

import dataclasses

from fedjax_pfl import losses
from fedjax_pfl.methods.fedavg import FedAvg, FedAvgConfig
from fedjax_pfl.methods.options import option


@dataclasses.dataclass(frozen=True)
class FedProxConfig(FedAvgConfig):
    mu: float = option(0.01, "weight of the proximal term (mu/2) ||w - w_global||^2", at_least=0.0)


class FedProx(FedAvg):
    name = "fedprox"
    hparams_type = FedProxConfig

    def local_objective(self, server):
        anchor = server["variables"]["params"]
        mu = self.hparams.mu
        return self.supervised_objective(lambda v, batch, out, key: mu * losses.proximal(v["params"], anchor))
