"""FedPAC (Xu, Tong & Huang, ICLR 2023): feature alignment to global class
prototypes and classifier collaboration; and ``fedpac_proto``, the seeds'
variant whose head-combination weights come from prototype losses.

Round t, each selected client i (docs/methods/conventions.md "FedPAC"; authors' code
JianXu95/FedPAC methods/fedpac.py, tools.py, running.py):

1. With the current model (received global body + own head), in inference
   mode over its train batches: class sums -> (V_i, h_i)
   (`prototypes.feature_statistics`, ``variance='code'`` the authors' formula,
   ``'paper'`` the within-class reading) and the local prototypes c_i^k.
2. Head only: ``head_epochs`` (1) epochs of CE with its own optimizer, SGD lr
   ``head_lr`` 0.1, momentum 0.5, weight decay 5e-4 (fixed in the authors'
   code, whatever the run's optimizer). ``head_optimizer='run'`` trains the
   head with the run's optimizer and lr schedule instead, as PFLlib's FedPAC
   (one optimizer for both phases), which PFAKD's authors ran for their table.
3. Body only (head frozen): E epochs (``info.epochs``) with the run's
   optimizer of CE + ``lam`` * mean over batch and feature dims of
   (f(x) - c^y)^2 (`losses.feature_mse`), c^y the global prototype of class y
   when the server has one, else the client's step-1 prototype (divided by
   the batch's mean of (c^y)^2 with ``alignment=relative``, below); no
   alignment term in round 0.
   With ``train.persistent_optimizer`` the head's and the body's optimizer
   states are kept across the client's rounds (one each).
4. Post-training prototypes and counts (inference mode). Upload body, head,
   prototypes, counts, V_i, h_i and the mean train loss of step 3.

Server (only uploads that arrived, ``info.uploaded``, take part):
- body: weighted mean with n_i (`shared_body.average`);
- global prototypes: c^k = sum_i n_ik c_i^k / sum_i n_ik over this round's
  uploads (`aggregation.prototype_aggregate`; ``proto_weights='clients'``:
  the plain mean over the uploads that hold class k, as PFLlib); as in the
  authors' code they replace the previous ones, and ``present`` marks classes
  some upload held;
- for every uploading client i: P_i = diag(V) + D_i, (D_i)_jk = sum_c
  (h_i[c] - h_j[c]) . (h_i[c] - h_k[c]), over uploading j, k; weights
  a_i = `aggregation.combination_weights_batch` (PSD repair with eigenvalue
  floor ``psd_floor``, ``psd_repair='drop'`` as the authors' code; weights
  <= ``min_weight`` zeroed and renormalised; own head on failure); new
  head_i = sum_j a_ij head_j, written into the client's variables. A client
  whose upload was lost keeps its trained head.

``fedpac_proto`` (docs/methods/conventions.md "FedPAC with prototype-loss weights"): the same
client step and server body/prototype aggregation; the head weights are
alpha_ij = softmax_j(-f_ij / ``temperature``) over uploading j with
f_ij = sum_k pi_jk CE(head_i(c_j^k), k), client j's post-training
prototypes through client i's head weighted by j's class prior
(``direction='forward'``); ``direction='reverse'`` uses client i's prototypes
through client j's head, weighted by i's prior. With the default temperature 1
the weights drift toward even on FedPAC's FMNIST setting (the weight on a
client's own group of 4 of 20 clients: 0.32 after round 1, 0.23 after round
10), so every client holds nearly the mean head and the variant lands near
FedAvg (87.4% there, FedPAC 91.7%); ``temperature=0.1`` keeps the weights on
similar clients and follows FedPAC (reproductions/fedpac_table1, its notes).

Diagnostics (`round_diagnostics`): the uploading clients' mean weight a_ii on
their own head and mass on the others' heads (1 and 0 for a client that keeps
its head), and the distances of the uploaded heads.

Evaluation (``eval.model``): ``global`` by default, the global body with the
client's (combined) head, i.e. the model the client holds after the round in
the authors' code; ``local`` evaluates the client's own trained body with
its combined head.

Scale of the alignment term (``alignment``): ``absolute`` (the default) is
the paper's term and its authors' code's, in squared feature units, so its
weight against the CE grows with the square of the features' scale: where
local training inflates unnormalised features within the first rounds, the
averaged body's features in round 2 can sit far from the global prototypes
and the term then outweighs the CE many times over. ``alignment=relative``
divides the batch's term by the mean square of its targets (a batch-dependent
effective lambda): a variant, not the paper's, which no paper table runs.

Where the spec is silent (authors' code followed, or said why): statistics
and prototypes use the model in inference mode (BatchNorm running averages);
the statistics
of step 1 use the model before the head epoch, the prototypes of step 4 the
model after the body epochs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl import aggregation, losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.kernels import classifier_combination, collaboration, optim, prototypes, simplex_qp
from fedjax_pfl.methods import shared_body, training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper, Schedule
from fedjax_pfl.methods.options import Options, option


HEAD_OPTIMIZERS = ("authors", "run")
ALIGNMENTS = ("absolute", "relative")


@dataclasses.dataclass(frozen=True)
class FedPACLocalConfig(Options):
    """Options shared by fedpac and fedpac_proto (client step and prototype aggregation)."""

    lam: float = option(1.0, "weight of the feature-alignment MSE to the global class prototypes", at_least=0.0)
    head_epochs: int = option(1, "head-only epochs before the body epochs", at_least=1)
    proto_weights: str = option("counts", "global prototype of a class: weighted by the clients' sample counts "
                                "(authors) or the mean over the clients that hold it (PFLlib)",
                                choices=aggregation.PROTO_WEIGHTS)
    head_optimizer: str = option("authors", "the head epochs' optimizer: the authors' SGD (head_lr, head_momentum, "
                                 "head_weight_decay) or the run's optimizer and lr schedule (PFLlib)",
                                 choices=HEAD_OPTIMIZERS)
    head_lr: float = option(0.1, "SGD step size of the head epochs", more_than=0.0)
    head_momentum: float = option(0.5, "SGD momentum of the head epochs", at_least=0.0, less_than=1.0)
    head_weight_decay: float = option(5e-4, "weight decay of the head epochs", at_least=0.0)
    variance: str = option("code", "feature variance V_i as the authors' code computes it or the paper's "
                           "within-class reading", choices=prototypes.VARIANCES)
    alignment: str = option("absolute", "feature-alignment term: the mean squared difference to the prototypes "
                            "(paper), or that divided by the prototypes' mean square (relative: free of the "
                            "features' scale)", choices=ALIGNMENTS)

    def check(self) -> None:
        if self.head_optimizer == "run":
            fields = {f.name: f.default for f in dataclasses.fields(FedPACLocalConfig)}
            set_ = [k for k in ("head_lr", "head_momentum", "head_weight_decay") if getattr(self, k) != fields[k]]
            if set_:
                raise UserError(f"method.{set_[0]} applies to method.head_optimizer=authors; with head_optimizer=run "
                                "the head epochs take train.lr, train.momentum and train.weight_decay")


@dataclasses.dataclass(frozen=True)
class FedPACConfig(FedPACLocalConfig):
    psd_floor: float = option(0.01, "eigenvalue floor of the PSD repair of the QP matrix", at_least=0.0)
    psd_repair: str = option("drop", "drop eigenpairs below the floor (authors') or clip them to it",
                             choices=simplex_qp.REPAIRS)
    min_weight: float = option(1e-3, "combination weights <= this are zeroed, then renormalised", at_least=0.0,
                               less_than=1.0)
    qp_iters: int = option(1000, "accelerated projected-gradient iterations of the simplex QP", at_least=1)


DIRECTIONS = ("forward", "reverse")


@dataclasses.dataclass(frozen=True)
class FedPACProtoConfig(FedPACLocalConfig):
    direction: str = option("forward", "forward: client j's prototypes through client i's head; reverse: i's "
                            "through j's", choices=DIRECTIONS)
    temperature: float = option(1.0, "softmax temperature of the prototype-loss weights", more_than=0.0)


# ---- state ---------------------------------------------------------------------------


def head_optimizer(m):
    """The head epochs' optimizer: the authors' SGD, or the run's (head_optimizer='run')."""
    h = m.hparams
    if h.head_optimizer == "run":
        return m.optimizer
    return optim.make_optimizer("sgd", h.head_lr, h.head_momentum, h.head_weight_decay)


