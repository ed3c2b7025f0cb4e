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
from fedjax_pfl.methods import finetune, training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper, RunFacts
from fedjax_pfl.methods.options import option
from fedjax_pfl.methods.step_counted import optimizer_steps, straggler_steps


@dataclasses.dataclass(frozen=True)
class FedAvgConfig(finetune.FineTuneConfig):
    local_steps: int | None = option(None, "R local steps per round, each on one random batch of B samples",
                                     at_least=1, none="train.local_epochs epochs")


def check(name, options, facts: RunFacts) -> None:
    """``method.local_steps`` starts each round's optimizer fresh: train.persistent_optimizer is refused."""
    if options.local_steps and facts.persistent_optimizer:
        raise UserError(f"method {name!r} with method.local_steps starts each round's optimizer fresh: "
                        "leave train.persistent_optimizer false")


def init(m, key, num_clients):
    """The global model on the server; clients hold only their kept optimizer state (persistent_optimizer)."""
    variables = m.model.init(key)
    return {"variables": variables}, training.with_optimizer_state(m.local, {}, variables, num_clients)


def train_epochs(local: LocalTraining, objective, server, client, data, key, info):
    """E epochs of ``objective`` from the global model (from the client's kept optimizer state under
    train.persistent_optimizer) -> (client, upload of the trained model)."""
    variables, loss, kept = training.train_kept(local, objective, client, server["variables"], data, key,
                                                info.epochs)
    return {**client, **kept}, {"variables": variables, "loss": loss}


def train_steps(local: LocalTraining, r: int, objective, server, client, data, key, info):
    """R = ``r`` (``method.local_steps``) steps of ``objective`` from the global model, each on one random batch,
    from a fresh optimizer (a straggler takes max(1, R e // E)) -> (client, upload of the trained model)."""
    variables, loss = optimizer_steps(objective, local.optimizer, server["variables"], data, key,
                                      steps=straggler_steps(r, info.epochs, local.local_epochs), max_steps=r,
                                      batch_size=local.batch_size, normalize=local.normalize, augment=local.augment)
    return client, {"variables": variables, "loss": loss}


def train_from_global(m, objective, server, client, data, key, info):
    """FedAvg's and FedProx's local training: `train_steps` with ``method.local_steps``, else `train_epochs`."""
    if m.hparams.local_steps:
        return train_steps(m.local, m.hparams.local_steps, objective, server, client, data, key, info)
    return train_epochs(m.local, objective, server, client, data, key, info)


def client_update(m, server, client, data, key, info):
    """CE from the global model; upload the trained model."""
    return train_from_global(m, training.supervised_objective(m), server, client, data, key, info)


def server_update(m, server, clients, uploads, info):
    """The uploaded models' mean weighted by n_i."""
    new = aggregation.weighted_mean_or(uploads["variables"], info.sample_weights, server["variables"])
    return {"variables": new}, clients


def eval_variables(m, server, client, data, key):
    """The global model, fine-tuned on the client's train data with ``method.finetune_epochs``."""
    return finetune.finetuned(m, m.local, server["variables"], data, key)


FEDAVG = Algorithm(
    name="fedavg",
    paper=Paper("FedAvg", authors="H. Brendan McMahan, Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y "
                "Arcas", title="Communication-Efficient Learning of Deep Networks from Decentralized Data",
                venue="AISTATS", year=2017, url="https://arxiv.org/abs/1602.05629",
                note="FedAvg-FT (method.finetune_epochs) fine-tunes the global model on each client before testing, "
                "as the FedAS and FedPAC tables' FedAvg-P / FedAvg-FT rows."),
    hparams_type=FedAvgConfig,
    eval_models=("global",),
    keeps_optimizer_state=True,  # persistent_optimizer: each client's momentum across its participations (PFLlib)
    check=check,
    init=init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=eval_variables,
)
