"""APPLE's kernel (Luo & Wu, IJCAI 2022): personalized models as learnable mixes of core models.

Client i's personalized model is w_p,i = sum_j p_ij w_c,j over ALL clients'
core models (`mix_cores`): its own core w_c,i (trainable) and the downloaded
cores of the others (fixed). For Dense and Conv layers this equals the authors'
``superBlock`` (sum_j p_j layer_j(x)), which is linear in the weights.
The directed-relationship (DR) vector p_i starts at p^0 (`initial_relationships`)
and is pulled back to it by coef(r) * ||p_i - p^0||^2 (`relationship_penalty`,
the authors' ``reg_loss``: no 1/2) with a coefficient that decays to 0 after
``reg_rounds`` rounds (`proximal_coefficient`). Pure, jit-able.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.kernels.simplex_qp import project_simplex

SCHEDULES = ("exponential", "cosine")
EXPONENTIAL_FLOOR = 1e-3  # the authors' epsilon: coef falls from mu to mu * 1e-3 over reg_rounds


def mix_cores(p, cores, own_index, own_core):
    """sum_{j != own} p_j cores_j + p_own * own_core.

    p [N], or a tree like ``cores`` of one p [N] per leaf (`layer_mean_relationships`); ``cores`` a
    stacked tree [N, ...] of all clients' cores (row ``own_index`` is ignored and replaced by
    ``own_core``, a single tree).

    Examples:
        >>> cores = {"w": jnp.array([[1.0], [2.0], [4.0]])}  # N=3 clients' cores
        >>> p = jnp.array([0.5, 0.25, 0.25])
        >>> mix_cores(p, cores, 0, {"w": jnp.array([10.0])})["w"].tolist()  # 0.5*10 + 0.25*2 + 0.25*4
        [6.5]
    """
    def leaf(q, stacked, own):
        others = jnp.where(jnp.arange(q.shape[0]) == own_index, 0.0, q)
        mixed = weighted_rows(others.astype(jnp.float32), stacked.astype(jnp.float32))
        return (mixed + q[own_index] * own).astype(own.dtype)

    per_leaf = p if isinstance(p, dict) else jax.tree.map(lambda _: p, cores)
    return jax.tree.map(leaf, per_leaf, cores, own_core)


@jax.custom_vjp
def weighted_rows(weights, stacked):
    """sum_j weights_j stacked_j: weights [N], stacked [N, ...] -> [...].

    The same value and gradients as ``jnp.tensordot(weights, stacked, axes=1)``;
    only the weights' gradient is computed as the product ``stacked [N, P] @ g [P]``,
    which reads the rows as they lie. Autodiff's form, ``g @ stacked^T``,
    made XLA:CPU copy the [N, P] stack into its transpose at every local step
    (the stack is fixed over the steps, but the copy stayed in the loop;
    benchmarks/RESULTS.md, "APPLE's core mix").

    Examples:
        >>> w, rows = jnp.array([0.5, 0.25]), jnp.array([[2.0, 4.0], [4.0, 8.0]])
        >>> weighted_rows(w, rows).tolist()
        [2.0, 4.0]
        >>> jax.grad(lambda w: weighted_rows(w, rows).sum())(w).tolist()  # each row's sum
        [6.0, 12.0]
    """
    return jnp.tensordot(weights, stacked, axes=1)


def _weighted_rows_forward(weights, stacked):
    return weighted_rows(weights, stacked), (weights, stacked)


def _weighted_rows_backward(saved, g):
    weights, stacked = saved
    flat = stacked.reshape(stacked.shape[0], -1)
    d_weights = jnp.dot(flat, g.reshape(-1).astype(flat.dtype)).astype(weights.dtype)
    d_stacked = (weights[:, None] * g.reshape(1, -1)).reshape(stacked.shape).astype(stacked.dtype)  # unused: DCE'd
    return d_weights, d_stacked


weighted_rows.defvjp(_weighted_rows_forward, _weighted_rows_backward)


def layer_mean_relationships(p, cores):
    """``p`` as one value per leaf of ``cores`` whose gradient is PFLlib's layer-averaged one.

    Mixing leaf t with its copy of ``p`` gives the same model as with ``p``;
    only the gradient of p changes: from sum_t sum_e g_t c_j,t (the exact
    one) to (1/T) sum_t mean_e g_t c_j,t (PFLlib's clientapple.py: the mean
    over the elements of each of the T parameter tensors, averaged over them).

    Examples:
        >>> cores = {"a": jnp.ones((2, 4)), "b": jnp.ones((2, 1))}  # N=2 cores, leaves of 4 and 1 elements
        >>> grad = jax.grad(lambda p: sum(jnp.sum(jnp.tensordot(q, c, axes=1)) for q, c in
        ...     zip(jax.tree.leaves(layer_mean_relationships(p, cores)), jax.tree.leaves(cores))))(jnp.ones(2))
        >>> grad.tolist()  # exact gradient 5 per client; layer mean (4/4 + 1/1) / 2
        [1.0, 1.0]
    """
    leaves = jax.tree.leaves(cores)

    def scaled(leaf):
        s = 1.0 / (len(leaves) * math.prod(leaf.shape[1:]))
        return p * s + jax.lax.stop_gradient(p * (1.0 - s))  # value p, gradient s * dp

    return jax.tree.map(scaled, cores)


def initial_relationships(num_clients: int, sizes=None):
    """p^0: n_j / sum n (the authors' ``init_pss``), or 1/N without sizes.

    Examples:
        >>> initial_relationships(4).tolist()
        [0.25, 0.25, 0.25, 0.25]
        >>> initial_relationships(2, sizes=[30, 10]).tolist()
        [0.75, 0.25]
    """
    if sizes is None:
        return jnp.full((num_clients,), 1.0 / num_clients, jnp.float32)
    sizes = jnp.asarray(sizes, jnp.float32)
    return sizes / jnp.sum(sizes)


def proximal_coefficient(round_index, mu: float, reg_rounds: int, schedule: str = "exponential"):
    """coef(r): mu * 1e-3^(r / L) ('exponential', the authors' default) or
    mu * (cos(pi r / L) + 1) / 2 ('cosine'), for r < L = reg_rounds; 0 after.

    Examples:
        >>> [round(float(proximal_coefficient(r, mu=0.1, reg_rounds=10)), 5) for r in (0, 5, 10)]
        [0.1, 0.00316, 0.0]
        >>> [round(float(proximal_coefficient(r, 0.1, 10, "cosine")), 5) for r in (0, 5, 10)]
        [0.1, 0.05, 0.0]
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if mu == 0 or reg_rounds <= 0:
        return jnp.zeros((), jnp.float32)
    r = jnp.asarray(round_index, jnp.float32)
    if schedule == "cosine":
        value = (jnp.cos(math.pi * r / reg_rounds) + 1.0) / 2.0 * mu
    else:
        value = EXPONENTIAL_FLOOR ** (r / reg_rounds) * mu
    return jnp.where(r < reg_rounds, value, 0.0)


def relationship_penalty(p, p0, coef):
    """coef * ||p - p^0||^2 (p^0 carries no gradient).

    Examples:
        >>> round(float(relationship_penalty(jnp.array([0.5, 0.5]), jnp.array([1.0, 0.0]), coef=0.1)), 4)
        0.05
    """
    return coef * jnp.sum(jnp.square(p - jax.lax.stop_gradient(p0)))


def onto_simplex() -> optax.GradientTransformation:
    """An optax step that ends on the probability simplex: u -> proj(p + u) - p (per leaf).

    Examples:
        >>> import numpy as np
        >>> import optax
        >>> p = jnp.array([0.5, 0.5])
        >>> opt = optax.chain(optax.sgd(1.0), onto_simplex())
        >>> updates, _ = opt.update(jnp.array([-1.0, 0.0]), opt.init(p), p)
        >>> print(np.asarray(p + updates).round(3))  # the step ends on the simplex
        [1. 0.]
    """

    def update(updates, state, params):
        return jax.tree.map(lambda u, p: project_simplex(p + u) - p, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
