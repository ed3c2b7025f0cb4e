"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020): personalization via Moreau envelopes.

Client i, starting from the global model: theta = w_local = w; for R local
steps, each on one random batch D of B samples:
- K inner steps approximate the personalized model
  theta <- theta - personal_lr * (grad f(theta; D) + lamda * (theta - w_local) + weight_decay * theta);
- local update w_local <- w_local - eta * lamda * (w_local - theta), eta = train.lr.
The client uploads w_local and keeps theta as its personalized model.
Server: w <- (1 - beta) w + beta * sum_i (n_i / sum_j n_j) w_local_i.
Both steps are plain SGD (the authors' pFedMeOptimizer): a run whose train.optimizer, momentum or
weight_decay ask for more is refused rather than run without them.
Evaluation (``eval.model=local``): each client's last personalized model theta_i (the authors' and
PFLlib's ``personalized_params``; a client never selected still holds the
initial model, as there).

Hyperparameters (pFedMe paper / authors' README, MNIST MLR): eta = 0.005,
personal_lr = 0.1, lamda = 15, K = 5, beta = 1, R = 20, B = 20 (Synthetic:
personal_lr 0.01, lamda 20; MNIST MLP: personal_lr 0.09). These are the
defaults, except eta, which is train.lr. ``weight_decay`` = 0.001 is the mu of
the authors' pFedMeOptimizer (CharlieDinh/pFedMe and PFLlib fedoptimizer.py),
an L2 term of their code beside the paper's update; the pFedKD authors' copy
(HengruiH/pFedKD) uses plain SGD, i.e. ``method.weight_decay=0``. By default
only the selected clients train each round (PFLlib).
``train.all_clients_train=true`` follows the authors' code
(CharlieDinh/pFedMe, serverpFedMe.py ``train``: every user trains each round,
then ``select_users`` picks the ones whose w_local is aggregated; the pFedKD
authors' copy, HengruiH/pFedKD algorithms/pfedme.py, does the same): every
client updates its theta_i each round, only the sampled clients' uploads enter
the server step. Those authors evaluate the personalized models after all
users trained (and, HengruiH, after the server step), which is the engine's
evaluation after the round.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_pfl import aggregation, losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.methods import step_counted
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import Options, option


THETA_STARTS = ("global", "previous")
AGGREGATES = ("samples", "uniform")


@dataclasses.dataclass(frozen=True)
class PFedMeConfig(Options):
    lamda: float = option(15.0, "Moreau-envelope regularization lambda", more_than=0.0)
    personal_lr: float = option(0.1, "step size of the K inner steps on the personalized model", more_than=0.0)
    K: int = option(5, "inner steps per local step", at_least=1)
    weight_decay: float = option(0.001, "L2 decay in the K inner steps (the authors' pFedMeOptimizer mu; 0: none)",
                                 at_least=0.0)
    beta: float = option(1.0, "server mixing of the old and averaged global model (1: plain averaging)",
                         more_than=0.0)
    local_steps: int | None = option(None, "R local steps per round", at_least=1,
                                     none="train.local_epochs read as steps")
    theta_start: str = option("global", "where theta_i starts a round: the global model w, or the client's "
                              "previous theta_i (pFedKD authors' copy)", choices=THETA_STARTS)
    aggregate: str = option("samples", "weights of the sampled uploads in the server average: n_i, or 1/S "
                            "(pFedKD authors' copy)", choices=AGGREGATES)


def init(m, key, num_clients):
    """The global model w; every client's personalized theta_i starts from it."""
    variables = step_counted.init_variables(m, key)
    return {"variables": variables}, {"variables": tree_ops.broadcast(variables, num_clients)}


def client_update(m, server, client, data, key, info):
    """R local steps: K inner steps of theta_i on f(theta) + (lamda/2) ||theta - w_local||^2, then
    w_local <- w_local - eta lamda (w_local - theta_i); upload w_local."""
    hp, eta = m.hparams, m.lr

    def batch_loss(params, batch):
        return losses.cross_entropy(step_counted.logits(m, params, batch.x, train=True), batch.y, batch.mask)

    grad = jax.value_and_grad(batch_loss)

    def step(carry, batches, _key):
        theta, local = carry

        def inner(_, state):
            theta, _ = state
            loss, g = grad(theta, batches[0])
            g = tree_ops.add(g, tree_ops.scale(tree_ops.sub(theta, local), hp.lamda))
            g = tree_ops.add(g, tree_ops.scale(theta, hp.weight_decay))
            return tree_ops.sub(theta, tree_ops.scale(g, hp.personal_lr)), loss

        theta, loss = jax.lax.fori_loop(0, hp.K, inner, (theta, jnp.zeros((), jnp.float32)))
        local = tree_ops.sub(local, tree_ops.scale(tree_ops.sub(local, theta), eta * hp.lamda))
        return (theta, local), loss

    w = server["variables"]["params"]
    theta = client["variables"]["params"] if hp.theta_start == "previous" else w
    (theta, local), loss = step_counted.run_steps(hp, m.local, step, (theta, w), data, key, info)
    return {"variables": {"params": theta}}, {"variables": {"params": local}, "loss": loss}


def server_update(m, server, clients, uploads, info):
    """w <- (1 - beta) w + beta (the uploads' mean, weighted by n_i or uniform)."""
    old = server["variables"]
    weights = info.uploaded.astype(jnp.float32) if m.hparams.aggregate == "uniform" else info.sample_weights
    mean = aggregation.weighted_mean_or(uploads["variables"], weights, old)
    b = m.hparams.beta
    new = jax.tree.map(lambda o, avg: (1.0 - b) * o + b * avg, old, mean)
    return {"variables": new}, clients


PFEDME = Algorithm(
    name="pfedme",
    paper=Paper("pFedMe", authors="Canh T. Dinh, Nguyen H. Tran, Tuan Dung Nguyen", title="Personalized Federated "
                "Learning with Moreau Envelopes", venue="NeurIPS", year=2020, url="https://arxiv.org/abs/2006.08848",
                code="CharlieDinh/pFedMe"),
    hparams_type=PFedMeConfig,
    own_sgd=True,  # pFedMeOptimizer; its decay is method.weight_decay
    check=step_counted.check,
    init=init,
    client_update=client_update,
    server_update=server_update,
)
