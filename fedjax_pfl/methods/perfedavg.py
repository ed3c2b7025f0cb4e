"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): FedAvg on the MAML objective.

Client, for R local steps, each on fresh random batches of B (plain SGD):
- ``variant=fo`` (first-order MAML, the default; as in the pFedMe authors'
  code, the pFedKD authors' copy of it and PFLlib): temp = w - alpha grad f(w; D);
  w <- w - beta grad f(temp; D') (w is restored before the beta step);
- ``variant=hf`` (Hessian-free): w <- w - beta (I - alpha H(w; D'')) grad f(temp; D'),
  with the Hessian-vector product computed exactly (forward-over-reverse)
  instead of the paper's finite-difference approximation.
Server: weighted mean of the client models (weights n_i), as FedAvg.
Both steps are plain SGD (the authors' PerAvgOptimizer): a run whose train.optimizer, momentum or
weight_decay ask for more is refused rather than run without them.

Evaluation (``eval.model=global_adapted``): each client adapts a copy of the
global model on its own TRAIN data: ``eval_steps`` (default 1) SGD steps of
size alpha, then ``eval_beta_steps`` (default 1) steps of size beta, each on a
fresh random batch of B train samples, and is tested with the result. The two
default steps are what both authors' codes take (``train_one_step``); they
differ in the data: the pFedMe authors' code (CharlieDinh/pFedMe
userperavg.py) takes both steps on the next batches of the client's TEST
loader and then tests on the whole test set, i.e. it adapts on the data it
scores; that is not a valid protocol and is not offered here. The pFedKD
authors' copy (HengruiH/pFedKD algorithms/perfedavg.py) takes them on random
train batches, as here. PFLlib takes one alpha step on one train batch
(``method.eval_beta_steps=0``). Both authors' codes evaluate after the server
step of each round, as the engine does.

Hyperparameters (pFedMe paper, Dinh et al. 2020, Per-FedAvg on MNIST /
Synthetic): alpha = train.lr = 0.005, beta = 0.001, R = 20, B = 20. The pFedKD
authors' script uses lr 0.01 and beta 0.1 (their paper: beta 0.002). alpha
defaults to ``train.lr``. Local batches: random B distinct samples per batch
(pFedKD's copy); the pFedMe authors' code cycles through an unshuffled train
loader across rounds, and PFLlib splits each batch of 2B of a shuffled epoch
into D and D'. Only the selected clients train, as in both authors' codes
(CharlieDinh/pFedMe serverperavg.py, HengruiH/pFedKD algorithms/perfedavg.py);
``train.all_clients_train`` would train all of them for nothing here (the
client keeps no state).
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.methods import fedavg, step_counted
from fedjax_pfl.methods.base import Algorithm, Paper
from fedjax_pfl.methods.options import Options, option

VARIANTS = ("fo", "hf")


@dataclasses.dataclass(frozen=True)
class PerFedAvgConfig(Options):
    beta: float = option(0.001, "outer (meta) step size", more_than=0.0)
    alpha: float | None = option(None, "inner step size", more_than=0.0, none="train.lr")
    variant: str = option("fo", "first-order MAML (fo) or Hessian-free with exact Hessian-vector products (hf)",
                          choices=VARIANTS)
    local_steps: int | None = option(None, "R local steps per round", at_least=1,
                                     none="train.local_epochs read as steps")
    eval_steps: int = option(1, "SGD steps of size alpha from the global model at evaluation", at_least=1)
    eval_beta_steps: int = option(1, "then SGD steps of size beta at evaluation (both authors' codes: 1; "
                                  "PFLlib: 0)", at_least=0)


def init(m, key, num_clients):
    """The global model; clients hold no state."""
    return {"variables": step_counted.init_variables(m, key)}, {}


def inner_step_size(m) -> float:
    """alpha: ``method.alpha``, else train.lr."""
    return m.hparams.alpha if m.hparams.alpha is not None else m.lr


def batch_loss(m, params, batch):
    """CE of the model with ``params`` on one batch."""
    return losses.cross_entropy(step_counted.logits(m, params, batch.x, train=True), batch.y, batch.mask)


def client_update(m, server, client, data, key, info):
    """R meta steps from the global model: w - beta grad f(w - alpha grad f(w; D); D') (hf: times
    (I - alpha H(w; D''))); upload w."""
    alpha, beta = inner_step_size(m), m.hparams.beta
    loss_of = functools.partial(batch_loss, m)
    grad = jax.value_and_grad(loss_of)
    hessian_free = m.hparams.variant == "hf"

    def step(w, batches, _key):
        loss, g1 = grad(w, batches[0])
        temp = tree_ops.sub(w, tree_ops.scale(g1, alpha))
        _, g2 = grad(temp, batches[1])
        if hessian_free:  # (I - alpha H(w; D'')) g2
            hvp = jax.jvp(lambda p: jax.grad(loss_of)(p, batches[2]), (w,), (g2,))[1]
            g2 = tree_ops.sub(g2, tree_ops.scale(hvp, alpha))
        return tree_ops.sub(w, tree_ops.scale(g2, beta)), loss

    params = server["variables"]["params"]
    params, loss = step_counted.run_steps(m.hparams, m.local, step, params, data, key, info,
                                          batches_per_step=3 if hessian_free else 2)
    return client, {"variables": {"params": params}, "loss": loss}


def eval_variables(m, server, client, data, key):
    """The global model after ``eval_steps`` alpha-sized and ``eval_beta_steps`` beta-sized SGD steps,
    each on its own random train batch (the i-th step's batch from the i-th of ``split(key, steps)``)."""
    hp, local = m.hparams, m.local
    sizes = [inner_step_size(m)] * hp.eval_steps + [hp.beta] * hp.eval_beta_steps
    params = server["variables"]["params"]
    for size, k in zip(sizes, jax.random.split(key, len(sizes))):
        batch = step_counted.draw_batch(local, k, data)
        g = jax.grad(functools.partial(batch_loss, m))(params, batch)
        params = tree_ops.select(data.n > 0, tree_ops.sub(params, tree_ops.scale(g, size)), params)
    return {"params": params}


PERFEDAVG = Algorithm(
    name="perfedavg",
    paper=Paper("Per-FedAvg", authors="Alireza Fallah, Aryan Mokhtari, Asuman Ozdaglar",
                title="Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic Meta-Learning "
                "Approach", venue="NeurIPS", year=2020, url="https://arxiv.org/abs/2002.07948"),
    hparams_type=PerFedAvgConfig,
    eval_models=("global_adapted",),
    own_sgd=True,  # the authors' PerAvgOptimizer: plain SGD of alpha, then beta
    check=step_counted.check,
    init=init,
    client_update=client_update,
    server_update=fedavg.server_update,
    eval_variables=eval_variables,
)
