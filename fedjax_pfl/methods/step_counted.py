"""The step-counted methods' shape: R local SGD steps, each on one random batch of B distinct samples.

pFedKD-WCL, Per-FedAvg, pFedMe and pFedHN count local work in minibatch
steps, as their authors' code does (their "local epochs" are steps: each step
draws ``torch.randperm(n)[:B]``), not in epochs over the client's data.
`random_batch_steps` runs such steps with a masked scan (stragglers take
fewer; `optimizer_steps` with an optax optimizer, for an epoch-based method
run under this protocol). From a method's options and the run's
`LocalTraining` they give R (`local_steps`: ``method.local_steps``, else
``train.local_epochs`` read as steps), the straggler step count
(`steps_this_round`) and the masked scan with the run's batch size
(`run_steps`); `check` is their rules on a run (no train.drop_last, no
BatchNorm), which its validation applies. Nothing here is specific to one of
them.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods.base import LocalTraining, RunFacts


def random_batch_index(key, n, n_max: int, batch_size: int):
    """(index [B], mask [B]): B distinct random valid rows of a padded client (all n if n < B)."""
    order = local_training.epoch_order(key, n, n_max)
    if n_max < batch_size:
        order = jnp.pad(order, (0, batch_size - n_max))
    return order[:batch_size], jnp.arange(batch_size) < n


def random_batch(key, data, batch_size: int, normalize: Callable, augment: Callable | None = None
                 ) -> local_training.Batch:
    """One random batch of B distinct samples of one client's padded data (``augment``: as local_training's)."""
    index, mask = random_batch_index(key, data.n, data.y.shape[0], batch_size)
    return local_training.make_batch(data, index, mask, local_training.batch_input(normalize, augment, key))


def random_batch_steps(step: Callable, carry, data, key, *, steps, max_steps: int, batch_size: int,
                       normalize: Callable, batches_per_step: int = 1, augment: Callable | None = None):
    """Run ``step(carry, batches, key) -> (carry, loss)`` ``max_steps`` times, masked after ``steps``.

    Each step gets a tuple of ``batches_per_step`` fresh random batches of B
    distinct samples (each augmented by ``augment`` when given); masked steps
    (index >= ``steps``, or a client with no samples) leave the carry unchanged. Returns (carry, mean loss over real steps).
    """
    keys = jax.random.split(key, max_steps)
    valid = (jnp.arange(max_steps) < steps) & (data.n > 0)

    def body(state, xs):
        carry, loss_sum = state
        k, ok = xs
        k_step, *k_batches = jax.random.split(k, batches_per_step + 1)
        batches = tuple(random_batch(kb, data, batch_size, normalize, augment) for kb in k_batches)
        new, loss = step(carry, batches, k_step)
        carry = tree_ops.select(ok, new, carry)
        return (carry, loss_sum + jnp.where(ok, loss, 0.0)), None

    (carry, loss_sum), _ = jax.lax.scan(body, (carry, jnp.zeros((), jnp.float32)), (keys, valid))
    return carry, loss_sum / jnp.maximum(valid.sum(), 1)


def optimizer_steps(objective: Callable, optimizer, variables, data, key, *, steps, max_steps: int, batch_size: int,
                    normalize: Callable, augment: Callable | None = None):
    """``steps`` (<= ``max_steps``) steps of ``optimizer`` on ``objective(variables, batch, key) -> (loss,
    batch_stats)``, each on one random batch of B distinct samples, from a fresh optimizer state ->
    (variables, mean loss over the real steps): the step-counted protocol for an epoch-based method."""
    params = variables["params"]

    def step(carry, batches, k):
        params, opt_state, stats = carry

        def loss_of(p):
            current = {**variables, "params": p}
            if stats is not None:
                current["batch_stats"] = stats
            return objective(current, batches[0], k)

        (loss, new_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, new_stats if stats is not None else None), loss

    carry = (params, optimizer.init(params), variables.get("batch_stats"))
    (params, _, stats), loss = random_batch_steps(step, carry, data, key, steps=steps, max_steps=max_steps,
                                                  batch_size=batch_size, normalize=normalize, augment=augment)
    out = {**variables, "params": params}
    if stats is not None:
        out["batch_stats"] = stats
    return out, loss


def straggler_steps(r: int, epochs, local_epochs: int):
    """R steps, or max(1, R * e // E) for a straggler that trains e < E epochs."""
    return jnp.clip(r * epochs // int(local_epochs), 1, r)


def check(name: str, options, facts: RunFacts) -> None:
    """These methods draw a random batch per step (train.drop_last does not apply) and their models have no
    BatchNorm (the authors' have none)."""
    if facts.drop_last:
        raise UserError(f"method {name!r} draws a random batch of B samples per step, not epochs of "
                        "batches: train.drop_last does not apply; leave it false")
    if facts.model is not None and "batch_stats" in facts.variables:
        raise UserError(f"method {name!r} supports models without BatchNorm (e.g. --model mlr or mlp)")


def local_steps(options, local_epochs: int) -> int:
    """R: ``method.local_steps`` of ``options``, else ``local_epochs`` (train.local_epochs) read as a step count."""
    r = getattr(options, "local_steps", None)
    return int(r) if r else int(local_epochs)


def steps_this_round(options, local_epochs: int, epochs):
    """R, or max(1, R * e // E) for a straggler that trains ``epochs`` = e < E = ``local_epochs`` epochs."""
    return straggler_steps(local_steps(options, local_epochs), epochs, local_epochs)


def init_variables(m, key):
    """The model's initial variables (`check` refused a model with BatchNorm)."""
    return m.model.init(key)


def run_steps(options, local: LocalTraining, step, carry, data, key, info, batches_per_step: int = 1):
    """`random_batch_steps` of this round's R steps (fewer for a straggler) with ``local``'s batch size,
    normalisation and augmentation."""
    return random_batch_steps(step, carry, data, key, steps=steps_this_round(options, local.local_epochs, info.epochs),
                              max_steps=local_steps(options, local.local_epochs), batch_size=local.batch_size,
                              normalize=local.normalize, batches_per_step=batches_per_step, augment=local.augment)


def draw_batch(local: LocalTraining, key, data) -> local_training.Batch:
    """`random_batch` of ``local``'s batch size, normalisation and augmentation."""
    return random_batch(key, data, local.batch_size, local.normalize, local.augment)


def logits(m, params, x, train: bool = False):
    return m.model.apply({"params": params}, x, train=train).logits


def normalized_logits(m, local: LocalTraining, params, x):
    """`logits` in inference mode of a stored batch ``x``, normalised as ``local`` says."""
    return logits(m, params, local.normalize(x))
