"""pFedKD-WCL: personal models distilled from a global teacher (weighted combination loss).

Algorithm (docs/methods/conventions.md, "pFedKD-WCL"; authors' code HengruiH/pFedKD):
- state: a global model w on the server; a persistent personal model theta_i
  per client, initialised independently per client (its own key), never
  overwritten by w;
- client i, for R local minibatch *steps* (the authors' "local epochs" are
  steps: each one SGD step on one random batch of B distinct samples,
  ``torch.randperm(n)[:B]``), with the client optimizer (SGD lr 0.01):
      (1 - alpha) * NLL(theta_i) + alpha * T^2 KL_T(p_w || p_theta_i)
  (`losses.weighted_kd_loss`; p_w carries no gradient);
- then, theta_i fixed, over the client's whole train set:
  g_i = grad_w KL(p_w || p_theta_i) (``server_kl=teacher_first``, the
  authors' code) or grad_w KL(p_theta_i || p_w) (``student_first``, the
  paper's text) (`losses.client_server_gradient`);
- server: one SGD step w <- w - server_lr * sum_i a_i g_i, all g_i taken at
  the same w, with ``server_weights`` (`kd_server.gradient_weights`):
  ``sample_size`` a_i = n_i / sum_j n_j (default: the weights the authors'
  ``aggregate`` writes), ``uniform`` a_i = 1 / S (the paper's text, Algorithm
  1), or ``last_client``, the step the authors' code takes: their
  ``compute_kl_gradients`` calls ``global_model.zero_grad()`` inside the loop
  over the sampled clients, so what ``aggregate`` added for the earlier
  clients is cleared and the step is (1 + n_last / sum_j n_j) g_last, the
  last sampled client's gradient alone (the engine's selection order is
  random, so "last" is a client drawn uniformly among the selected).
The paper's text as a whole is ``server_kl=student_first
server_weights=uniform``; the default direction and weights are the
authors' code as written (configs/tables/pfedkd_table1.yaml says which step
each column runs).
Evaluation (``eval.model=local``): each client's personal model theta_i.
Only the sampled clients train each round (the authors' ``aggregate``);
``train.all_clients_train=true`` lets every client update theta_i each round
while only the sampled clients' g_i enter the server step (pFedMe's authors'
protocol, not pFedKD's).

R is ``method.local_steps`` (default: ``train.local_epochs``, read as a step
count, as the authors' ``--local_epochs``). A straggler with e < E epochs
takes max(1, R * e // E) steps. server_lr defaults to ``train.lr`` (the authors
use one learning rate for both). The three step-counted methods of the pFedKD
comparison (this one, Per-FedAvg, pFedMe) share methods/step_counted.py.
They support models without BatchNorm (MLR, MLP: the papers' models).
"""

from __future__ import annotations

import dataclasses

import jax
import optax

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import kd_server
from fedjax_pfl.methods import step_counted
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import Options, option


@dataclasses.dataclass(frozen=True)
class PFedKDConfig(Options):
    alpha: float = option(0.1, "weight of the KL term in the client loss (1 - alpha) NLL + alpha KL",
                          at_least=0.0, at_most=1.0)
    temperature: float = option(1.0, "distillation temperature T", more_than=0.0)
    local_steps: int | None = option(None, "R local minibatch steps per round", at_least=1,
                                     none="train.local_epochs read as steps")
    server_lr: float | None = option(None, "step size of the server's SGD step on the global model",
                                     more_than=0.0, none="train.lr")
    server_kl: str = option("teacher_first", "server KL direction: KL(p_w || p_theta) (authors' code) or "
                            "KL(p_theta || p_w) (paper text)", choices=kd_server.DIRECTIONS)
    server_weights: str = option("sample_size", "weights of the clients' KL gradients in the server step: n_i / "
                                 "sum n (the authors' aggregate as written), 'uniform' 1/S (paper text) or "
                                 "'last_client' (1 + n_last / sum n) on the last sampled client alone (the step "
                                 "the authors' code takes)", choices=kd_server.GRADIENT_WEIGHTS)
    grad_chunk: int = option(1024, "rows per chunk of the whole-train-set gradient pass (memory only)",
                             at_least=1)


def init(m, key, num_clients):
    """A global model on the server; a personal model per client, each from its own key."""
    k_global, k_personal = jax.random.split(key)
    global_variables = step_counted.init_variables(m, k_global)
    personal = jax.lax.map(lambda k: step_counted.init_variables(m, k), jax.random.split(k_personal, num_clients))
    return {"variables": global_variables}, {"variables": personal}


def server_lr(m) -> float:
    return m.hparams.server_lr if m.hparams.server_lr is not None else m.lr


def client_update(m, server, client, data, key, info):
    """R steps of the weighted combination loss on theta_i, then the KL gradient g_i at the global model."""
    hp, local, optimizer = m.hparams, m.local, m.optimizer
    teacher = server["variables"]["params"]

    def loss_fn(params, batch):
        logits = step_counted.logits(m, params, batch.x, train=True)
        if hp.alpha == 0.0:  # pure local training; the teacher is not even evaluated
            return losses.cross_entropy(logits, batch.y, batch.mask)
        teacher_logits = step_counted.logits(m, teacher, batch.x)
        return losses.weighted_kd_loss(logits, teacher_logits, batch.y, hp.alpha, hp.temperature, batch.mask)

    def step(carry, batches, _key):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, batches[0])
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    params = client["variables"]["params"]
    (params, _), loss = step_counted.run_steps(hp, local, step, (params, optimizer.init(params)), data, key, info)
    kl, grad = losses.client_server_gradient(
        lambda w, x: step_counted.normalized_logits(m, local, w, x), teacher,
        lambda x: step_counted.normalized_logits(m, local, params, x), data.x, data.n, temperature=hp.temperature,
        direction=hp.server_kl, chunk_size=hp.grad_chunk)
    return {"variables": {"params": params}}, {"grad": grad, "kl": kl, "loss": loss}


def server_update(m, server, clients, uploads, info):
    """One plain SGD step w <- w - server_lr * sum_i a_i g_i, a_i by ``server_weights`` (none arrived: no step)."""
    params = server["variables"]["params"]
    weights = kd_server.gradient_weights(info.num_samples, info.uploaded, m.hparams.server_weights)
    grad = kd_server.combine_gradients(uploads["grad"], weights)
    new = tree_ops.sub(params, tree_ops.scale(grad, server_lr(m)))
    return {"variables": {"params": new}}, clients


PFEDKD = Algorithm(
    name="pfedkd",
    paper=Paper("pFedKD-WCL", authors="Hengrui Hu, Anai N. Kothari, Anjishnu Banerjee",
                title="A Novel Algorithm for Personalized Federated Learning: Knowledge Distillation with Weighted "
                "Combination Loss", venue="Algorithms 18(5):274", year=2025, url="https://arxiv.org/abs/2504.04642",
                code="HengruiH/pFedKD"),
    hparams_type=PFedKDConfig,
    check=step_counted.check,
    init=init,
    client_update=client_update,
    server_update=server_update,
)
