"""FedALA's kernel (Zhang et al., AAAI 2023): adaptive local aggregation of a local and a global model.

The top layers of a model become l + (g - l) * W element-wise (`mix`), W in
[0, 1] learned by projected SGD (`optim.projected_sgd`) on a random
contiguous slice of the client's data (`random_slice`); the layers are
addressed by their module paths in the parameter tree (`layer_paths`,
`top_of`, `with_top`). Pure, jit-able; nothing here knows about methods.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import traverse_util

from fedjax_pfl.data.client_data import ClientData


def layer_paths(params) -> list[tuple]:
    """Paths of the modules that hold parameter arrays, in the dict's (creation) order.

    Examples:
        >>> params = {"conv": {"kernel": jnp.ones((3, 3)), "bias": jnp.zeros(3)}, "head": {"kernel": jnp.ones((3, 2))}}
        >>> layer_paths(params)
        [('conv',), ('head',)]
    """
    paths = []
    for path in traverse_util.flatten_dict(params):
        if path[:-1] not in paths:
            paths.append(path[:-1])
    return paths


def top_of(params, modules) -> dict:
    """{'a/b/kernel': array} of the parameters inside ``modules``.

    Examples:
        >>> params = {"body": {"kernel": jnp.ones(2)}, "head": {"kernel": jnp.zeros(2), "bias": jnp.zeros(1)}}
        >>> sorted(top_of(params, [("head",)]))
        ['head/bias', 'head/kernel']
    """
    flat = traverse_util.flatten_dict(params)
    return {"/".join(p): a for p, a in flat.items() if p[:-1] in modules}


def with_top(params, top: dict):
    """``params`` with the arrays of ``top`` ({'a/b/kernel': array}, as `top_of` gives) put in place.

    Examples:
        >>> params = {"body": {"kernel": jnp.ones(2)}, "head": {"bias": jnp.zeros(1)}}
        >>> new = with_top(params, {"head/bias": jnp.array([5.0])})
        >>> new["head"]["bias"].tolist(), new["body"]["kernel"].tolist()
        ([5.0], [1.0, 1.0])
    """
    flat = traverse_util.flatten_dict(params)
    flat.update({tuple(k.split("/")): v for k, v in top.items()})
    return traverse_util.unflatten_dict(flat)


def mix(local, global_, weights):
    """l + (g - l) * W, leafwise.

    Examples:
        >>> local, global_ = {"w": jnp.array([0.0, 0.0])}, {"w": jnp.array([2.0, 4.0])}
        >>> mix(local, global_, {"w": jnp.array([0.5, 1.0])})["w"].tolist()
        [1.0, 4.0]
    """
    return jax.tree.map(lambda l, g, w: l + (g - l) * w, local, global_, weights)


def random_slice(data: ClientData, key, fraction: float) -> ClientData:
    """int(fraction * n) consecutive samples from a random start, moved to the front.

    Examples:
        >>> data = ClientData(jnp.arange(10.0)[:, None], jnp.arange(10), jnp.asarray(8))  # 8 real of 10 rows
        >>> part = random_slice(data, jax.random.PRNGKey(0), 0.5)
        >>> n = int(part.n)
        >>> n, bool(jnp.all(jnp.diff(part.y[:n]) == 1))  # 4 consecutive samples, moved to the front
        (4, True)
    """
    n_max = data.y.shape[0]
    size = (fraction * data.n).astype(jnp.int32)
    start = jax.random.randint(key, (), 0, data.n - size + 1)
    index = jnp.minimum(start + jnp.arange(n_max), n_max - 1)
    return ClientData(data.x[index], data.y[index], size)
