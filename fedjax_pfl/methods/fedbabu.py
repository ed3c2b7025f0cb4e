"""FedBABU (Oh, Kim & Yun, ICLR 2022, "FedBABU: Toward Enhanced Representation
for Federated Image Classification"): body aggregation and body update.

Federated training: every client starts from the global body and the head of
the shared random initialisation, trains the body only for E epochs (the head
is never updated, so it stays equal on every client), and uploads the body;
the server averages bodies with weights n_i. Evaluation protocol: the global
body with that head, fine-tuned on each client's train data before testing
(methods/finetune.py). The fine-tuned copy is never stored.

Fine-tuning follows PFLlib (clientbabu.py ``fine_tune``, main.py
``fine_tuning_epochs``), the code behind the FedAS paper's FedBABU numbers:
the whole model, body and head (``finetune_part=all``), for 10 epochs
(``finetune_epochs``), with the training optimizer and learning rate. The
FedBABU authors also fine-tune the whole model, for 5 epochs (their
``personalization_epoch``), with SGD at learning rate 1e-3 and momentum 0.9:
``method.finetune_epochs=5`` and the run's optimizer settings.
``finetune_part=head`` tunes the head alone (the body stays the global one).
PFLlib reports the untuned global model each round and the fine-tuned models
once, after the last round, starting from each client's last model (the
clients of the last round from their own trained body); here every
evaluation fine-tunes a fresh copy of the global body with the head, as the
paper describes.

BatchNorm statistics travel with the body (``train.share_batch_stats``).
"""

import dataclasses

from fedjax_pfl.core.tree_ops import PARTS
from fedjax_pfl.methods import finetune, shared_body, training
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.finetune import FineTuneConfig
from fedjax_pfl.methods.options import option


@dataclasses.dataclass(frozen=True)
class FedBABUConfig(FineTuneConfig):
    finetune_epochs: int = option(10, "epochs each client fine-tunes the global body and head on its train data "
                                  "before testing (PFLlib's fine_tuning_epochs; the authors' notebook: 5)", at_least=0)
    finetune_part: str = option("all", "which part is fine-tuned (all: body and head, as PFLlib and the authors)",
                                choices=PARTS)


def client_update(m, server, client, data, key, info):
    """Receive the global body; train the body alone E epochs (the head never moves); upload the body."""
    variables = shared_body.receive(m, server, client)
    local = m.local
    variables, loss = training.train(local, training.supervised_objective(m), variables, data, key, info.epochs,
                                     part="body")
    return shared_body.upload(local, client, variables, loss)


def eval_variables(m, server, client, data, key):
    """The global body with the (shared initial) head, fine-tuned on the client's train data."""
    return finetune.finetuned(m, m.local, shared_body.receive(m, server, client), data, key)


FEDBABU = Algorithm(
    name="fedbabu",
    paper=Paper("FedBABU", authors="Jaehoon Oh, Sangmook Kim, Se-Young Yun",
                title="FedBABU: Toward Enhanced Representation for Federated Image Classification", venue="ICLR",
                year=2022, url="https://arxiv.org/abs/2106.06042"),
    hparams_type=FedBABUConfig,
    eval_models=("global",),  # the global body and head, fine-tuned (the shared-body 'local' does not apply)
    needs_body_head_split=True,
    init=shared_body.init,
    client_update=client_update,
    server_update=shared_body.server_update,
    eval_variables=eval_variables,
)
