"""pFedKD-WCL: personal models distilled from a global teacher (weighted combination loss).

Algorithm (METHODS.md, "pFedKD-WCL"; authors' code HengruiH/pFedKD):
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
  paper's text) (`kd_server.client_server_gradient`);
- server: one SGD step w <- w - server_lr * sum_i (n_i / sum_j n_j) g_i, all
  g_i taken at the same w.
Evaluation (``eval.model=local``): each client's personal model theta_i.
Only the sampled clients train each round (the authors' ``aggregate``);
``train.all_clients_train=true`` lets every client update theta_i each round
while only the sampled clients' g_i enter the server step (pFedMe's authors'
protocol, not pFedKD's).

R is ``method.local_steps`` (default: ``train.local_epochs``, read as a step
count, as the authors' ``--local_epochs``). A straggler with e < E epochs
takes max(1, R * e // E) steps. server_lr defaults to ``train.lr`` (the authors
use one learning rate for both). The three step-counted methods of the pFedKD
comparison (this one, Per-FedAvg, pFedMe) share `random_batch_steps` below.
They support models without BatchNorm (MLR, MLP: the papers' models).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import aggregation, losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import kd_server, local_training
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.base import Method


# ---------------------------------------------------------------- random-batch local steps
def random_batch_index(key, n, n_max: int, batch_size: int):
    """(index [B], mask [B]): B distinct random valid rows of a padded client (all n if n < B)."""
    order = local_training.epoch_order(key, n, n_max)
    if n_max < batch_size:
        order = jnp.pad(order, (0, batch_size - n_max))
    return order[:batch_size], jnp.arange(batch_size) < n


def random_batch(key, data, batch_size: int, normalize: Callable) -> local_training.Batch:
    """One random batch of B distinct samples of one client's padded data."""
    index, mask = random_batch_index(key, data.n, data.y.shape[0], batch_size)
    return local_training.make_batch(data, index, mask, normalize)


def random_batch_steps(step: Callable, carry, data, key, *, steps, max_steps: int, batch_size: int,
                       normalize: Callable, batches_per_step: int = 1):
    """Run ``step(carry, batches, key) -> (carry, loss)`` ``max_steps`` times, masked after ``steps``.

    Each step gets a tuple of ``batches_per_step`` fresh random batches of B
    distinct samples; masked steps (index >= ``steps``, or a client with no
    samples) leave the carry unchanged. Returns (carry, mean loss over real steps).
    """
    keys = jax.random.split(key, max_steps)
    valid = (jnp.arange(max_steps) < steps) & (data.n > 0)

    def body(state, xs):
        carry, loss_sum = state
        k, ok = xs
        k_step, *k_batches = jax.random.split(k, batches_per_step + 1)
        batches = tuple(random_batch(kb, data, batch_size, normalize) for kb in k_batches)
        new, loss = step(carry, batches, k_step)
        carry = tree_ops.select(ok, new, carry)
        return (carry, loss_sum + jnp.where(ok, loss, 0.0)), None

    (carry, loss_sum), _ = jax.lax.scan(body, (carry, jnp.zeros((), jnp.float32)), (keys, valid))
    return carry, loss_sum / jnp.maximum(valid.sum(), 1)