def kept_optimizers(m) -> dict:
    """The optimizer states a client keeps under train.persistent_optimizer: one for the head, one for the body."""
    return {"head_opt_state": ("head", head_optimizer(m)), "body_opt_state": ("body", None)}


def init(m, key, num_clients):
    """The shared-body state plus the global prototypes (none present yet)."""
    server, clients = shared_body.init(m, key, num_clients, kept=kept_optimizers(m))
    C, d = m.model.num_classes, m.model.feature_dim
    return {**server, "prototypes": jnp.zeros((C, d), jnp.float32), "present": jnp.zeros((C,), bool)}, clients


# ---- client: steps 1-4 -------------------------------------------------------------------


def class_sums(m, local: LocalTraining, variables, data):
    """Per-class feature sums of the client's train samples (inference mode, batches of ``local.batch_size``)."""

    def feature_fn(x):
        return m.model.apply(variables, x, train=False).features

    return prototypes.client_class_sums(feature_fn, data, m.model.num_classes, local.batch_size, local.normalize,
                                       local.loops)


def client_update(m, server, client, data, key, info):
    h, local = m.hparams, m.local
    variables = shared_body.receive(m, server, client)
    sums = class_sums(m, local, variables, data)  # step 1
    v, h_stat = prototypes.feature_statistics(sums, h.variance)
    local_protos, _ = prototypes.prototypes(sums)

    k_head, k_body = jax.random.split(key)  # step 2
    variables, _, kept_head = training.train_kept(local, training.supervised_objective(m), client, variables, data,
                                                  k_head, h.head_epochs, "head_opt_state", part="head",
                                                  optimizer=head_optimizer(m), max_epochs=h.head_epochs)

    targets = jnp.where(server["present"][:, None], server["prototypes"], local_protos)  # step 3
    targets = jax.lax.stop_gradient(targets)
    weight = jnp.where(info.round > 0, h.lam, 0.0)

    def alignment(variables, batch, out, key):
        wanted = targets[batch.y]
        mse = losses.feature_mse(out.features, wanted, batch.mask)
        if h.alignment == "relative":  # in units of the targets' own mean square (a constant of the step)
            mse = mse / jnp.maximum(losses.feature_mse(jnp.zeros_like(wanted), wanted, batch.mask), 1e-12)
        return weight * mse

    variables, loss, kept_body = training.train_kept(local, training.supervised_objective(m, alignment), client,
                                                     variables, data, k_body, info.epochs, "body_opt_state",
                                                     part="body")
    protos, counts = prototypes.prototypes(class_sums(m, local, variables, data))  # step 4
    extras = {"head": tree_ops.part_of(variables, "head"), "prototypes": protos, "counts": counts, "V": v,
              "h": h_stat}
    return shared_body.upload(local, client, variables, loss, kept={**kept_head, **kept_body}, extras=extras)


