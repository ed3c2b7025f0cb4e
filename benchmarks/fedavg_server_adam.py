"""FedAvg with Adam on the server, as FedJAX's ``fed_avg`` runs it with ``--server_optimizer=adam``.

A method file outside the package (it joins the registry through
``$FEDJAX_PFL_METHODS``, methods/__init__.py), for benchmarks/vs_fedjax.py:
FedJAX's EMNIST FedAvg experiment moves the server model with Adam
(Reddi et al., "Adaptive Federated Optimization", ICLR 2021, which FedJAX's
fed_avg cites), and fedjax_pfl's FedAvg takes the mean model.

- client: FedAvg's local training from the global model (methods/fedavg.py);
- server: the pseudo-gradient is the global parameters minus the clients'
  mean, weighted by their sample counts; Adam of ``server_lr``, ``b1``,
  ``b2`` and ``eps`` (optax's, with bias correction, as FedJAX's
  ``optimizers.adam``) steps the global parameters along it. The defaults are
  FedJAX's fed_avg.EMNIST_CONV.flags.
"""

import dataclasses

import optax

from fedjax_pfl import aggregation
from fedjax_pfl.core import tree_ops
from fedjax_pfl.methods import fedavg
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import option


@dataclasses.dataclass(frozen=True)
class ServerAdamConfig(fedavg.FedAvgConfig):
    server_lr: float = option(1.0, "the server Adam's step size", more_than=0.0)
    b1: float = option(0.9, "the server Adam's first-moment decay", at_least=0.0)
    b2: float = option(0.99, "the server Adam's second-moment decay", at_least=0.0)
    eps: float = option(0.01, "added to the server Adam's root second moment", more_than=0.0)


def server_optimizer(m) -> optax.GradientTransformation:
    h = m.hparams
    return optax.adam(h.server_lr, h.b1, h.b2, h.eps)


def init(m, key, num_clients):
    """FedAvg's server model, with the server Adam's state."""
    server, clients = fedavg.init(m, key, num_clients)
    return {**server, "opt_state": server_optimizer(m).init(server["variables"]["params"])}, clients


def server_update(m, server, clients, uploads, info):
    """Adam along (global parameters - the uploads' mean weighted by n_i)."""
    params = server["variables"]["params"]
    mean = aggregation.weighted_mean_or(uploads["variables"], info.sample_weights, server["variables"])
    updates, opt_state = server_optimizer(m).update(tree_ops.sub(params, mean["params"]), server["opt_state"], params)
    return {"variables": {**mean, "params": optax.apply_updates(params, updates)}, "opt_state": opt_state}, clients


FEDAVG_SERVER_ADAM = Algorithm(
    name="fedavg_server_adam",
    paper=Paper("FedAvg with server Adam", authors="Sashank J. Reddi, Zachary Charles, Manzil Zaheer, Zachary "
                "Garrett, Keith Rush, Jakub Konečný, Sanjiv Kumar, H. Brendan McMahan",
                title="Adaptive Federated Optimization", venue="ICLR", year=2021,
                url="https://arxiv.org/abs/2003.00295",
                note="As FedJAX's fed_avg with --server_optimizer=adam runs it (optax Adam, bias-corrected)."),
    hparams_type=ServerAdamConfig,
    eval_models=("global",),
    init=init,
    client_update=fedavg.client_update,
    server_update=server_update,
    eval_variables=fedavg.eval_variables,
)
