"""FedProto (Tan et al., AAAI 2022): federated prototype learning, no parameter sharing.

Each client keeps its full model private; only class prototypes travel.
Round t, each selected client i (authors' code yuetan031/FedProto,
lib/update.py ``update_weights_het``, lib/utils.py ``proto_aggregation``):
1. E epochs from its own model of
   CE + lam * MSE(f(x), c^y) (`losses.feature_mse`: mean over batch and
   feature dims), c^y the global prototype of class y; for a class without a
   global prototype (and in round 0) the target is the sample's own feature,
   so it adds 0 to the sum while still counting in the mean (as the code).
2. Local prototypes c_i^k = mean feature of class k and counts n_ik
   (`prototypes.client_class_sums`, inference mode), uploaded.
Server: global prototype of class k = a weighted mean over this round's
arrived uploads that hold class k (`aggregation.prototype_aggregate`); they
replace the previous ones, and ``present`` marks classes some upload held.
Evaluation protocol: each client's own model, its own head
(``eval_by='head'``); ``eval_by='prototype'`` classifies by the nearest
global prototype of the client's features (`prototypes.nearest_prototype_logits`;
the code reports both).

Where the paper and the authors' code differ, the default is the code
(docs/methods/conventions.md rule), the paper behind a flag:
- ``proto_weights='clients'`` (code): the global prototype of class k is the
  plain mean over the clients that hold k; ``'counts'`` (paper's Eq. 6):
  weighted by the clients' sample counts n_ik.
Not followed: the code's local prototypes are the running mean of the
training-mode features met during the last local epoch (features before each
step's update); here they come from one inference-mode pass with the trained
model after local training (the paper's Eq. 4 applied to the final model, as
PFLlib). The code drops the last partial batch; here it is kept.
``lam`` = 1 is the code's default ``--ld``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl import aggregation, losses
from fedjax_pfl.kernels import prototypes
from fedjax_pfl.methods import training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper
from fedjax_pfl.methods.options import Options, option

EVAL_BY = ("head", "prototype")


@dataclasses.dataclass(frozen=True)
class FedProtoConfig(Options):
    lam: float = option(1.0, "weight of the prototype-distance term in the local loss", at_least=0.0)
    proto_weights: str = option("clients", "global prototype of a class: mean over the clients that hold it, or "
                                "weighted by their sample counts", choices=aggregation.PROTO_WEIGHTS)
    eval_by: str = option("head", "predict with the model's head or by the nearest global prototype",
                          choices=EVAL_BY)


def init(m, key, num_clients):
    """Every client's private model from one initial model; no global prototype yet."""
    _, clients = training.shared_init(m, key, num_clients)
    C, d = m.model.num_classes, m.model.feature_dim
    server = {"prototypes": jnp.zeros((C, d), jnp.float32), "present": jnp.zeros((C,), bool)}
    return server, {"variables": clients}


def client_update(m, server, client, data, key, info):
    """Steps 1-2: E epochs of CE + lam MSE to the global prototypes; upload the local prototypes and counts."""
    lam, protos, present = m.hparams.lam, server["prototypes"], server["present"]

    def prototype_term(variables, batch, out, key):
        own = jax.lax.stop_gradient(out.features)
        targets = jnp.where(present[batch.y][:, None], protos[batch.y], own)
        return lam * losses.feature_mse(out.features, targets, batch.mask)

    variables, loss = training.train(m.local, training.supervised_objective(m, prototype_term), client["variables"],
                                     data, key, info.epochs)
    local, counts = prototypes.prototypes(class_sums(m, m.local, variables, data))
    return {"variables": variables}, {"prototypes": local, "counts": counts, "loss": loss}


def class_sums(m, local: LocalTraining, variables, data):
    """Per-class feature sums of the client's train samples (inference mode, batches of ``local.batch_size``)."""

    def feature_fn(x):
        return m.model.apply(variables, x, train=False).features

    return prototypes.client_class_sums(feature_fn, data, m.model.num_classes, local.batch_size, local.normalize,
                                       local.loops)


def server_update(m, server, clients, uploads, info):
    """This round's global prototypes (the previous ones when no upload arrived)."""
    weights = aggregation.prototype_weights(uploads["counts"], info.uploaded, m.hparams.proto_weights)
    protos, present = aggregation.prototype_aggregate(uploads["prototypes"], weights)
    any_upload = jnp.any(info.uploaded)
    return {
        "prototypes": jnp.where(any_upload, protos, server["prototypes"]),
        "present": jnp.where(any_upload, present, server["present"]),
    }, clients


def eval_variables(m, server, client, data, key):
    if m.hparams.eval_by == "head":
        return client["variables"]
    return {"model": client["variables"], "prototypes": server["prototypes"], "present": server["present"]}


def eval_logits(m, variables, x):
    """The model's logits, or (eval_by='prototype') the nearest global prototype's."""
    if m.hparams.eval_by == "head":
        return m.model.apply(variables, x, train=False).logits
    features = m.model.apply(variables["model"], x, train=False).features
    return prototypes.nearest_prototype_logits(features, variables["prototypes"], variables["present"])


FEDPROTO = Algorithm(
    name="fedproto",
    paper=Paper("FedProto", authors="Yue Tan, Guodong Long, Lu Liu, Tianyi Zhou, Qinghua Lu, Jing Jiang, "
                "Chengqi Zhang", title="FedProto: Federated Prototype Learning across Heterogeneous Clients",
                venue="AAAI", year=2022, url="https://arxiv.org/abs/2105.00243", code="yuetan031/FedProto"),
    hparams_type=FedProtoConfig,
    init=init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=eval_variables,
    eval_logits=eval_logits,
)
