"""Local training with the run's settings: the steps most methods take, as functions of what they read.

`train` runs E epochs of masked local SGD (kernels/local_training.py) with the
optimizer, batch size, normalisation and augmentation of the `LocalTraining`
record it is given (a method passes ``m.local``); `train_kept` does the same
from the client's kept optimizer state where train.persistent_optimizer asks
for it; `supervised_objective` is the cross-entropy objective of the method's
model with an optional extra term; `shared_init` starts every client from one
initial model. Nothing here knows a particular method.
"""

from __future__ import annotations

from typing import Callable

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods.base import LocalTraining


def shared_init(m, key, num_clients: int):
    """(variables, variables broadcast to [N, ...]): every client starts from the same initial model
    (docs/methods/conventions.md)."""
    variables = m.model.init(key)
    return variables, tree_ops.broadcast(variables, num_clients)


def supervised_objective(m, extra: Callable | None = None):
    """objective(variables, batch, key) -> (CE of the model output [+ ``extra(variables, batch, output, key)``],
    the model's new BatchNorm statistics); a model with dropout draws it from ``key``."""

    def objective(variables, batch, key):
        out = m.model.apply(variables, batch.x, train=True, mask=batch.mask, rng=key)
        loss = losses.cross_entropy(out.logits, batch.y, batch.mask)
        if extra is not None:
            loss = loss + extra(variables, batch, out, key)
        return loss, out.batch_stats

    return objective


def train(local: LocalTraining, objective, variables, data, key, epochs, *, part="all", optimizer=None,
          max_epochs=None):
    """``epochs`` (at most ``max_epochs``, default ``local.local_epochs``) epochs of masked local SGD of ``part`` of
    ``variables`` on ``objective`` from a fresh state of ``optimizer`` (default ``local.optimizer``) ->
    (variables, mean loss)."""
    return local_training.train(objective, optimizer or local.optimizer, variables, data, key,
                                batch_size=local.batch_size, max_epochs=max_epochs or local.local_epochs,
                                epochs=epochs, normalize=local.normalize, part=part, drop_last=local.drop_last,
                                augment=local.augment, loops=local.loops)


def train_kept(local: LocalTraining, objective, client, variables, data, key, epochs, state="opt_state", *,
               part="all", optimizer=None, max_epochs=None):
    """`train` of ``part`` from the client's kept optimizer state -> (variables, loss, kept).

    With ``local.persistent_optimizer`` the optimizer state (e.g. SGD momentum)
    starts from ``client[state]`` and ``kept`` is ``{state: final state}``, to
    store in the client's state; as in PFLlib (PFAKD's authors' code), where
    each client keeps its optimizer objects across its participations, also for
    parameters it receives from the server. A method that trains its parts in
    phases keeps one state per phase (FedRep's and FedPAC's head and body;
    PFLlib's optimizers skip the parameters a phase freezes, so their momentum
    waits for the next phase of the same part). Otherwise the state starts fresh
    and ``kept`` is ``{}`` (client state unchanged).
    """
    if not local.persistent_optimizer:
        variables, loss = train(local, objective, variables, data, key, epochs, part=part, optimizer=optimizer,
                                max_epochs=max_epochs)
        return variables, loss, {}
    variables, loss, opt_state = local_training.train_with_state(
        objective, optimizer or local.optimizer, variables, data, key, batch_size=local.batch_size,
        max_epochs=max_epochs or local.local_epochs, epochs=epochs, normalize=local.normalize, part=part,
        drop_last=local.drop_last, opt_state=client[state], augment=local.augment, loops=local.loops)
    return variables, loss, {state: opt_state}


def with_optimizer_state(local: LocalTraining, clients, variables, num_clients: int, state="opt_state", *,
                         part="all", optimizer=None):
    """``clients`` plus a fresh optimizer state ``state`` of ``part`` of ``variables`` per client
    (``local.persistent_optimizer`` only; ``optimizer``: the one `train_kept` will use, default
    ``local.optimizer``)."""
    if not local.persistent_optimizer:
        return clients
    fresh = (optimizer or local.optimizer).init(tree_ops.trainable_of(variables, part))
    return {**clients, state: tree_ops.broadcast(fresh, num_clients)}


def sum_batches(local: LocalTraining, fn, data):
    """Sum of ``fn(batch)`` over the client's real batches of ``local.batch_size`` (local_training.sum_batches)."""
    return local_training.sum_batches(fn, data, local.batch_size, local.normalize, local.loops)


def map_batches(local: LocalTraining, fn, data):
    """``fn(batch)`` per batch slot of ``local.batch_size``, stacked (padding-only slots included)."""
    return local_training.map_batches(fn, data, local.batch_size, local.normalize)


def proximal_objective(m, anchor, weight):
    """CE plus ``weight`` (1/2) ||params - anchor||^2 (`losses.proximal`): FedProx's, Ditto's and the anchored
    methods' local loss."""
    return supervised_objective(m, lambda v, batch, out, key: weight * losses.proximal(v["params"], anchor))
