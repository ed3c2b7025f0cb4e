"""pFedHN (Shamsian, Navon, Fetaya, Chechik, ICML 2021): a server hypernetwork generates each client's model.

Server state: the hypernetwork phi (client embeddings v_i, an MLP and one head
per target parameter; `hypernetwork`) and its optimizer state. Round t, each
selected client i:
  1. receives theta_i = h(phi; v_i);
  2. trains it for k local steps, each on a fresh random batch of B samples
     (the authors' ``next(iter(train_loader))``), with the run's optimizer
     (train.*) after clipping the gradient norm at 50, -> theta~_i;
  3. returns Delta theta_i = theta_i - theta~_i.
The server takes the vector-Jacobian product of the changes through h
(`hypernetwork.hypernetwork_gradient`, one `jax.vjp`): the gradient of
sum_i w_i (1/2) ||h(phi; v_i) - theta~_i||^2, which updates the hypernetwork
and the embeddings together; it clips that gradient's norm at 50 and steps
with SGD(server_lr, momentum 0.9, weight decay server_wd); a round where no
upload arrived leaves phi and its optimizer state unchanged.

From the authors' code (AvivSham/pFedHN, experiments/pfedhn/trainer.py):
k = 50 inner steps, hidden width 100, 3 hidden layers, embedding dimension
1 + N/4, SGD lr 1e-2 momentum 0.9 weight decay 1e-3 for phi (embeddings at the
same rate), both clips at 50, and phi steps after EACH client: their loop
draws one client, trains it from h(phi; v_i), steps phi, draws the next.
Here (``aggregate=sequential``, default) a round draws S distinct clients and
the engine visits them one after another (`Method.server_steps_per_client`,
engine/sequential_clients.py): each trains the model of the phi its
predecessor's step left, so a round is S of the authors' steps. The options
``aggregate=mean`` / ``sum`` take ONE step per round on the mean / sum of the S
clients' products, all trained from the same phi (S times fewer steps; the
three agree for S = 1). Their inner optimizer (SGD lr 5e-3, momentum 0.9,
weight decay 5e-5, batch 64) is set through train.*.

``sequential`` learns where ``mean`` and ``sum``, with S times fewer
hypernetwork steps, fall far behind in the same rounds; a sequential round
costs more than a mean round (S hypernetwork steps instead of one) and, on a
GPU, gives up training the S clients in parallel. Use an SGD inner optimizer:
with Adam the sequential hypernetwork can diverge. Measurements, and the
authors' loop run on the same partitions: reproductions/pfedhn_fmnist/notes.md.

Models with BatchNorm are not supported (as the authors' target CNN).

Evaluation protocol: each client's generated model h(phi; v_i), no fine-tuning
(the authors' ``evaluate``); a client never selected still has its own
(initial, random) embedding.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import hypernetwork
from fedjax_pfl.methods import step_counted
from fedjax_pfl.methods.base import Algorithm, Paper, Schedule
from fedjax_pfl.methods.options import Options, option

AGGREGATES = ("sequential", "mean", "sum")
GRAD_CLIP = 50.0  # both the inner and the hypernetwork gradient norms (the authors' clip_grad_norm_)


@dataclasses.dataclass(frozen=True)
class PFedHNConfig(Options):
    local_steps: int = option(50, "inner SGD steps k of the client on its generated model", at_least=1)
    server_lr: float = option(0.01, "step size of the hypernetwork optimizer", more_than=0.0)
    server_momentum: float = option(0.9, "momentum of the hypernetwork optimizer", at_least=0.0)
    server_wd: float = option(0.001, "weight decay of the hypernetwork optimizer", at_least=0.0)
    embed_dim: int | None = option(None, "width of the client embeddings", at_least=1, none="1 + N/4")
    hidden: int = option(100, "width of the hypernetwork's hidden layers", at_least=1)
    n_hidden: int = option(3, "hidden layers of the hypernetwork", at_least=0)
    aggregate: str = option("sequential", "sequential: a hypernetwork step after each selected client (the "
                            "authors'); mean or sum: one step per round on the selected clients' gradients",
                            choices=AGGREGATES)


def schedule(hparams) -> Schedule:
    """The server step reads the selected clients' indices; with aggregate=sequential the engine steps the
    hypernetwork after each client (the authors' loop)."""
    return Schedule(needs_selected_state=True, server_steps_per_client=hparams.aggregate == "sequential")


def target(m):
    """Shapes and dtypes of the client model's parameters (what h generates)."""
    return jax.eval_shape(lambda k: step_counted.init_variables(m, k), jax.random.key(0))["params"]


def server_optimizer(m):
    """The hypernetwork's optimizer: clipped SGD with momentum and weight decay (the authors')."""
    hp = m.hparams
    return optax.chain(optax.clip_by_global_norm(GRAD_CLIP), optax.add_decayed_weights(hp.server_wd),
                       optax.sgd(hp.server_lr, momentum=hp.server_momentum or None))


def embed_dim(m, num_clients: int) -> int:
    """The client embeddings' width: ``embed_dim``, else 1 + N/4."""
    return m.hparams.embed_dim or int(1 + num_clients / 4)


def init(m, key, num_clients):
    """The hypernetwork (with one embedding per client) and its optimizer state; clients hold their index."""
    hp = m.hparams
    phi = hypernetwork.init_hypernetwork(key, num_clients, target(m), embed_dim(m, num_clients),
                                         hp.hidden, hp.n_hidden)
    server = {"hnet": phi, "opt_state": server_optimizer(m).init(phi)}
    return server, {"index": jnp.arange(num_clients, dtype=jnp.int32)}


def generated(m, server, index):
    """The parameters the hypernetwork generates for client ``index``."""
    return hypernetwork.generate(server["hnet"], index, target(m))


def client_update(m, server, client, data, key, info):
    """k clipped steps of the run's optimizer from the generated model; upload theta - theta_trained."""
    optimizer = optax.chain(optax.clip_by_global_norm(GRAD_CLIP), m.optimizer)

    def batch_loss(params, batch):
        return losses.cross_entropy(step_counted.logits(m, params, batch.x, train=True), batch.y, batch.mask)

    def step(carry, batches, _key):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(batch_loss)(params, batches[0])
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    theta = generated(m, server, client["index"])
    (trained, _), loss = step_counted.run_steps(m.hparams, m.local, step, (theta, optimizer.init(theta)), data, key,
                                                info)
    return client, {"delta": tree_ops.sub(theta, trained), "loss": loss}


def server_update(m, server, clients, uploads, info):
    """One hypernetwork step on the arrived deltas (their mean, or sum with aggregate=sum)."""
    arrived = info.uploaded.astype(jnp.float32)
    weights = arrived if m.hparams.aggregate == "sum" else arrived / jnp.maximum(jnp.sum(arrived), 1.0)
    grads = hypernetwork.hypernetwork_gradient(server["hnet"], clients["index"], uploads["delta"], weights,
                                               target(m))
    updates, opt_state = server_optimizer(m).update(grads, server["opt_state"], server["hnet"])
    new = optax.apply_updates(server["hnet"], updates)
    keep = jnp.sum(arrived) > 0  # nobody uploaded: no step (weight decay and momentum included)
    return {"hnet": tree_ops.select(keep, new, server["hnet"]),
            "opt_state": tree_ops.select(keep, opt_state, server["opt_state"])}, clients


def eval_variables(m, server, client, data, key):
    """The generated model of the client."""
    return {"params": generated(m, server, client["index"])}


PFEDHN = Algorithm(
    name="pfedhn",
    paper=Paper("pFedHN", authors="Aviv Shamsian, Aviv Navon, Ethan Fetaya, Gal Chechik",
                title="Personalized Federated Learning using Hypernetworks", venue="ICML", year=2021,
                url="https://arxiv.org/abs/2103.04628", code="AvivSham/pFedHN"),
    hparams_type=PFedHNConfig,
    schedule=schedule,
    check=step_counted.check,
    init=init,
    client_update=client_update,
    server_update=server_update,
    eval_variables=eval_variables,
)
