"""DiversiFed: attraction and repulsion between personalized models (docs/methods/conventions.md).

Each client keeps a full personalized model w_i; nothing is averaged. The
server keeps the latest uploaded parameters of EVERY client (``server['params']``,
leaves [N, ...]). In round t, for the selected clients only (`prepare`):

    D = pairwise distances of all N stored models   (one Gram matmul)
    Xi = mixing matrix from dL/dD                    (aggregation.mixing_matrix)
    u_i = sum_j xi_ij w_j                             (one [S, N] x [N, P] matmul)

so a client's anchor u_i is pulled toward models closer than its softmax
average and pushed away from farther ones (negative xi_ij). The client then
trains from its OWN w_i for E epochs on CE(w) + (lambda/2) ||w - u_i||^2 and
uploads w_i; `server_update` stores the uploads (a dropped upload leaves the
stored copy as it was, while the client keeps its trained model). Evaluation
(``eval.model``): ``local``, each client's own model. All clients start from the same initial model,
so D = 0 and u_i = w_i until models differ. (The storage, client and server
steps are the shape shared with FedAMP: methods/anchored.py.)

Distances cover all trainable parameters (``params``; BatchNorm statistics,
if any, stay private). The loss L and the server step eta follow docs/methods/conventions.md
(`model_distance` module docstring).

Presets: configs/diversifed_*.yaml (FMNIST pathological, Dirichlet 0.1/0.5/1.0,
practical; CIFAR-10 LeNet).
lambda, tau and eta are not given in our copy of the paper; the defaults
(lamda=1, tau=3, eta=0.005, normalization='mean') come from a sweep on FMNIST
pathological (40 clients, 300/100 samples, MLP 64, E=10, B=100, Adam 1e-3,
seed 0; closing note). No setting beat Local there (best accuracies within
0.2 points of it, 25 rounds); larger steps make the repulsion push the models
apart round after round (the proximal loss explodes, accuracy falls): eta=0.02
with tau=3 was the best at 25 rounds but started to drift after ~30 rounds,
eta=0.005 stayed stable over 60 rounds. Keep eta * 2(N-2) / tau well below 1
(model_distance's docstring, "Stability").
"""

from __future__ import annotations

import dataclasses

from fedjax_pfl import aggregation
from fedjax_pfl.kernels import model_distance
from fedjax_pfl.methods.anchored import AnchoredPersonalMethod
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class DiversiFedConfig(Options):
    lamda: float = option(1.0, "weight of the proximal term (lambda/2) ||w - u_i||^2 to the server's anchor",
                          at_least=0.0)
    tau: float = option(3.0, "temperature of the model-distance loss, in units of the normalised distance",
                        more_than=0.0)
    eta: float = option(0.005, "server step size of the incremental proximal step on the model-distance loss",
                        at_least=0.0)
    normalization: str = option("mean", "distances divided by the round's mean off-diagonal distance, by "
                                "sqrt(P), or raw", choices=model_distance.NORMALIZATIONS)


class DiversiFed(AnchoredPersonalMethod):
    name = "diversifed"
    hparams_type = DiversiFedConfig

    def proximal_weight(self):
        return self.hparams.lamda

    def anchors(self, server, selected):
        """u_i for the ``selected`` clients from all N stored models -> (stacked params [S, ...], Xi [S, N])."""
        hp = self.hparams
        u, xi, _ = aggregation.mix_models(server["params"], hp.tau, hp.eta,
                                             normalization=hp.normalization, rows=selected)
        return u, xi