class StepMethod(Method):
    """Helpers of the step-counted methods: R, straggler steps, train.lr, BatchNorm check."""

    def __init__(self, setup, hparams=None):
        super().__init__(setup, hparams)
        if setup.learning_rate is None:
            raise ValueError(f"{self.name} takes SGD steps itself: set LocalSetup.learning_rate (train.lr)")
        if setup.drop_last:
            raise UserError(f"method {self.name!r} draws a random batch of B samples per step, not epochs of "
                            "batches: train.drop_last does not apply; leave it false")
        self.train_lr = setup.learning_rate

    def local_steps(self) -> int:
        r = getattr(self.hparams, "local_steps", None)
        return int(r) if r else int(self.setup.local_epochs)

    def steps_this_round(self, info):
        """R, or max(1, R * e // E) for a straggler that trains e < E epochs."""
        r, e_max = self.local_steps(), int(self.setup.local_epochs)
        return jnp.clip(r * info.epochs // e_max, 1, r)

    def init_variables(self, key):
        variables = self.model.init(key)
        if "batch_stats" in variables:
            raise UserError(f"method {self.name!r} supports models without BatchNorm (e.g. --model mlr or mlp)")
        return variables

    def run_steps(self, step, carry, data, key, info, batches_per_step: int = 1):
        return random_batch_steps(step, carry, data, key, steps=self.steps_this_round(info),
                                  max_steps=self.local_steps(), batch_size=self.setup.batch_size,
                                  normalize=self.setup.normalize, batches_per_step=batches_per_step)

    def logits(self, params, x, train: bool = False):
        return self.model.apply({"params": params}, x, train=train).logits


def _check_positive_int_or_none(name, value):
    if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
        raise UserError(f"method.{name} must be a whole number >= 1 (or empty for the default), got {value!r}")


def _check_positive_or_none(name, value):
    if value is not None and not value > 0:
        raise UserError(f"method.{name} must be > 0 (or empty for the default), got {value!r}")


# ---------------------------------------------------------------- pFedKD-WCL
@dataclasses.dataclass(frozen=True)
class PFedKDConfig:
    alpha: float = 0.1  # weight of the KL term in the client loss
    temperature: float = 1.0
    local_steps: int | None = None  # R; None: train.local_epochs read as steps
    server_lr: float | None = None  # None: train.lr
    server_kl: str = "teacher_first"  # | student_first
    grad_chunk: int = 1024  # rows per chunk of the full-train-set gradient pass (memory only)

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"method.alpha must be in [0, 1], got {self.alpha}")
        if not self.temperature > 0:
            raise UserError(f"method.temperature must be > 0, got {self.temperature}")
        _check_positive_int_or_none("local_steps", self.local_steps)
        _check_positive_or_none("server_lr", self.server_lr)
        if self.server_kl not in kd_server.DIRECTIONS:
            choices = ", ".join(kd_server.DIRECTIONS)
            raise UserError(f"method.server_kl must be one of {choices}, got {self.server_kl!r}")
        _check_positive_int_or_none("grad_chunk", self.grad_chunk)


class PFedKD(StepMethod):
    name = "pfedkd"
    hparams_type = PFedKDConfig

    def init(self, key, num_clients):
        k_global, k_personal = jax.random.split(key)
        global_variables = self.init_variables(k_global)
        personal = jax.lax.map(self.init_variables, jax.random.split(k_personal, num_clients))
        return {"variables": global_variables}, {"variables": personal}

    @property
    def server_lr(self) -> float:
        return self.hparams.server_lr if self.hparams.server_lr is not None else self.train_lr

    def client_update(self, server, client, data, key, info):
        hp, normalize = self.hparams, self.setup.normalize
        teacher = server["variables"]["params"]
        optimizer = self.setup.optimizer

        def loss_fn(params, batch):
            logits = self.logits(params, batch.x, train=True)
            if hp.alpha == 0.0:  # pure local training; the teacher is not even evaluated
                return losses.cross_entropy(logits, batch.y, batch.mask)
            teacher_logits = self.logits(teacher, batch.x)
            return losses.weighted_kd_loss(logits, teacher_logits, batch.y, hp.alpha, hp.temperature, batch.mask)

        def step(carry, batches, _key):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, batches[0])
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        params = client["variables"]["params"]
        (params, _), loss = self.run_steps(step, (params, optimizer.init(params)), data, key, info)
        kl, grad = kd_server.client_server_gradient(
            lambda w, x: self.logits(w, normalize(x)), teacher, lambda x: self.logits(params, normalize(x)),
            data.x, data.n, temperature=hp.temperature, direction=hp.server_kl, chunk_size=hp.grad_chunk)
        return {"variables": {"params": params}}, {"grad": grad, "kl": kl, "loss": loss}

    def server_update(self, server, clients, uploads, info):
        params = server["variables"]["params"]
        zeros = jax.tree.map(jnp.zeros_like, params)
        grad = aggregation.weighted_mean_or(uploads["grad"], info.sample_weights, zeros)
        new = tree_ops.sub(params, tree_ops.scale(grad, self.server_lr))  # one plain SGD step
        return {"variables": {"params": new}}, clients
