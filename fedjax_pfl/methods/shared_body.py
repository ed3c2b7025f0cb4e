"""The steps of the part-sharing methods (FedPer, FedRep, FedAS, PFAKD, FedPAC, FedBABU, GPFL,
LG-FedAvg).

Each client keeps its full model. At the start of its round it takes the
received global part (`receive`: the body, or the head for LG-FedAvg), trains
locally (what differs between methods), and uploads that part (`upload`); the
server averages the uploaded parts (`average`, with weights n_i unless the
method says otherwise: FedAS's Fisher weights). The other part stays private;
the global part lives in ``server[part]``.

BatchNorm statistics travel with a shared body when ``local.share_batch_stats``
(train.share_batch_stats) is True (the default, as in FedPer/FedRep code that averages the whole body
state dict); otherwise each client keeps its own.

Evaluation (``eval.model``, `eval_variables`): ``global`` evaluates each client
with the current global body and its own head, the model it holds right after
receiving the body (FedRep's and PFAKD's authors and PFLlib evaluate after
sending the new global model); ``local`` evaluates the body each client trained
itself in its last round (a client never selected: the initial body). A model
without body parameters (``mlr``) cannot share a body: the run stops
(``Algorithm.needs_body_head_split``).
"""

from fedjax_pfl import aggregation
from fedjax_pfl.core import tree_ops
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import LocalTraining

EVAL_MODELS = ("global", "local")
WHOLE_MODEL_OPTIMIZER = {"opt_state": ("all", None)}  # {client state: (part it trains, optimizer or None: the run's)}


def shared_part(local: LocalTraining, variables, part="body"):
    """The part of ``variables`` that is uploaded and averaged (without BatchNorm statistics unless
    ``local.share_batch_stats``)."""
    shared = tree_ops.part_of(variables, part)
    if not local.share_batch_stats:
        shared = {k: v for k, v in shared.items() if k == "params"}
    return shared


def init(m, key, num_clients: int, part="body", kept=WHOLE_MODEL_OPTIMIZER):
    """Every client starts from one initial model; the server holds its ``part``. ``kept``: the optimizer
    states the clients keep under train.persistent_optimizer, {client state: (part it trains, optimizer or
    None for the run's)}."""
    local = m.local
    variables, stacked = training.shared_init(m, key, num_clients)
    clients = {"variables": stacked}
    for state, (trained, optimizer) in kept.items():
        clients = training.with_optimizer_state(local, clients, variables, num_clients, state, part=trained,
                                                optimizer=optimizer)
    return {part: shared_part(local, variables, part)}, clients


def receive(m, server, client, part="body"):
    """The client's variables with the global ``part`` in place."""
    return tree_ops.with_part(client["variables"], part, server[part])


def upload(local: LocalTraining, client, variables, loss, kept=None, extras=None, part="body"):
    """-> (client, upload): the client keeps its trained ``variables`` and the optimizer states ``kept``
    (`training.train_kept`); it uploads its ``part``, the loss and ``extras``."""
    return ({**client, "variables": variables, **(kept or {})},
            {part: shared_part(local, variables, part), "loss": loss, **(extras or {})})


def average(m, server, uploads, weights, part="body"):
    """``server`` with its ``part`` the ``weights``-weighted mean of the uploaded ones (kept if no weight)."""
    return {**server, part: aggregation.weighted_mean_or(uploads[part], weights, server[part])}


def server_update(m, server, clients, uploads, info, part="body"):
    """The server step of FedPer and most part-sharing methods: the uploaded parts' mean weighted by n_i."""
    return average(m, server, uploads, info.sample_weights, part), clients


def eval_variables(m, server, client, data, key, part="body"):
    """``global``: the received global part with the client's own rest; ``local``: the client's own model."""
    if m.eval_model == "global":
        return receive(m, server, client, part)
    return client["variables"]
