"""Local: each client trains its own model on its own data; no communication.
Evaluation (``eval.model``): ``local``, each client's own model."""

from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import Algorithm, Paper


def init(m, key, num_clients):
    """Every client starts from the same model; the server holds nothing."""
    variables, clients = training.shared_init(m, key, num_clients)
    return {}, training.with_optimizer_state(m.local, {"variables": clients}, variables, num_clients)


def client_update(m, server, client, data, key, info):
    """E epochs of CE on the client's own model; nothing to upload but the loss."""
    variables, loss, kept = training.train_kept(m.local, training.supervised_objective(m), client,
                                                client["variables"], data, key, info.epochs)
    return {**client, "variables": variables, **kept}, {"loss": loss}


LOCAL = Algorithm(
    name="local",
    paper=Paper("Local", note="The baseline every personalized method must beat: each client trains alone on its own "
                "data (\"Separate\" or \"Local-only\" in the papers' tables). No paper of its own."),
    keeps_optimizer_state=True,
    init=init,
    client_update=client_update,
)
