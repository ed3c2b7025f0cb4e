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

from fedjax_pfl.methods.shared_body import SharedBodyMethod


class LGFedAvg(SharedBodyMethod):
    name = "lgfedavg"
    shared_part = "head"