# ---- server ------------------------------------------------------------------------------


def head_weights(m, uploads, info):
    """[S, S]: row i = the weights client i gives the uploaded heads: FedPAC's QP, or (fedpac_proto) the
    softmax of the prototype losses."""
    h = m.hparams
    if isinstance(h, FedPACProtoConfig):
        f = classifier_combination.prototype_losses(m.model, uploads["head"], uploads["prototypes"], uploads["counts"])
        if h.direction == "reverse":
            f = f.T
        return aggregation.softmax_weights(f, mask=info.uploaded, temperature=h.temperature)
    P = classifier_combination.qp_matrices(uploads["V"], uploads["h"])
    return aggregation.combination_weights_batch(P, info.uploaded, floor=h.psd_floor, repair=h.psd_repair,
                                                 min_weight=h.min_weight, num_iters=h.qp_iters)


def combination(m, uploads, info):
    """(weights [S, S], keep_own [S]): the head weights of the clients that combine, zero rows for those that
    keep their own head (upload lost, or no finite weights)."""
    weights = head_weights(m, uploads, info)
    keep_own = ~info.uploaded | ~jnp.all(jnp.isfinite(weights), axis=1)
    return jnp.where(keep_own[:, None], 0.0, weights), keep_own


def server_update(m, server, clients, uploads, info):
    """The bodies' mean weighted by n_i, this round's global prototypes, and each uploading client's combined
    head."""
    server = shared_body.average(m, server, uploads, info.sample_weights)
    weights = aggregation.prototype_weights(uploads["counts"], info.uploaded, m.hparams.proto_weights)
    protos, present = aggregation.prototype_aggregate(uploads["prototypes"], weights)
    any_upload = jnp.any(info.uploaded)
    server = {
        **server,
        "prototypes": jnp.where(any_upload, protos, server["prototypes"]),
        "present": jnp.where(any_upload, present, server["present"]),
    }
    weights, keep_own = combination(m, uploads, info)

    def combine(a):  # new head_i = sum_j a_ij head_j over arrived uploads; else head_i itself
        arrived = info.uploaded.reshape((-1,) + (1,) * (a.ndim - 1))
        mixed = jnp.tensordot(weights.astype(a.dtype), jnp.where(arrived, a, 0), axes=1,
                              precision=jax.lax.Precision.HIGHEST)
        return jnp.where(keep_own.reshape(arrived.shape), a, mixed)

    heads = jax.tree.map(combine, uploads["head"])
    variables = tree_ops.with_part(clients["variables"], "head", heads)
    return server, {**clients, "variables": variables}


