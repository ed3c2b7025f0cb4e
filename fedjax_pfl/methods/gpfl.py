"""GPFL (Zhang et al., ICCV 2023): global category embeddings (GCE) and a
conditional valve (CoV) that splits the feature into a global and a
personalized route.

Model: the body f (shared, averaged with weights n_i), the CoV
(fedjax_pfl/models/conditional_valve.py; shared, averaged), the GCE embeddings
E [C, d] (shared, averaged) and the head h (private). Per batch, with the
client's conditional inputs z_G, z_P (below):

    f_P = CoV(f(x), z_P)    logits = h(f_P)
    f_G = CoV(f(x), z_G)
    loss = CE(logits, y) + angle(f_G, y; E) + lamda * magnitude(f_G, E_frozen[y])

and weight decay mu on E and the CoV (in their optimizer, below)

(global_guidance.py; E_frozen = the global GCE received this round, no
gradient). Body, head, CoV and E are trained together for E epochs from the
received global body, CoV and GCE and the client's own head; the client
uploads body, CoV and E; the server averages each over the uploads with
weights n_i.

Conditional inputs (the authors' ``set_GCE``): z_G = mean_c E_src[c],
z_P = sum_c pi_c E_src[c] with pi the client's train label prior, where
E_src is the GCE the client held when the last round ended: its own trained
E if it trained in that round, otherwise the global GCE it had received one
round earlier (the initial one before round 1). In round 0 both are zero.

Evaluation protocol: the client's model as it holds it after the server
step, as in the authors' code (which evaluates after sending the global
modules to every client): received global body and CoV, its own head, and
h(CoV(f(x), z_P)) with z_P as above.

Where this library follows the authors' code (TsingZ0/GPFL, clientgp.py,
also PFLlib) over the paper: the magnitude-level term is the Frobenius norm
of (f_G - E_frozen[y]) over the batch (``method.magnitude=paper``: the mean
per-sample L2 norm); mu is the weight decay of the CoV and GCE optimizers
only (mu * param added to their gradient, as PyTorch's SGD weight_decay), so
the reported train loss leaves it out as PFLlib's does (with a 256-d
feature and mu = 0.1 the decay term alone is ~160 at initialisation, which
read as a train loss of ~100 in round 1); the GCE is initialised N(0, 1) as
torch's nn.Embedding.
Defaults lamda = 0.01, mu = 0.1: the authors' run_me.sh for CNNs and MLPs.

Optimizers (authors' code): body and head take the run's optimizer (its
momentum, weight decay and lr schedule); the CoV and the GCE take their own
plain SGD at the run's initial learning rate (their CoV_opt and GCE_opt: no
momentum, no lr decay, weight decay mu). With ``train.persistent_optimizer``
the client keeps that state across its rounds (PFLlib keeps its three
optimizers).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import aggregation, losses
from fedjax_pfl.models.conditional_valve import ConditionalValve, conditional_inputs, label_prior
from fedjax_pfl.models.initialization import reinitialize
from fedjax_pfl.kernels.global_guidance import REDUCTIONS, angle_level_guidance, magnitude_level_guidance
from fedjax_pfl.methods import shared_body, training
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import Options, option

GUIDANCE = ("gce", "cov")  # trained beside body and head, under variables['params']


@dataclasses.dataclass(frozen=True)
class GPFLConfig(Options):
    lamda: float = option(0.01, "weight of the magnitude-level global guidance", at_least=0.0)
    mu: float = option(0.1, "weight decay of the conditional valve's and the category embeddings' SGD "
                       "(mu * param added to their gradient; not in the reported loss)", at_least=0.0)
    magnitude: str = option("code", "magnitude term as the Frobenius norm over the batch (authors' code) or the "
                            "mean per-sample L2 norm (paper)", choices=REDUCTIONS)


def conditional_valve(m) -> ConditionalValve:
    """When bound: the CoV module for the model's feature width."""
    return ConditionalValve(m.model.feature_dim)


# ---- state -------------------------------------------------------------------------------


def init(m, key, num_clients):
    """The global body, GCE and CoV on the server; every client holds the initial model and GCE."""
    k_model, k_gce, k_cov = jax.random.split(key, 3)
    variables, clients = training.shared_init(m, k_model, num_clients)
    d, c = m.model.feature_dim, m.model.num_classes
    gce = jax.random.normal(k_gce, (c, d), jnp.float32)
    cov = m.static.init(k_cov, jnp.zeros((1, d)), jnp.zeros((d,)))["params"]
    cov = reinitialize(cov, jax.random.fold_in(k_cov, 1), m.model.initialization)
    local = m.local
    server = {"body": shared_body.shared_part(local, variables), "gce": gce, "cov": cov, "gce_before": jnp.copy(gce),
              "rounds": jnp.zeros((), jnp.int32)}
    clients = {"variables": clients, "gce": jnp.tile(gce, (num_clients, 1, 1)),
               "trained_round": jnp.full((num_clients,), -1, jnp.int32)}
    trained = {**variables, "params": {**variables["params"], "gce": gce, "cov": cov}}
    return server, training.with_optimizer_state(local, clients, trained, num_clients, optimizer=training_optimizer(m))


