"""DiversiFed (Wu et al., "The Diversity Bonus", 2024): attraction and repulsion between personalized models.

Each client keeps a full personalized model w_i; nothing is averaged. The
server keeps the latest uploaded parameters of EVERY client (``server['params']``,
leaves [N, ...]). In round t, for the selected clients only (`prepare`), one
vectorised call (kernels/model_distance.py: one Gram matmul for all pairwise
distances, one [S, N] x [N, P] matmul for the mix, no loop over pairs):

    d_ij = ||w_i - w_j||_2                                            (model distance)
    L    = sum_i sum_{j != i} log( exp(d_ij / tau) / sum_{k != i} exp(d_ik / tau) )
    u_i  = w_i - eta_i grad_{w_i} L = sum_j xi_ij w_j               (Lemma 1: a linear combination)

Models closer to client i than its softmax average attract (minimizing the
numerator), farther ones repel (maximizing the denominator; negative xi_ij).
The client then solves the proximal step of the incremental proximal
framework: starting from its own w_i, E epochs of
CE(w) + (lamda/2) ||w - u_i||^2, and uploads w_i; `server_update` stores the
uploads (a dropped upload leaves the stored copy as it was, while the client
keeps its trained model). With partial participation u_i is computed from the
stored latest models of all N clients. Evaluation (``eval.model``): ``local``,
each client's own model. All clients start from the same initial model, so
D = 0 and u_i = w_i in round 0. Distances cover all trainable parameters
(``params``; BatchNorm statistics, if any, stay private). The storage, client
and server steps are the shape shared with FedAMP (methods/anchored.py).

Where the paper's text leaves a choice open:
- The written loss is unbounded below (the farthest model's term falls
  without limit) and its step xi_ij = eta c_ij / d_ij grows without bound for
  close pairs. The one stabilisation: each client's step eta_i is eta, cut
  where needed so that sum_{j != i} |xi_ij| <= 1. It keeps the gradient's
  direction, xi_ii >= 0, and both forces at every distance.
- eta, tau and lamda are not given in the paper; the defaults are the
  validation choice at Dirichlet(0.5) (reproductions/diversifed_table2 holds
  the sweeps and the values each table column uses).
- The scale of d in d_ij / tau (``distance_unit``; the paper's equations are
  lost in our copy). The loss and its step are read in a unit s: logits
  (d_ij / s) / tau and xi_ij = eta_i c_ij / (d_ij / s). ``raw`` (s = 1,
  parameter units: the default), ``mean`` (s = the round's mean distance
  between the stored models) and ``sqrt_params`` (s = sqrt(P)).

  Why the scale is in question: in parameter units the distances reach tens
  within 10 rounds and hundreds later, so for tau in the paper's range
  (0.1-1.0, its Table IV) the softmax over d / tau is a hard max: every model
  attracts alike except the farthest, which is pushed away without limit, and
  the step bound binds on nearly every row. The Table II runs end with 39 of
  40 models merged around the inverse-distance mean of the others and one
  expelled (the diagnostics read it: tests/test_diversifed.py builds that
  geometry). The paper describes a graded response instead: accuracy moving
  smoothly with tau (up at Dirichlet 0.1, down at 1.0), pulled pairs closer
  and pushed pairs farther as tau grows (its Fig. 7).

  Why ``mean`` is the reading put to the test: it is the one under which
  d / tau has tau's scale whatever the network (the paper sweeps the same tau
  range on an MLP, a LeNet and a ResNet-8) and whatever the round (distances
  grow with every round of local training); ``sqrt_params`` fixes the network
  but not the round, its softmax hardening as training spreads the models.

  What the runs show (reproductions/diversifed_table2/sweeps/README.md, on
  Fashion-MNIST): neither ``raw`` nor ``mean`` gives the published behaviour
  (``sqrt_params``, a constant unit, is ``raw`` with tau and eta rescaled:
  tau sqrt(P) and eta P). Under ``mean``
  the forces are scale-free, but the loss is still unbounded below, and its
  feedback remains: once the step moves the models appreciably, pushing the
  farthest models widens the spread of d / s, which hardens the softmax,
  which pushes them harder; within 5-20 rounds the rows' softmax is a hard
  max, the bound cuts nearly every row, clusters are pulled to a few percent
  of the mean distance and a few models pushed to 3-18 times it (at
  Dirichlet 0.1, eta 0.1, tau 1, 25 of 40 models are merged by round 20).
  Where the step stays small (eta 0.001 at tau 1) the server step hardly
  acts and DiversiFed is Local; weaker settings flip later rather than
  settle. tau thus works as a switch, not a graded control. The default
  therefore stays the text's literal reading (``raw``); ``mean`` and
  ``sqrt_params`` are named variants.

Variant, not the paper's: ``form='kernel'`` replaces the logits by
tau exp(-d_ij^2 / sigma), a similarity that fades for far pairs, so far
models are left alone instead of repelled (FedAMP-like, with ``sigma`` its
scale); ``start='anchor'`` starts local training from u_i instead of w_i.

Diagnostics (`round_diagnostics`, in metrics.jsonl and plots/diagnostics.png):
the mean self-weight xi_ii of the round's clients, the mass on the others
(sum |xi_ij|) and its attracting and repelling parts, the mean and max
distance between the stored models and how far the max grew in the round,
and how the step read the models (`model_distance.step_diagnostics`): the
entropy of the rows' softmax (mean and min, nats; log(N-1) is uniform, 0 a
hard max), the rows whose step the bound cut, the share of models whose
nearest other model lies within 1% of the mean distance (merged), and the
mean distance, in units of the mean, of the pairs pulled together and of
those pushed apart.

Presets: configs/diversifed_*.yaml (FMNIST pathological, Dirichlet
0.1/0.5/1.0, practical; CIFAR-10 LeNet).
"""

