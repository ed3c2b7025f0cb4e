"""FedRoD (Chen & Chao, ICLR 2022, "On Bridging Generic and Personalized
Federated Learning for Image Classification"), the linear-head variant.

A generic model (body + generic head) is trained by every selected client
with the balanced-softmax loss (logits shifted by the log of the client's
train counts per class, losses.balanced_softmax_cross_entropy) and averaged
by the server with weights n_i, as in FedAvg. Each client also keeps a private
personal head h_p, trained with cross-entropy on
``stop_grad(generic logits) + h_p(stop_grad(features))``: the personal loss
moves neither the body nor the generic head. Prediction = generic logits +
personal logits. Evaluation protocol: the current global generic model with
the client's personal head.

Followed from the authors'/PFLlib code: both losses on every batch, each with
its own optimizer of the run's kind and learning rate (here one optimizer over
both parameter sets, the same update for SGD, momentum, Adam and L2 decay,
which act element-wise); the personal head starts as a copy of the initial
generic head. Chosen here: as both heads are linear (one Dense layer), the
summed prediction is evaluated as one head whose parameters are the sum of the
two, which is exact; a model whose head has hidden layers is refused. The
hypernetwork variant of the paper is not implemented.
"""

import jax
import jax.numpy as jnp

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import fedavg, training
from fedjax_pfl.methods.base import Algorithm, Paper, RunFacts

PERSONAL = "personal"  # the personal head's key beside 'body' and 'head' in the trained params


def check_linear_head(name, options, facts: RunFacts) -> None:
    """The summed prediction is one head only when the model's head is one Dense layer."""
    if facts.model is None:
        return
    head = facts.variables["params"]["head"]
    if set(head) != {"logits"}:
        raise UserError(f"{name} needs a model whose head is one Dense layer; {facts.model.name}'s head "
                        f"has {', '.join(head)}: choose e.g. mlp, fedavgcnn, lenet or resnet8")


def init(m, key, num_clients):
    """The generic model on the server; each client's personal head starts as the initial generic head."""
    variables = m.model.init(key)
    personal = tree_ops.broadcast(variables["params"]["head"], num_clients)
    return {"variables": variables}, {"head": personal}


def objective(m, counts):
    """Balanced softmax on the generic model + CE of the combined logits for the personal head."""

    def objective(v, batch, key):
        params = dict(v["params"])
        personal = params.pop(PERSONAL)
        out = m.model.apply({**v, "params": params}, batch.x, train=True, mask=batch.mask)
        generic_loss = losses.balanced_softmax_cross_entropy(out.logits, batch.y, counts, batch.mask)
        personal_logits = m.model.apply_head({"params": {"head": personal}}, jax.lax.stop_gradient(out.features))
        combined = jax.lax.stop_gradient(out.logits) + personal_logits
        return generic_loss + losses.cross_entropy(combined, batch.y, batch.mask), out.batch_stats

    return objective


def client_update(m, server, client, data, key, info):
    """E epochs of both losses on the generic model and the personal head together; upload the generic model."""
    real = jnp.arange(data.y.shape[0]) < data.n
    counts = losses.class_counts(data.y, m.model.num_classes, real)
    generic = server["variables"]
    start = {**generic, "params": {**generic["params"], PERSONAL: client["head"]}}
    trained, loss = training.train(m.local, objective(m, counts), start, data, key, info.epochs)
    params = dict(trained["params"])
    personal = params.pop(PERSONAL)
    return {"head": personal}, {"variables": {**trained, "params": params}, "loss": loss}


def eval_variables(m, server, client, data, key):
    """The generic model whose head is generic + personal (logits add for linear heads)."""
    generic = server["variables"]
    head = tree_ops.add(generic["params"]["head"], client["head"])
    return tree_ops.with_trainable(generic, "head", head)


FEDROD = Algorithm(
    name="fedrod",
    paper=Paper("FedRoD", authors="Hong-You Chen, Wei-Lun Chao", title="On Bridging Generic and Personalized "
                "Federated Learning for Image Classification", venue="ICLR", year=2022,
                url="https://arxiv.org/abs/2107.00778"),
    eval_models=("global",),
    check=check_linear_head,
    init=init,
    client_update=client_update,
    server_update=fedavg.server_update,  # FedAvg's server step on the generic model
    eval_variables=eval_variables,
)