def training_optimizer(m):
    """The run's optimizer for body and head; plain SGD with weight decay mu at the run's initial lr for CoV and
    GCE."""

    def labels(params):
        return {k: jax.tree.map(lambda _: "guidance" if k in GUIDANCE else "model", v) for k, v in params.items()}

    guidance = optax.chain(optax.add_decayed_weights(m.hparams.mu), optax.sgd(m.base_lr))
    return optax.multi_transform({"model": m.optimizer, "guidance": guidance}, labels)


def conditionals(m, server, client, data, round_index):
    """(z_G, z_P) of the client in round ``round_index`` (module docstring); zeros in round 0."""
    fresh = client["trained_round"] == round_index - 1
    source = jnp.where(fresh, client["gce"], server["gce_before"])
    prior = label_prior(data.y, data.n, m.model.num_classes)
    z_g, z_p = conditional_inputs(source, prior)
    started = round_index > 0
    return jnp.where(started, z_g, 0.0), jnp.where(started, z_p, 0.0)


# ---- client ------------------------------------------------------------------------------


def objective(m, server, z_generic, z_personal):
    hp, model, valve = m.hparams, m.model, m.static
    frozen = server["gce"]

    def loss_fn(variables, batch, key):
        params = variables["params"]
        model_vars = {**variables, "params": {"body": params["body"], "head": params["head"]}}
        out = model.apply(model_vars, batch.x, train=True, mask=batch.mask)
        cov = {"params": params["cov"]}
        f_p = valve.apply(cov, out.features, z_personal)
        f_g = valve.apply(cov, out.features, z_generic)
        loss = losses.cross_entropy(model.apply_head(model_vars, f_p), batch.y, batch.mask)
        loss += angle_level_guidance(f_g, batch.y, params["gce"], batch.mask)
        loss += hp.lamda * magnitude_level_guidance(f_g, frozen[batch.y], batch.mask, hp.magnitude)
        return loss, out.batch_stats

    return loss_fn


def client_update(m, server, client, data, key, info):
    """Receive the global body, CoV and GCE; train all with the own head E epochs; upload body, CoV and GCE."""
    variables = shared_body.receive(m, server, client)
    z_g, z_p = conditionals(m, server, client, data, info.round)
    start = {**variables, "params": {**variables["params"], "gce": server["gce"], "cov": server["cov"]}}
    local = m.local
    trained, loss, kept = training.train_kept(local, objective(m, server, z_g, z_p), client, start, data, key,
                                              info.epochs, optimizer=training_optimizer(m))
    params = trained["params"]
    model_vars = {**trained, "params": {"body": params["body"], "head": params["head"]}}
    client, upload = shared_body.upload(local, client, model_vars, loss, kept,
                                        extras={k: params[k] for k in GUIDANCE})
    return {**client, "gce": upload["gce"], "trained_round": info.round}, upload


# ---- server ------------------------------------------------------------------------------


def server_update(m, server, clients, uploads, info):
    """Body, CoV and GCE: each the uploads' mean weighted by n_i."""
    new = shared_body.average(m, server, uploads, info.sample_weights)
    for k in GUIDANCE:
        new[k] = aggregation.weighted_mean_or(uploads[k], info.sample_weights, server[k])
    new["gce_before"] = server["gce"]
    new["rounds"] = info.round + 1
    return new, clients


# ---- evaluation --------------------------------------------------------------------------


def eval_variables(m, server, client, data, key):
    """The received global body with the client's head, the global CoV and the client's z_P."""
    _, z_p = conditionals(m, server, client, data, server["rounds"])
    return {"model": shared_body.receive(m, server, client), "cov": server["cov"], "conditional": z_p}


def eval_logits(m, variables, x):
    """h(CoV(f(x), z_P))."""
    model_vars = variables["model"]
    out = m.model.apply(model_vars, x, train=False)
    f_p = m.static.apply({"params": variables["cov"]}, out.features, variables["conditional"])
    return m.model.apply_head(model_vars, f_p)


GPFL = Algorithm(
    name="gpfl",
    paper=Paper("GPFL", authors="Jianqing Zhang, Yang Hua, Hao Wang, Tao Song, Zhengui Xue, Ruhui Ma, Jian Cao, "
                "Haibing Guan", title="GPFL: Simultaneously Learning Global and Personalized Feature Information "
                "for Personalized Federated Learning", venue="ICCV", year=2023, url="https://arxiv.org/abs/2308.10279",
                code="TsingZ0/GPFL"),
    hparams_type=GPFLConfig,
    eval_models=("global",),  # received global body and valve with the client's own head
    needs_body_head_split=True,
    keeps_optimizer_state=True,
    static=conditional_valve,
    init=init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=eval_variables,
    eval_logits=eval_logits,
)
