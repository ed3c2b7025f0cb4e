"""FedALA (Zhang et al., AAAI 2023, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning").

Server: FedAvg on full models (weights n_i). After every server step, EVERY
client (selected or not) initialises its model by adaptive local aggregation
(ALA) of its current local model l and the new global model g:
  * every layer below the top ``layers`` takes the global values;
  * the top layers become l + (g - l) * W element-wise, with W in [0, 1]
    learned on a random contiguous ``rand_percent``% slice of its train data:
    per batch, W <- clip(W - eta * dL/dW, 0, 1) (dL/dW = grad_theta * (g - l));
    the first time a client runs ALA it trains W until the std of its last
    ``num_pre_loss`` epoch losses falls below ``threshold`` (capped at
    ``max_start_epochs``), later one epoch; W persists on the client (starts 1).
ALA is skipped while the local model equals the global one (the authors' test
for the first round). A selected client trains E epochs of CE on the whole
model from its ALA-initialised model and uploads the result.
Evaluation protocol (``eval.model=local_ala``): each client's ALA-initialised
model. This is the authors' order (TsingZ0/FedALA and PFLlib serverala.py:
each round the server sends the global model to all clients, every client
runs ALA, all clients are evaluated, then the selected ones train): our
evaluation after round t is theirs at the start of round t+1. The engine
runs the ALA step on all N clients after the server step
(``updates_every_client``), so a client that is not selected is still
evaluated with the newest global model.

Followed from the authors' code: eta=1, s=80%, threshold 0.1,
10 losses for the convergence test, the data slice contiguous from a random
start, W updated per batch and clipped. Chosen here: ``layers`` counts layers
(a Dense/Conv/BatchNorm module with all its parameters; default 1 = the head's
logits layer, the authors' default of the last weight and bias tensors) in
forward order; batches of the slice are shuffled like every local epoch here;
an epoch's loss for the convergence test is its mean batch loss; BatchNorm
statistics are taken from the global model when ``train.share_batch_stats``
(and computed over a batch's real rows only); the start phase is capped (the
authors' loop is unbounded).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import adaptive_aggregation as ala, optim
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import fedavg, training
from fedjax_pfl.methods.base import Algorithm, LocalTraining, Paper, RunFacts, Schedule
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class FedALAConfig(Options):
    eta: float = option(1.0, "step size of the ALA weights W", more_than=0.0)
    rand_percent: float = option(80.0, "percent of the client's train data (a contiguous slice) ALA learns W on",
                                 more_than=0.0, at_most=100.0)
    layers: int = option(1, "top layers adapted element-wise (the rest take the global values)", at_least=1)
    threshold: float = option(0.1, "std of the last num_pre_loss epoch losses that ends the first ALA phase",
                              at_least=0.0)
    num_pre_loss: int = option(10, "epoch losses in the first phase's convergence test", at_least=1)
    max_start_epochs: int = option(50, "cap on the first phase's epochs (the authors' loop is unbounded)",
                                   at_least=1)


def check(name, options, facts: RunFacts) -> None:
    """``method.layers`` at most the model's depth."""
    if facts.model is None:
        return
    depth = len(ala.layer_paths(facts.variables["params"]))
    if options.layers > depth:
        raise UserError(f"method.layers={options.layers} exceeds the {depth} layers of {facts.model.name}; "
                        f"give at most {depth}")


def top_layers(m) -> list[tuple]:
    """When bound: the top ``layers`` layers of the model (shapes only; `check` held them to its depth)."""
    return ala.layer_paths(jax.eval_shape(m.model.init, jax.random.key(0))["params"])[-m.hparams.layers:]


def init(m, key, num_clients):
    """The global model; every client holds a copy, ALA weights W = 1 and no ALA run yet."""
    variables = m.model.init(key)
    weights = jax.tree.map(jnp.ones_like, ala.top_of(variables["params"], m.static))
    client = {"variables": variables, "weights": weights, "started": jnp.zeros((), bool)}
    return {"variables": variables}, tree_ops.broadcast(client, num_clients)


