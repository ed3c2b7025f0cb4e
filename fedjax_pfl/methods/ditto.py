"""Ditto (Li, Hu, Beirami & Smith, ICML 2021): a FedAvg global model plus a
personal model per client pulled toward it.

Round t, each selected client i, from the global model w of the round start:
- global part: E epochs of CE from w, upload (FedAvg; the server averages
  with weights n_i);
- personal part: E epochs from its own v_i of
  CE(v) + (lamda / 2) ||v - w||^2 (`losses.proximal`), anchored at the
  round's w (not at the client's moving copy), on the SAME batches in the
  same order as the global part (the authors' code, litian96/ditto
  flearn/trainers_MTL/ditto.py, takes one personal and one global step on
  each sampled batch; the two updates do not interact, so running them one
  after the other on the same batch sequence gives the same models).
Evaluation protocol: each client's personal model v_i (a never-selected
client holds the initial model).

lamda = 0 is Local training of v_i (docs/methods/conventions.md: "0 is just Local"). The
default lamda = 1 is the value in the authors' Fashion-MNIST scripts
(run_fashion_*_lam1.sh). The authors sample clients by size and average
uniformly; this library samples uniformly and averages by n_i (FedAvg's rule,
docs/methods/conventions.md "Client sampling"). The authors' ``dynamic_lam`` (choosing lamda
on validation data) is not implemented. ``train.persistent_optimizer``: the
client keeps two optimizer states across its rounds, one for its copy of the
global model (``opt_state``) and one for v_i (``personal_opt_state``), as
PFLlib's Ditto client keeps ``optimizer`` and ``optimizer_per``.
"""

from __future__ import annotations

import dataclasses

from fedjax_pfl.methods import fedavg, training
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class DittoConfig(Options):
    lamda: float = option(1.0, "weight of the proximal term (lamda/2) ||v_i - w||^2 of the personal model "
                          "(0: Local)", at_least=0.0)


def init(m, key, num_clients):
    """The global model on the server; every client's personal model v_i starts from it."""
    local = m.local
    variables, personal = training.shared_init(m, key, num_clients)
    clients = training.with_optimizer_state(local, {"variables": personal}, variables, num_clients)
    clients = training.with_optimizer_state(local, clients, variables, num_clients, "personal_opt_state")
    return {"variables": variables}, clients


def client_update(m, server, client, data, key, info):
    """FedAvg's E epochs from w (uploaded), then E epochs of v_i on CE(v) + (lamda/2) ||v - w||^2 with the same
    key, so on the same batches."""
    client_after, upload = fedavg.train_epochs(m.local, training.supervised_objective(m), server, client, data, key,
                                               info)
    objective = training.proximal_objective(m, server["variables"]["params"], m.hparams.lamda)
    personal, _, kept = training.train_kept(m.local, objective, client, client["variables"], data, key, info.epochs,
                                            "personal_opt_state")
    return {**client_after, "variables": personal, **kept}, upload


DITTO = Algorithm(
    name="ditto",
    paper=Paper("Ditto", authors="Tian Li, Shengyuan Hu, Ahmad Beirami, Virginia Smith",
                title="Ditto: Fair and Robust Federated Learning Through Personalization", venue="ICML", year=2021,
                url="https://arxiv.org/abs/2012.04221", code="litian96/ditto"),
    hparams_type=DittoConfig,
    eval_models=("local",),  # each client's personal model v_i (not FedAvg's global model)
    keeps_optimizer_state=True,
    init=init,
    client_update=client_update,
    server_update=fedavg.server_update,
)
