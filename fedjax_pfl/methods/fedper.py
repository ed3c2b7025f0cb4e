"""FedPer (Arivazhagan et al. 2019): body averaged with weights n_i, head private;
local training updates body and head together.
Evaluation (``eval.model``): ``global`` by default (global body + own head, as
PFLlib), or ``local``."""

from fedjax_pfl.methods import shared_body, training
from fedjax_pfl.methods.base import Algorithm, Paper


def client_update(m, server, client, data, key, info, part="body"):
    """Receive the global ``part``, train the whole model E epochs, upload the ``part``."""
    variables = shared_body.receive(m, server, client, part)
    local = m.local
    variables, loss, kept = training.train_kept(local, training.supervised_objective(m), client, variables, data,
                                                key, info.epochs)
    return shared_body.upload(local, client, variables, loss, kept, part=part)


FEDPER = Algorithm(
    name="fedper",
    paper=Paper("FedPer", authors="Manoj Ghuhan Arivazhagan, Vinay Aggarwal, Aaditya Kumar Singh, Sunav Choudhary",
                title="Federated Learning with Personalization Layers", venue="arXiv 1912.00818", year=2019,
                url="https://arxiv.org/abs/1912.00818"),
    eval_models=shared_body.EVAL_MODELS,
    needs_body_head_split=True,
    keeps_optimizer_state=True,
    init=shared_body.init,
    client_update=client_update,
    server_update=shared_body.server_update,
    eval_variables=shared_body.eval_variables,
)