def ala_objective(m, base, local_top, global_top):
    """CE of the model whose top layers are ala.mix(local, global, W); W is the trained variable."""

    def objective(v, batch, key):
        params = ala.with_top(base["params"], ala.mix(local_top, global_top, v["params"]))
        out = m.model.apply({**base, "params": params}, batch.x, train=True, mask=batch.mask)
        return losses.cross_entropy(out.logits, batch.y, batch.mask), None

    return objective


def learn_weights(m, local_training: LocalTraining, objective, weights, data, key, started, skip):
    """One epoch of W updates (``local_training``'s batch size and normalisation), or (start phase) epochs until
    the losses settle; none if ``skip``."""
    hp = m.hparams
    optimizer = optim.projected_sgd(hp.eta)
    limit = jnp.where(skip, 0, jnp.where(started, 1, hp.max_start_epochs))

    def epoch(carry):
        w, e, history, _ = carry
        v, loss = training.train(local_training, objective, {"params": w}, data, jax.random.fold_in(key, e), 1,
                                 optimizer=optimizer, max_epochs=1)
        history = history.at[e].set(loss)
        recent = jax.lax.dynamic_slice(history, (jnp.maximum(e + 1 - hp.num_pre_loss, 0),), (hp.num_pre_loss,))
        settled = (e + 1 > hp.num_pre_loss) & (jnp.std(recent) < hp.threshold)
        return v["params"], e + 1, history, settled

    def more(carry):
        _, e, _, settled = carry
        return (e < limit) & ~settled

    history = jnp.zeros((hp.max_start_epochs,), jnp.float32)
    w, *_ = jax.lax.while_loop(more, epoch, (weights, jnp.int32(0), history, jnp.bool_(False)))
    return w


def adaptive_local_aggregation(m, local_training: LocalTraining, global_vars, client, data, key):
    """-> (initial local variables, W, started) for this round."""
    local = client["variables"]
    k_slice, k_epochs = jax.random.split(key)
    base = dict(global_vars)
    if "batch_stats" in local and not local_training.share_batch_stats:
        base["batch_stats"] = local["batch_stats"]
    local_top = ala.top_of(local["params"], m.static)
    global_top = ala.top_of(global_vars["params"], m.static)
    subset = ala.random_slice(data, k_slice, m.hparams.rand_percent / 100.0)
    same = jnp.all(jnp.stack([jnp.array_equal(a, b) for a, b in
                              zip(jax.tree.leaves(local["params"]), jax.tree.leaves(global_vars["params"]))]))
    objective = ala_objective(m, base, local_top, global_top)
    weights = learn_weights(m, local_training, objective, client["weights"], subset, k_epochs, client["started"],
                            same)
    mixed = {**base, "params": ala.with_top(base["params"], ala.mix(local_top, global_top, weights))}
    return tree_ops.select(same, local, mixed), weights, client["started"] | ~same


def client_update(m, server, client, data, key, info):
    """E epochs from the client's ALA-initialised model; upload it."""
    variables, loss = training.train(m.local, training.supervised_objective(m), client["variables"], data, key,
                                     info.epochs)
    return {**client, "variables": variables}, {"variables": variables, "loss": loss}


def update_every_client(m, server, client, data, key, round_index):
    """ALA of the client's model and the new global model, on every client after the server step."""
    variables, weights, started = adaptive_local_aggregation(m, m.local, server["variables"], client, data, key)
    return {"variables": variables, "weights": weights, "started": started}


FEDALA = Algorithm(
    name="fedala",
    paper=Paper("FedALA", authors="Jianqing Zhang, Yang Hua, Hao Wang, Tao Song, Zhengui Xue, Ruhui Ma, "
                "Haibing Guan", title="FedALA: Adaptive Local Aggregation for Personalized Federated Learning",
                venue="AAAI", year=2023, url="https://arxiv.org/abs/2212.01197", code="TsingZ0/FedALA"),
    hparams_type=FedALAConfig,
    eval_models=("local_ala",),  # each client's ALA of its own model and the current global model
    schedule=Schedule(updates_every_client=True),  # ALA on every client after each server step
    static=top_layers,
    check=check,
    init=init,
    client_update=client_update,
    server_update=fedavg.server_update,
    update_every_client=update_every_client,
)
