"""FedProx (Li et al. 2020): FedAvg plus (mu/2)||w - w_global||^2 in the local loss.

Evaluation (``eval.model``): ``global``, as FedAvg: the global model, optionally fine-tuned per client
(``method.finetune_epochs``, FedProx-FT; methods/finetune.py)."""

import dataclasses
import math

from fedjax_pfl import losses
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.fedavg import FedAvg
from fedjax_pfl.methods.finetune import FineTuneConfig


@dataclasses.dataclass(frozen=True)
class FedProxConfig(FineTuneConfig):
    mu: float = 0.01

    def __post_init__(self):
        super().__post_init__()
        if not (math.isfinite(self.mu) and self.mu >= 0):
            raise UserError(f"method.mu must be a finite number >= 0, got {self.mu}")


class FedProx(FedAvg):
    name = "fedprox"
    hparams_type = FedProxConfig

    def local_objective(self, server):
        anchor = server["variables"]["params"]
        mu = self.hparams.mu
        return self.supervised_objective(lambda v, batch, out, key: mu * losses.proximal(v["params"], anchor))
