"""Pure operations on pytrees of parameters, single or stacked over clients.

Variables follow the model contract (models.py): ``{'params': {'body', 'head'}}``
and, for BatchNorm models, ``{'batch_stats': {'body'}}``. A *stacked* tree has
a leading client axis on every leaf. Nothing here knows about methods.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PARTS = ("all", "body", "head")


def gather(tree, index):
    """Rows ``index`` [S] of every leaf of a stacked tree."""
    return jax.tree.map(lambda a: a[index], tree)


def scatter(tree, index, rows):
    """Write ``rows`` (stacked over S) into rows ``index`` of a stacked tree."""
    return jax.tree.map(lambda a, r: a.at[index].set(r), tree, rows)


def broadcast(tree, n: int):
    """Stack ``n`` copies of a tree along a new leading axis."""
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + jnp.shape(a)), tree)


def select(cond, on_true, on_false):
    """Leafwise ``where`` with a scalar condition."""
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), on_true, on_false)


def add(a, b):
    return jax.tree.map(jnp.add, a, b)


def sub(a, b):
    return jax.tree.map(jnp.subtract, a, b)


def scale(tree, s):
    return jax.tree.map(lambda a: a * s, tree)


def interpolate(a, b, weight_a):
    """``weight_a * a + (1 - weight_a) * b`` leafwise (APFL's mixed model)."""
    return jax.tree.map(lambda x, y: weight_a * x + (1.0 - weight_a) * y, a, b)


def squared_norm(tree):
    """Sum of squares over all leaves (a scalar)."""
    return sum(jnp.vdot(a, a).real for a in jax.tree.leaves(tree))


def flatten_stacked(tree):
    """Stacked tree [N, ...] -> matrix [N, P] (leaves raveled and concatenated)."""
    leaves = jax.tree.leaves(tree)
    n = leaves[0].shape[0]
    return jnp.concatenate([a.reshape(n, -1) for a in leaves], axis=1)


def unflatten_stacked(matrix, like):
    """Inverse of `flatten_stacked` given a stacked tree of the same structure."""
    leaves, treedef = jax.tree.flatten(like)
    n = matrix.shape[0]
    out, start = [], 0
    for a in leaves:
        size = a[0].size
        out.append(matrix[:, start:start + size].reshape(a.shape).astype(a.dtype))
        start += size
    return jax.tree.unflatten(treedef, out)


def part_of(variables, part: str):
    """The 'body', 'head' or 'all' part of a variables dict (BN stats follow the body)."""
    if part == "all":
        return variables
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    return {coll: tree[part] for coll, tree in variables.items() if part in tree}


def with_part(variables, part: str, values):
    """``variables`` with its ``part`` replaced by ``values`` (as from `part_of`)."""
    if part == "all":
        return values
    out = {coll: dict(tree) for coll, tree in variables.items()}
    for coll, sub_tree in values.items():
        out[coll][part] = sub_tree
    return out


def trainable_of(variables, part: str):
    """The trainable parameters of ``part`` (never the BatchNorm statistics)."""
    params = variables["params"]
    return params if part == "all" else params[part]


def with_trainable(variables, part: str, params):
    out = dict(variables)
    if part == "all":
        out["params"] = params
    else:
        out["params"] = {**variables["params"], part: params}
    return out
