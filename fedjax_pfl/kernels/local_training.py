"""Local training of ONE client that spends no work on padding.

Each client shuffles only its own ``n`` valid samples every epoch (padding is
sorted last) and runs exactly ``epochs * ceil(n / B)`` steps: the step loop is
a `counted_loop` (kernels/counted_loop.py: a `lax.fori_loop`) with the client's own trip
count, so under ``lax.map`` a client of 61 samples runs 7 steps while one of
6,413 runs 642. Under ``vmap`` a loop runs to the largest trip count of the
vmapped clients (finished clients are held by a select); the engine groups
clients of similar size into chunks for that reason, or packs them back to
back into lanes (``packed:W``: engine/packed_loops.py, client_mapping.py). The last batch of an epoch may be
partial (as PyTorch's DataLoader without drop_last): its loss is the mean over
its valid samples. With ``drop_last`` (train.drop_last; PFAKD's authors'
DataLoader) that partial batch is dropped: ``epochs * floor(n / B)`` steps, and
a client with n < B takes no step at all (its model comes back unchanged), as
PyTorch's ``drop_last=True`` gives it zero batches.

Statistics passes (evaluation, Fisher traces, prototypes, class means) use
`sum_batches`, which visits only the ``ceil(n / B)`` batches that hold real
samples, in a counted loop that packs into lanes like the step loop.

Both loops run as their ``loops`` (kernels/counted_loop.py `Loops`) say: in
packed lanes, and with ``loops.report`` each local step calls
``report('step', steps_done, total_steps, loss)`` and each batch of a
statistics pass ``report('pass', batches_done, batches, its sums)`` (the
engine's in-round progress, engine/round_progress.py); with the default
`PLAIN` nothing is added to the program.

This module holds no method logic: an objective is passed in.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels.counted_loop import PLAIN, Loops, counted_loop


AUGMENT_STREAM = 1  # fold_in constant of the augmentation keys (kernels/augmentation.py)


def batch_input(normalize: Callable, augment: Callable | None, key) -> Callable:
    """stored batch -> model input: ``normalize``, after ``augment`` with a key folded from ``key`` if given.

    Examples:
        >>> flip = lambda k, x: x[:, ::-1]
        >>> batch_input(lambda x: x / 2, flip, jax.random.key(0))(jnp.array([[2.0, 4.0]])).tolist()
        [[2.0, 1.0]]
        >>> batch_input(lambda x: x / 2, None, jax.random.key(0))(jnp.array([[2.0, 4.0]])).tolist()
        [[1.0, 2.0]]
    """
    if augment is None:
        return normalize
    augment_key = jax.random.fold_in(key, AUGMENT_STREAM)
    return lambda x: normalize(augment(augment_key, x))


class Batch(NamedTuple):
    x: jax.Array  # [B, ...] float32, normalised
    y: jax.Array  # [B] int32
    mask: jax.Array  # [B] bool, False for padding


def steps_per_epoch(n_max: int, batch_size: int) -> int:
    """``ceil(n_max / B)``, at least 1: the batch slots of an epoch over the padded data.

    Examples:
        >>> steps_per_epoch(10, 4), steps_per_epoch(0, 4)
        (3, 1)
    """
    return max(1, math.ceil(n_max / batch_size))


def epoch_order(key, n, n_max: int):
    """A random order of the ``n`` valid indices of ``range(n_max)``, padding last.

    Examples:
        >>> order = epoch_order(jax.random.PRNGKey(0), 3, 5)  # 3 real samples of 5 rows
        >>> sorted(order[:3].tolist()), order[3:].tolist()
        ([0, 1, 2], [3, 4])
    """
    r = jax.random.uniform(key, (n_max,))
    r = jnp.where(jnp.arange(n_max) < n, r, 2.0)
    return jnp.argsort(r)


def epoch_orders(key, n, n_max: int, max_epochs: int, batch_size: int):
    """[max_epochs, ceil(n_max/B) * B] sample orders: epoch e's shuffle of the ``n``
    valid indices first, then padding (index 0, masked).

    Examples:
        >>> orders = epoch_orders(jax.random.PRNGKey(0), 3, 5, max_epochs=2, batch_size=2)
        >>> orders.shape, [sorted(o[:3]) for o in orders.tolist()]
        ((2, 6), [[0, 1, 2], [0, 1, 2]])
    """
    spe = steps_per_epoch(n_max, batch_size)
    keys = jax.random.split(key, max_epochs)
    orders = jax.vmap(lambda k: epoch_order(k, n, n_max))(keys)
    return jnp.pad(orders, ((0, 0), (0, spe * batch_size - n_max)), constant_values=0)


def client_steps_per_epoch(n, batch_size: int, drop_last: bool):
    """``ceil(n / B)``, or ``floor(n / B)`` with ``drop_last``: one client's steps per epoch.

    Examples:
        >>> int(client_steps_per_epoch(5, 2, False)), int(client_steps_per_epoch(5, 2, True))
        (3, 2)
    """
    n = jnp.asarray(n, jnp.int32)
    return n // batch_size if drop_last else (n + batch_size - 1) // batch_size


def real_steps(n, batch_size: int, epochs, drop_last: bool):
    """``epochs * ceil(n / B)`` (``floor`` with ``drop_last``): the steps a client with ``n`` samples takes.

    Examples:
        >>> int(real_steps(61, 10, 2, drop_last=False)), int(real_steps(6, 10, 2, drop_last=True))
        (14, 0)
    """
    return jnp.asarray(epochs, jnp.int32) * client_steps_per_epoch(n, batch_size, drop_last)


def step_batch_index(orders, step, n, batch_size: int, spe):
    """(sample indices [B], mask [B]) of real step ``step`` (epoch-major) of one client
    whose epochs have ``spe`` steps (`client_steps_per_epoch`, at least 1).

    Examples:
        >>> orders = jnp.array([[4, 2, 0, 1, 3, 0]])  # one epoch over n=5 real samples, B=2 (padding index 0)
        >>> index, mask = step_batch_index(orders, 2, n=5, batch_size=2, spe=3)  # the epoch's last, partial batch
        >>> index.tolist(), mask.tolist()
        ([3, 0], [True, False])
    """
    epoch, within = step // spe, step % spe
    start = within * batch_size
    index = jax.lax.dynamic_slice(orders[epoch], (start,), (batch_size,))
    mask = start + jnp.arange(batch_size) < n
    return index, mask


def make_batch(data, index, mask, normalize: Callable) -> Batch:
    """Gather one batch of a single client's padded data and normalise it.

    Examples:
        >>> from fedjax_pfl.data.client_data import ClientData
        >>> data = ClientData(jnp.array([[0], [10], [20]], jnp.uint8), jnp.array([0, 1, 2]), jnp.asarray(3))
        >>> batch = make_batch(data, jnp.array([2, 0]), jnp.array([True, False]), lambda x: x / 10.0)
        >>> batch.x.tolist(), batch.y.tolist(), batch.mask.tolist()
        ([[2.0], [0.0]], [2, 0], [True, False])
    """
    return Batch(normalize(data.x[index]), data.y[index], mask)


Objective = Callable[..., tuple]
"""``objective(variables, batch, key) -> (loss, new_batch_stats)``."""

def train(objective: Objective, optimizer: optax.GradientTransformation, variables, data, key, **kwargs):
    """`train_with_state` from a fresh optimizer state -> (variables, mean loss); the state is dropped.

    Examples:
        >>> import optax
        >>> from fedjax_pfl.data.client_data import ClientData
        >>> from fedjax_pfl.kernels.batch_losses import feature_mse
        >>> data = ClientData(jnp.ones((4, 1)), jnp.zeros(4, jnp.int32), jnp.asarray(3))  # 3 real samples
        >>> def objective(variables, batch, key):  # fit w to 2 on the real samples
        ...     return feature_mse(batch.x * variables["params"]["w"], 2.0 * batch.x, batch.mask), None
        >>> variables, loss = train(objective, optax.sgd(0.1), {"params": {"w": jnp.zeros(())}}, data,
        ...                         jax.random.PRNGKey(0), batch_size=2, max_epochs=20, epochs=20, normalize=lambda x: x,
        ...                         drop_last=False)
        >>> round(float(variables["params"]["w"]), 3)  # 40 steps (2 per epoch)
        2.0
    """
    variables, loss, _ = train_with_state(objective, optimizer, variables, data, key, **kwargs)
    return variables, loss


def train_with_state(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    variables,
    data,
    key,
    *,
    batch_size: int,
    max_epochs: int,
    epochs,
    normalize: Callable,
    drop_last: bool,
    part: str = "all",
    opt_state=None,
    augment: Callable | None = None,
    loops: Loops = PLAIN,
):
    """Local SGD on ``part`` of ``variables`` for exactly ``epochs * ceil(n/B)`` steps (floor: ``drop_last``).

    Returns (variables, mean loss over the steps taken, final optimizer
    state). ``data`` is one client's (x [n_max, ...], y [n_max], n);
    ``epochs <= max_epochs`` may be traced (stragglers). The optimizer state
    starts from ``opt_state`` (a client's kept state, train.persistent_optimizer)
    or, when None, fresh (as in FedAvg's client update). ``drop_last``: each
    epoch's partial batch is dropped, ``epochs * floor(n/B)`` steps (a client
    with n < B takes none: variables and optimizer state come back as given,
    loss 0). BatchNorm statistics are updated only when the body is trained.
    ``augment(key, x)`` (kernels/augmentation.py), when given, transforms each
    stored batch before ``normalize``, with a key folded from the step's key
    (the objective's key stream is unchanged). ``loops``: how the step loop runs (module docstring).
    Step ``s`` of epoch ``e`` draws its key as the ``e * ceil(n_max/B) + s``-th
    of ``split(step_key, max_epochs * ceil(n_max/B))``, so the keys do not
    depend on how many steps other clients take.

    Examples:
        >>> import optax
        >>> from fedjax_pfl.data.client_data import ClientData
        >>> from fedjax_pfl.kernels.batch_losses import feature_mse
        >>> data = ClientData(jnp.ones((4, 1)), jnp.zeros(4, jnp.int32), jnp.asarray(3))
        >>> def objective(variables, batch, key):
        ...     return feature_mse(batch.x * variables["params"]["w"], 2.0 * batch.x, batch.mask), None
        >>> variables, loss, state = train_with_state(objective, optax.sgd(0.1, momentum=0.9), {"params": {"w": jnp.zeros(())}},
        ...                                           data, jax.random.PRNGKey(0), batch_size=2, max_epochs=1, epochs=1,
        ...                                           normalize=lambda x: x, drop_last=False)
        >>> round(float(variables["params"]["w"]), 3), round(float(loss), 3)  # 2 steps; the momentum is in state
        (1.08, 3.28)
    """
    n_max = data.y.shape[0]
    spe_max = steps_per_epoch(n_max, batch_size)
    sched_key, step_key = jax.random.split(key)
    orders = epoch_orders(sched_key, data.n, n_max, max_epochs, batch_size)
    step_keys = jax.random.split(step_key, max_epochs * spe_max)
    total = real_steps(data.n, batch_size, jnp.minimum(epochs, max_epochs), drop_last)
    spe = jnp.maximum(client_steps_per_epoch(data.n, batch_size, drop_last), 1)  # this client's steps per epoch
    params = tree_ops.trainable_of(variables, part)
    opt_state = optimizer.init(params) if opt_state is None else opt_state
    update_stats = part in ("all", "body") and "batch_stats" in variables

    def step(i, carry):
        params, opt_state, stats, loss_sum = carry
        index, mask = step_batch_index(orders, i, data.n, batch_size, spe)
        k = step_keys[(i // spe) * spe_max + i % spe]
        batch = make_batch(data, index, mask, batch_input(normalize, augment, k))

        def loss_of(p):
            v = tree_ops.with_trainable(variables, part, p)
            if stats is not None:
                v = {**v, "batch_stats": stats}
            return objective(v, batch, k)

        (loss, new_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        stats = new_stats if update_stats else stats
        if loops.report is not None:
            loops.report("step", i + 1, total, loss)
        return params, opt_state, stats, loss_sum + loss.astype(loss_sum.dtype)  # float32 whatever the loss's

    carry = (params, opt_state, variables.get("batch_stats"), jnp.zeros((), jnp.float32))
    params, opt_state, stats, loss_sum = counted_loop(step, total, carry, loops)
    out = tree_ops.with_trainable(variables, part, params)
    if stats is not None:
        out = {**out, "batch_stats": stats}
    return out, loss_sum / jnp.maximum(total, 1), opt_state


def _batch_in_order(data, t, batch_size: int, normalize: Callable) -> Batch:
    n_max = data.y.shape[0]
    position = t * batch_size + jnp.arange(batch_size)
    return make_batch(data, jnp.minimum(position, n_max - 1), position < data.n, normalize)


def sum_batches(fn, data, batch_size: int, normalize: Callable, loops: Loops = PLAIN):
    """Sum of ``fn(batch)`` over the ``ceil(n/B)`` batches of one client's real samples, in order.

    Padding-only batches are never computed; rows past ``n`` inside the last
    batch are masked, so ``fn`` must give them no weight. Used for evaluation
    and statistics passes (Fisher traces, prototypes, class means); ``loops``: how its loop runs.

    Examples:
        >>> from fedjax_pfl.data.client_data import ClientData
        >>> data = ClientData(jnp.arange(5.0)[:, None], jnp.zeros(5, jnp.int32), jnp.asarray(3))  # 3 real of 5 rows
        >>> float(sum_batches(lambda b: jnp.sum(b.x[:, 0] * b.mask), data, batch_size=2, normalize=lambda x: x))  # 0+1+2
        3.0
        >>> heard = []  # a reporter hears the pass once, while it is traced
        >>> _ = sum_batches(lambda b: b.mask.sum(), data, 2, lambda x: x, Loops(report=lambda *a: heard.append(a[0])))
        >>> heard
        ['pass']
    """
    count = (data.n + batch_size - 1) // batch_size
    shape = jax.eval_shape(fn, _batch_in_order(data, 0, batch_size, normalize))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)

    def body(t, acc):
        summed = jax.tree.map(jnp.add, acc, fn(_batch_in_order(data, t, batch_size, normalize)))
        if loops.report is not None:
            loops.report("pass", t + 1, count, summed)
        return summed

    return counted_loop(body, count, zeros, loops)


def map_batches(fn, data, batch_size: int, normalize: Callable):
    """``fn(batch)`` for every batch slot of the padded data, stacked [ceil(n_max/B), ...].

    Visits padding-only batches too (with an all-False mask): for tests and
    inspection; passes that reduce over batches use `sum_batches`.

    Examples:
        >>> from fedjax_pfl.data.client_data import ClientData
        >>> data = ClientData(jnp.arange(5.0)[:, None], jnp.zeros(5, jnp.int32), jnp.asarray(3))
        >>> map_batches(lambda b: b.mask.sum(), data, batch_size=2, normalize=lambda x: x).tolist()  # real rows per slot
        [2, 1, 0]
    """
    n_max = data.y.shape[0]
    spe = steps_per_epoch(n_max, batch_size)
    return jax.lax.map(lambda t: fn(_batch_in_order(data, t, batch_size, normalize)), jnp.arange(spe))
