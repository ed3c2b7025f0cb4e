"""FedProx (Li et al. 2020): FedAvg plus (mu/2)||w - w_global||^2 in the local loss.

Evaluation (``eval.model``): ``global``, as FedAvg: the global model, optionally fine-tuned per client
(``method.finetune_epochs``, FedProx-FT; methods/finetune.py)."""

import dataclasses

from fedjax_pfl.methods import fedavg, training
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import option


@dataclasses.dataclass(frozen=True)
class FedProxConfig(fedavg.FedAvgConfig):
    mu: float = option(0.01, "weight of the proximal term (mu/2) ||w - w_global||^2", at_least=0.0)


def client_update(m, server, client, data, key, info):
    """FedAvg's local training on CE + (mu/2) ||w - w_global||^2."""
    objective = training.proximal_objective(m, server["variables"]["params"], m.hparams.mu)
    return fedavg.train_from_global(m, objective, server, client, data, key, info)


FEDPROX = Algorithm(
    name="fedprox",
    paper=Paper("FedProx", authors="Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, "
                "Virginia Smith", title="Federated Optimization in Heterogeneous Networks", venue="MLSys", year=2020,
                url="https://arxiv.org/abs/1812.06127",
                note="FedProx-FT (method.finetune_epochs) fine-tunes the global model on each client before testing."),
    hparams_type=FedProxConfig,
    eval_models=("global",),
    keeps_optimizer_state=True,
    check=fedavg.check,
    init=fedavg.init,
    client_update=client_update,
    server_update=fedavg.server_update,
    eval_variables=fedavg.eval_variables,
)
