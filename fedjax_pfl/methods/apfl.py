"""APFL (Deng, Kamani & Mahdavi 2020): adaptive personalized federated learning.

Each client keeps a personal model v_i and a mixing weight alpha_i (both
persistent); the server keeps a FedAvg global model w. Round t, each selected
client i, on every local batch (E epochs, `local_training.train` over the
joint tree (w, v_i, alpha_i) with one objective):
- its local copy of the global model takes a step on CE(w) (FedAvg's step);
- v_i takes a step on the loss of the mixed model with w held fixed;
- alpha_i takes a projected SGD step alpha <- clip(alpha - alpha_lr * (dL/dalpha
  + alpha_decay * alpha), 0, 1) on the same mixed loss.
The client uploads w; the server averages with weights n_i (FedAvg).
Evaluation protocol: the mixed model of v_i and the client's own local copy
w_i after its last local training (the authors' and PFLlib's personalized
model; a never-selected client holds the initial models and alpha).

The authors' code (MLOPTPSU/FedTorch, comms/trainings/federated/apfl.py,
``inference_personal``, ``alpha_update``) differs from the paper's text; the
defaults follow the code (docs/methods/conventions.md rule), the paper's reading is behind flags:
- ``mix='output'`` (code): the mixed model's prediction is
  alpha v(x) + (1 - alpha) w(x), a mixture of the two models' logits
  (`losses.output_mixture_cross_entropy`); ``mix='params'`` (paper): the model
  with parameters alpha v + (1 - alpha) w (`tree_ops.interpolate`);
- ``alpha_schedule='round_start'`` (code: alpha is updated at the first local
  step of each round only); ``'every_step'`` (paper's Algorithm 1);
- ``alpha_decay=0.02`` (code: ``grad_alpha += 0.02 * alpha``); the paper has 0;
- ``alpha=0.5`` initial value (code's ``--fed_personal_alpha`` default);
  ``adapt_alpha=False`` keeps it fixed (the code's default; the paper's
  adaptive variant is our default);
- alpha_lr defaults to train.lr (the code steps alpha with the local lr).
Where we deviate from the code: dL/dalpha is the exact derivative of the mixed
loss (the code uses the first-order surrogate
<v - w, alpha grad_v + (1 - alpha) grad_w>); the mixed loss of a step uses w
before that step's update (the paper's order; the code uses w after it);
v and w use the run's optimizer (the code: SGD for both).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import optim
from fedjax_pfl.methods import fedavg, training
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import Options, option

MIXES = ("output", "params")
ALPHA_SCHEDULES = ("round_start", "every_step")


@dataclasses.dataclass(frozen=True)
class APFLConfig(Options):
    alpha: float = option(0.5, "initial mixing weight alpha of the personal model", at_least=0.0, at_most=1.0)
    adapt_alpha: bool = option(True, "learn alpha by projected SGD (false: keep it fixed, the authors' code default)")
    alpha_lr: float | None = option(None, "step size of alpha", more_than=0.0, none="train.lr")
    alpha_decay: float = option(0.02, "weight decay on alpha (the authors' code; the paper has 0)", at_least=0.0)
    alpha_schedule: str = option("round_start", "when alpha steps: first local step of a round (code) or every step "
                                 "(paper)", choices=ALPHA_SCHEDULES)
    mix: str = option("output", "mixed model: logits mixture (code) or parameter interpolation (paper)",
                      choices=MIXES)


def alpha_step_size(m):
    """The step size of alpha: ``alpha_lr``, else this round's train.lr."""
    hp = m.hparams
    return hp.alpha_lr if hp.alpha_lr is not None else m.lr


# ---- state -------------------------------------------------------------------------------


def init(m, key, num_clients):
    """The global model w; per client its personal model v_i, its own copy of w and its alpha_i."""
    variables, personal = training.shared_init(m, key, num_clients)
    _, local = training.shared_init(m, key, num_clients)
    alpha = jnp.full((num_clients,), m.hparams.alpha, jnp.float32)
    return {"variables": variables}, {"variables": personal, "local": local, "alpha": alpha}


# ---- the mixed model -----------------------------------------------------------------------


