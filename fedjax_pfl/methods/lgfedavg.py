"""LG-FedAvg (Liang et al. 2020, "Think Locally, Act Globally: Federated
Learning with Local and Global Representations"): the reverse split of FedPer.

Each client keeps a private body (its local representation) and shares the
head (the global model on top); locally the whole model trains E epochs; the
server averages the heads with weights n_i. Evaluation protocol: the client's
own body under the latest global head (the authors' code copies the global
layers into every local model before testing).

Choices: the authors' ``num_layers_keep`` sets how many top layers are global
and their runs also warm-start from a FedAvg model; here the shared part is
this library's head (the last Dense layer, docs/methods/conventions.md) and all clients start
from the same random model, as PFLlib's LG-FedAvg does.
"""

import functools

from fedjax_pfl.methods import fedper, shared_body
from fedjax_pfl.methods.base import Algorithm, Paper

SHARED = "head"  # FedPer's steps with the head shared instead of the body

LGFEDAVG = Algorithm(
    name="lgfedavg",
    paper=Paper("LG-FedAvg", authors="Paul Pu Liang, Terrance Liu, Liu Ziyin, Nicholas B. Allen, Randy P. Auerbach, "
                "David Brent, Ruslan Salakhutdinov, Louis-Philippe Morency", title="Think Locally, Act Globally: "
                "Federated Learning with Local and Global Representations", venue="arXiv 2001.01523", year=2020,
                url="https://arxiv.org/abs/2001.01523"),
    eval_models=shared_body.EVAL_MODELS,
    needs_body_head_split=True,
    keeps_optimizer_state=True,
    init=functools.partial(shared_body.init, part=SHARED),
    client_update=functools.partial(fedper.client_update, part=SHARED),
    server_update=functools.partial(shared_body.server_update, part=SHARED),
    eval_variables=functools.partial(shared_body.eval_variables, part=SHARED),
)
