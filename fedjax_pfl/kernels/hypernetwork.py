"""pFedHN's hypernetwork (Shamsian et al., ICML 2021): client embedding -> model weights.

h(phi; v_i): the embedding v_i of client i goes through an MLP (Linear, then
``n_hidden`` x [ReLU, Linear], width ``hidden``) and one Linear head per
target parameter leaf, reshaped to that leaf (the authors' ``CNNHyper``,
written for any target model). ``phi = {'embeddings' [N, e], 'mlp', 'heads'}``.
Initialization as PyTorch's defaults in the authors' code: embeddings N(0, 1),
Linear weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

The server's update direction is the vector-Jacobian product of the clients'
changes Delta theta_i = theta_i - theta~_i through h (`hypernetwork_gradient`):
sum_i w_i (d theta_i / d phi)^T Delta theta_i, the gradient at phi of the
paper's surrogate objective sum_i w_i (1/2) ||h(phi; v_i) - stop(theta~_i)||^2
(`surrogate_objective`). Pure, jit-able.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp


def _linear(fan_in: int, fan_out: int):
    """(shape, fan_in) of a Linear layer's weight and bias."""
    return {"w": ((fan_in, fan_out), fan_in), "b": ((fan_out,), fan_in)}


def init_hypernetwork(key, num_clients: int, target, embed_dim: int, hidden: int = 100, n_hidden: int = 3):
    """phi for a target parameter tree ``target`` (arrays or ShapeDtypeStructs).

    Examples:
        >>> target = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}  # the client model's parameters
        >>> phi = init_hypernetwork(jax.random.PRNGKey(0), num_clients=4, target=target, embed_dim=5, hidden=8, n_hidden=1)
        >>> phi["embeddings"].shape, [layer["w"].shape for layer in phi["mlp"]], phi["heads"]["w"]["w"].shape
        ((4, 5), [(5, 8), (8, 8)], (8, 6))
    """
    widths = [embed_dim] + [hidden] * (n_hidden + 1)
    layout = {"mlp": [_linear(a, b) for a, b in zip(widths[:-1], widths[1:])],
              "heads": jax.tree.map(lambda a: _linear(hidden, math.prod(a.shape)), target)}
    is_entry = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], int)
    entries, treedef = jax.tree.flatten(layout, is_leaf=is_entry)
    sizes = [math.prod(shape) for shape, _ in entries]
    # one uniform draw for every Linear (one random kernel to compile, not one per leaf),
    # scaled per leaf to U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    k_embed, k_linear = jax.random.split(key)
    flat = jax.random.uniform(k_linear, (sum(sizes),), jnp.float32, -1.0, 1.0)
    offsets = itertools.accumulate(sizes, initial=0)
    params = [flat[o:o + n].reshape(shape) / math.sqrt(fan_in)
              for o, n, (shape, fan_in) in zip(offsets, sizes, entries)]
    phi = jax.tree.unflatten(treedef, params)
    phi["embeddings"] = jax.random.normal(k_embed, (num_clients, embed_dim), jnp.float32)
    return phi


def generate(phi, index, target):
    """theta_i = h(phi; v_index): a parameter tree shaped like ``target``.

    Examples:
        >>> target = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
        >>> phi = init_hypernetwork(jax.random.PRNGKey(0), 4, target, embed_dim=5, hidden=8, n_hidden=1)
        >>> theta = generate(phi, 2, target)  # client 2's model
        >>> jax.tree.map(jnp.shape, theta)
        {'b': (2,), 'w': (3, 2)}
    """
    x = phi["embeddings"][index]
    for i, layer in enumerate(phi["mlp"]):
        if i > 0:
            x = jax.nn.relu(x)
        x = x @ layer["w"] + layer["b"]
    leaves, treedef = jax.tree.flatten(target)
    heads = treedef.flatten_up_to(phi["heads"])
    return jax.tree.unflatten(treedef, [(x @ h["w"] + h["b"]).reshape(a.shape).astype(a.dtype)
                                        for h, a in zip(heads, leaves)])


def generate_many(phi, indices, target):
    """Stacked theta for ``indices`` [S]: leaves [S, ...].

    Examples:
        >>> target = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
        >>> phi = init_hypernetwork(jax.random.PRNGKey(0), 4, target, embed_dim=5, hidden=8, n_hidden=1)
        >>> jax.tree.map(jnp.shape, generate_many(phi, jnp.array([0, 3]), target))
        {'b': (2, 2), 'w': (2, 3, 2)}
    """
    return jax.vmap(lambda i: generate(phi, i, target))(indices)


def hypernetwork_gradient(phi, indices, deltas, weights, target):
    """sum_s w_s (d theta_s / d phi)^T Delta theta_s by one `jax.vjp` of `generate_many`.

    deltas: stacked tree [S, ...] of theta_s - theta~_s; weights [S].

    Examples:
        >>> target = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
        >>> phi = init_hypernetwork(jax.random.PRNGKey(0), 4, target, embed_dim=5, hidden=8, n_hidden=1)
        >>> indices, weights = jnp.array([0, 3]), jnp.array([0.5, 0.5])
        >>> trained = jax.tree.map(lambda a: a + 0.1, generate_many(phi, indices, target))  # theta~ after local steps
        >>> deltas = jax.tree.map(jnp.subtract, generate_many(phi, indices, target), trained)
        >>> grad = hypernetwork_gradient(phi, indices, deltas, weights, target)
        >>> reference = jax.grad(surrogate_objective)(phi, indices, trained, weights, target)
        >>> bool(jax.tree.all(jax.tree.map(lambda a, b: jnp.allclose(a, b, atol=1e-6), grad, reference)))
        True
    """
    _, pullback = jax.vjp(lambda p: generate_many(p, indices, target), phi)
    w = jnp.asarray(weights)
    cotangent = jax.tree.map(lambda d: d * w.reshape((-1,) + (1,) * (d.ndim - 1)).astype(d.dtype), deltas)
    return pullback(cotangent)[0]


def surrogate_objective(phi, indices, trained, weights, target):
    """sum_s w_s (1/2) ||h(phi; v_s) - theta~_s||^2 (theta~ fixed): its gradient is the server's direction.

    Examples:
        >>> target = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
        >>> phi = init_hypernetwork(jax.random.PRNGKey(0), 4, target, embed_dim=5, hidden=8, n_hidden=1)
        >>> indices = jnp.array([0, 3])
        >>> trained = jax.tree.map(lambda a: a + 0.1, generate_many(phi, indices, target))
        >>> round(float(surrogate_objective(phi, indices, trained, jnp.array([0.5, 0.5]), target)), 4)  # 0.5 * 8 * 0.01
        0.04
    """
    generated = generate_many(phi, indices, target)
    trained = jax.lax.stop_gradient(trained)
    per_client = sum(jnp.sum(jnp.square(g - t).reshape(g.shape[0], -1), axis=1)
                     for g, t in zip(jax.tree.leaves(generated), jax.tree.leaves(trained)))
    return 0.5 * jnp.sum(jnp.asarray(weights) * per_client)