def mixed_logits(m, personal, local, alpha, x, train: bool, mask=None):
    """(logits of the mixed model, v's new batch stats); ``local`` (w) enters as given."""
    if m.hparams.mix == "output":
        out_v = m.model.apply(personal, x, train=train, mask=mask)
        out_w = m.model.apply(local, x, train=False)
        return alpha * out_v.logits + (1.0 - alpha) * out_w.logits, out_v.batch_stats
    mixed = {**personal, "params": tree_ops.interpolate(personal["params"], local["params"], alpha)}
    out = m.model.apply(mixed, x, train=train, mask=mask)
    return out.logits, out.batch_stats


def joint_objective(m):
    """CE(w) + the mixed model's loss with w fixed, over the joint tree {w, v, alpha}."""

    def split(joint):
        p, stats = joint["params"], joint.get("batch_stats")
        part = lambda k: {"params": p[k], **({"batch_stats": stats[k]} if stats is not None else {})}  # noqa: E731
        return part("w"), part("v"), p["alpha"]

    def objective(joint, batch, key):
        w, v, alpha = split(joint)
        out_w = m.model.apply(w, batch.x, train=True, mask=batch.mask)
        loss_w = losses.cross_entropy(out_w.logits, batch.y, batch.mask)
        fixed_w = jax.lax.stop_gradient(w)
        if m.hparams.mix == "output":
            out_v = m.model.apply(v, batch.x, train=True, mask=batch.mask)
            loss_mix = losses.output_mixture_cross_entropy(
                out_v.logits, jax.lax.stop_gradient(out_w.logits), alpha, batch.y, batch.mask)
            stats_v = out_v.batch_stats
        else:
            logits, stats_v = mixed_logits(m, v, fixed_w, alpha, batch.x, train=True, mask=batch.mask)
            loss_mix = losses.cross_entropy(logits, batch.y, batch.mask)
        stats = {"w": out_w.batch_stats, "v": stats_v} if "batch_stats" in joint else {}
        return loss_w + loss_mix, stats

    return objective


def joint_optimizer(m):
    """The run's optimizer for w and v; projected SGD for alpha (or none when it is fixed)."""
    hp = m.hparams
    if hp.adapt_alpha:
        alpha_tx = optim.projected_sgd(alpha_step_size(m), hp.alpha_decay, hp.alpha_schedule == "every_step")
    else:
        alpha_tx = optax.set_to_zero()

    def labels(params):
        model_labels = lambda tree: jax.tree.map(lambda _: "model", tree)  # noqa: E731
        return {"w": model_labels(params["w"]), "v": model_labels(params["v"]), "alpha": "alpha"}

    return optax.multi_transform({"model": m.optimizer, "alpha": alpha_tx}, labels)


# ---- round ---------------------------------------------------------------------------------


def client_update(m, server, client, data, key, info):
    """E epochs on {w from the server, v_i, alpha_i} together; upload w."""
    w, v = server["variables"], client["variables"]
    joint = {"params": {"w": w["params"], "v": v["params"], "alpha": client["alpha"]}}
    if "batch_stats" in w:
        joint["batch_stats"] = {"w": w["batch_stats"], "v": v["batch_stats"]}
    joint, loss = training.train(m.local, joint_objective(m), joint, data, key, info.epochs,
                                 optimizer=joint_optimizer(m))

    def part(k):
        stats = joint.get("batch_stats")
        return {"params": joint["params"][k], **({"batch_stats": stats[k]} if stats is not None else {})}

    local = part("w")
    client = {"variables": part("v"), "local": local, "alpha": joint["params"]["alpha"]}
    return client, {"variables": local, "loss": loss}


def eval_variables(m, server, client, data, key):
    """The client's v_i, its copy of w and alpha_i."""
    return client


def eval_logits(m, variables, x):
    """The mixed model's logits."""
    logits, _ = mixed_logits(m, variables["variables"], variables["local"], variables["alpha"], x, train=False)
    return logits


APFL = Algorithm(
    name="apfl",
    paper=Paper("APFL", authors="Yuyang Deng, Mohammad Mahdi Kamani, Mehrdad Mahdavi",
                title="Adaptive Personalized Federated Learning", venue="arXiv 2003.13461", year=2020,
                url="https://arxiv.org/abs/2003.13461", code="MLOPTPSU/FedTorch"),
    hparams_type=APFLConfig,
    eval_models=("local",),  # each client's mixture of its v_i and its own copy of w (not FedAvg's global model)
    init=init,
    client_update=client_update,
    server_update=fedavg.server_update,
    eval_variables=eval_variables,
    eval_logits=eval_logits,
)