def round_diagnostics(m, server, new_server, uploads, info):
    """The new heads' weights (a kept head: weight 1 on itself) and the uploaded heads' distances."""
    weights, keep_own = combination(m, uploads, info)
    own = jnp.arange(weights.shape[0])
    weights = jnp.where(keep_own[:, None], jnp.eye(weights.shape[0]), weights)
    return {**collaboration.weight_summary(weights, own), **collaboration.distance_summary(uploads["head"])}


_PAPER = dict(authors="Jian Xu, Xinyi Tong, Shao-Lun Huang", title="Personalized Federated Learning with Feature "
              "Alignment and Classifier Collaboration", venue="ICLR", year=2023, url="https://arxiv.org/abs/2306.11867",
              code="JianXu95/FedPAC")

FEDPAC = Algorithm(
    name="fedpac",
    paper=Paper("FedPAC", **_PAPER),
    hparams_type=FedPACConfig,
    eval_models=shared_body.EVAL_MODELS,
    schedule=Schedule(needs_selected_state=True),  # the server step combines the selected clients' heads
    needs_body_head_split=True,
    keeps_optimizer_state=True,
    init=init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=shared_body.eval_variables,
    round_diagnostics=round_diagnostics,
)

FEDPAC_PROTO = dataclasses.replace(
    FEDPAC,
    name="fedpac_proto",
    paper=Paper("FedPAC (prototype-loss weights)", **_PAPER, note="A variant of FedPAC (the 'Modify' row of the "
                "FedPAC comparison this project reproduces): the head-combination weights come from prototype "
                "losses instead of a quadratic program. Not a separate publication."),
    hparams_type=FedPACProtoConfig,
)
