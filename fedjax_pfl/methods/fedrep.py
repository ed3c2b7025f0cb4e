"""FedRep (Collins et al., ICML 2021): body averaged, head private.

Locally the head is trained first with the body fixed (``head_epochs``), then
the body with the head fixed (``body_epochs``; default E = train.local_epochs).
The defaults are PFLlib's split (clientrep.py: ``plocal_epochs`` = 1 head
epoch, then E body epochs). The authors' code (lgcollins/FedRep,
models/Update.py) splits E the other way: ``local_ep - local_rep_ep`` head
epochs, then ``local_rep_ep`` = 1 body epoch (their scripts: local_ep 11, so
10 head epochs and 1 body epoch): ``method.head_epochs=10 method.body_epochs=1``.
Both phases take the run's optimizer; PFLlib's FedRep client makes its own,
plain SGD at the run's lr with its lr decay (no momentum, no weight decay):
``train.momentum=0 train.weight_decay=0`` (PFAKD's table does so).
A straggler that trains e < E epochs takes max(1, body_epochs * e // E) body
epochs when ``body_epochs`` is set, else e.
With ``train.persistent_optimizer`` the client keeps one optimizer state for
its head and one for its body across its rounds (PFLlib's two optimizers).
Evaluation (``eval.model``): ``global`` by default (the received global body
with the client's own head, as the authors' code), or ``local``.
"""

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl.methods import shared_body, training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class FedRepConfig(Options):
    head_epochs: int = option(1, "head-only epochs (body fixed), first (PFLlib: 1; the authors: 10)", at_least=1)
    body_epochs: int | None = option(None, "body-only epochs (head fixed), after the head's (the authors: 1)",
                                     at_least=1, none="train.local_epochs, as PFLlib")


def body_epochs(options: FedRepConfig, local: LocalTraining, epochs):
    """(this client's body epochs, their static maximum) for ``epochs`` (E = ``local.local_epochs``, or fewer for
    a straggler)."""
    b = options.body_epochs
    if b is None:
        return epochs, local.local_epochs
    return jnp.clip(b * epochs // local.local_epochs, 1, b), b


KEPT_OPTIMIZERS = {"head_opt_state": ("head", None), "body_opt_state": ("body", None)}  # PFLlib: optimizer_per, optimizer


def init(m, key, num_clients):
    return shared_body.init(m, key, num_clients, kept=KEPT_OPTIMIZERS)


def client_update(m, server, client, data, key, info):
    """Receive the global body; train the head (body fixed), then the body (head fixed); upload the body."""
    local = m.local
    variables = shared_body.receive(m, server, client)
    k_head, k_body = jax.random.split(key)
    objective = training.supervised_objective(m)
    h = m.hparams.head_epochs
    body, body_max = body_epochs(m.hparams, local, info.epochs)
    variables, _, kept_head = training.train_kept(local, objective, client, variables, data, k_head, h,
                                                  "head_opt_state", part="head", max_epochs=h)
    variables, loss, kept_body = training.train_kept(local, objective, client, variables, data, k_body, body,
                                                     "body_opt_state", part="body", max_epochs=body_max)
    return shared_body.upload(local, client, variables, loss, {**kept_head, **kept_body})


FEDREP = Algorithm(
    name="fedrep",
    paper=Paper("FedRep", authors="Liam Collins, Hamed Hassani, Aryan Mokhtari, Sanjay Shakkottai",
                title="Exploiting Shared Representations for Personalized Federated Learning", venue="ICML",
                year=2021, url="https://arxiv.org/abs/2102.07078"),
    hparams_type=FedRepConfig,
    eval_models=shared_body.EVAL_MODELS,
    needs_body_head_split=True,
    keeps_optimizer_state=True,
    init=init,
    client_update=client_update,
    server_update=shared_body.server_update,
    eval_variables=shared_body.eval_variables,
)