from __future__ import annotations

import dataclasses

from fedjax_pfl import aggregation
from fedjax_pfl.kernels import collaboration, model_distance
from fedjax_pfl.methods import anchored
from fedjax_pfl.methods.base import Algorithm, Paper, Schedule
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class DiversiFedConfig(Options):
    lamda: float = option(1.0, "weight of the proximal term (lamda/2) ||w - u_i||^2 to the server's anchor",
                          at_least=0.0)
    tau: float = option(1.0, "temperature of the model-distance loss: its logits are d_ij / tau", more_than=0.0)
    eta: float = option(0.1, "server step size of the gradient step on the model-distance loss (each client's "
                        "step is cut so that its weights on the other models sum to at most 1 in absolute value)",
                        at_least=0.0)
    form: str = option("distance", "the paper's loss on d_ij / tau, or the variant 'kernel' whose logits "
                       "tau exp(-d_ij^2 / sigma) leave far models alone (not the paper's)",
                       choices=model_distance.FORMS)
    sigma: float = option(1.0, "form=kernel only: scale of the similarity exp(-d_ij^2 / sigma), in squared "
                          "parameter distance", more_than=0.0)
    start: str = option("own", "local training starts from the client's own w_i (the paper) or from the "
                        "anchor u_i (variant)", choices=anchored.START_POINTS)
    distance_unit: str = option("raw", "the unit the server step reads the distances in: 'mean' (the round's mean "
                                "distance between the stored models), 'sqrt_params' (sqrt of the parameter count) "
                                "or 'raw' (parameter units)", choices=model_distance.UNITS)


def anchors(m, server, selected):
    """u_i for the ``selected`` clients from all N stored models -> (stacked params [S, ...], Xi [S, N])."""
    hp = m.hparams
    u, xi, _ = aggregation.mix_models(server["params"], hp.tau, hp.eta, form=hp.form, sigma=hp.sigma,
                                      unit=hp.distance_unit, rows=selected)
    return u, xi


def prepare(m, server, clients, selected):
    """The selected clients' anchors u_i."""
    u, _ = anchors(m, server, selected)
    return {**clients, "anchor": u}


def client_update(m, server, client, data, key, info):
    """The proximal step: E epochs of CE(w) + (lamda/2) ||w - u_i||^2 from w_i; upload w_i."""
    hp = m.hparams
    return anchored.proximal_training(m, m.local, client, data, key, info.epochs, hp.lamda, hp.start == "anchor")


def round_diagnostics(m, server, new_server, uploads, info):
    """The mixing diagnostics (methods/anchored.py), Xi's attracting and repelling mass, how the step read the
    models (`model_distance.step_diagnostics`) and how far the largest distance grew in the round."""
    hp, params = m.hparams, server["params"]
    _, xi = anchors(m, server, info.selected)
    mixing = anchored.mixing_diagnostics(server, xi, info.selected)
    step = model_distance.step_diagnostics(model_distance.sq_distances_in_unit(params, hp.distance_unit), xi, hp.tau,
                                           hp.eta, rows=info.selected, form=hp.form, sigma=hp.sigma)
    growth = collaboration.distance_summary(new_server["params"])["distance_max"] - mixing["distance_max"]
    return {**mixing, **model_distance.signed_mass(xi, info.selected), **step, "distance_max_growth": growth}


DIVERSIFED = Algorithm(
    name="diversifed",
    paper=Paper("DiversiFed", authors="Xinghao Wu, Xuefeng Liu, Jianwei Niu, Guogang Zhu, Shaojie Tang, "
                "Xiaotian Li, Jiannong Cao", title="The Diversity Bonus: Learning from Dissimilar Distributed "
                "Clients in Personalized Federated Learning", venue="arXiv 2407.15464", year=2024,
                url="https://arxiv.org/abs/2407.15464"),
    hparams_type=DiversiFedConfig,
    schedule=Schedule(needs_selected_state=True),  # `prepare` sets the selected clients' anchors
    init=anchored.init,
    prepare=prepare,
    client_update=client_update,
    server_update=anchored.server_update,
    round_diagnostics=round_diagnostics,
)
