"""pFedKD-WCL's server gradient: grad_w of the KL between the global model w
and a client's fixed personal model theta_i, over the client's whole train set.

Two directions (docs/methods/conventions.md, pFedKD-WCL):
- ``teacher_first`` (default; the authors' code, ``F.kl_div(log p_theta, p_w)``):
  KL(p_w || p_theta), the same direction as the client's distillation term;
- ``student_first`` (the paper's text): KL(p_theta || p_w).
Both carry the T^2 factor of `batch_losses.kd_kl` and average over real samples.

The server step combines the selected clients' gradients as sum_i a_i g_i
(`gradient_weights`, `combine_gradients`), three ways:
- ``sample_size`` (default): a_i = n_i / sum_j n_j, the n_i-weighted mean that
  the authors' ``aggregate`` writes;
- ``uniform`` (the paper's text, Algorithm 1): a_i = 1 / S;
- ``last_client`` (the step the authors' code takes): their
  ``compute_kl_gradients`` calls ``global_model.zero_grad()`` for every
  client, which clears what ``aggregate`` had added for the clients before, and
  its ``backward`` leaves g_i in the buffer that ``aggregate`` then adds
  (n_i / sum_j n_j) g_i to, so the optimizer steps on
  (1 + n_last / sum_j n_j) g_last of the last client sampled alone.

Pure, jit-able functions of arrays and parameter pytrees; no method logic, no
engine. The method (methods/pfedkd.py) takes one SGD step on the combination.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import batch_losses

DIRECTIONS = ("teacher_first", "student_first")
GRADIENT_WEIGHTS = ("sample_size", "uniform", "last_client")


def gradient_weights(num_samples, uploaded, rule: str = "sample_size"):
    """a [S]: the server step's weights on the selected clients' gradients, in selection order (module
    docstring). Clients whose upload did not arrive get 0; all 0 when none arrived.

    Examples:
        >>> n, arrived = jnp.array([100.0, 300.0, 100.0]), jnp.array([True, True, True])
        >>> for rule in GRADIENT_WEIGHTS:
        ...     print(rule, [round(float(a), 4) for a in gradient_weights(n, arrived, rule)])
        sample_size [0.2, 0.6, 0.2]
        uniform [0.3333, 0.3333, 0.3333]
        last_client [0.0, 0.0, 1.2]
        >>> gradient_weights(n, jnp.array([True, True, False]), "last_client").tolist()  # the last that arrived
        [0.0, 1.75, 0.0]
    """
    arrived = jnp.asarray(uploaded, bool)
    n = jnp.where(arrived, jnp.asarray(num_samples, jnp.float32), 0.0)
    share = n / jnp.maximum(jnp.sum(n), 1e-30)
    if rule == "sample_size":
        return share
    if rule == "uniform":
        count = arrived.astype(jnp.float32)
        return count / jnp.maximum(jnp.sum(count), 1.0)
    if rule == "last_client":
        s = arrived.shape[0]
        last = s - 1 - jnp.argmax(arrived[::-1])
        return jnp.where((jnp.arange(s) == last) & arrived, 1.0 + share, 0.0)
    raise ValueError(f"rule must be one of {GRADIENT_WEIGHTS}, got {rule!r}")


def combine_gradients(stacked, weights):
    """sum_i a_i g_i over the leading axis of every leaf of ``stacked`` [S, ...]; ``weights`` a [S].

    Examples:
        >>> combine_gradients({"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])}, jnp.array([0.0, 1.5]))["w"].tolist()
        [4.5, 6.0]
    """
    a = jnp.asarray(weights, jnp.float32)
    return jax.tree.map(lambda g: jnp.tensordot(a, g.astype(jnp.float32), axes=1).astype(g.dtype), stacked)


def server_kl(global_logits, personal_logits, temperature: float = 1.0, direction: str = "teacher_first", mask=None):
    """T^2 * mean over real samples of the KL between p_w and p_theta (theta held fixed).

    global_logits, personal_logits [B, C]; ``direction`` as in the module docstring.

    Examples:
        >>> global_logits, personal_logits = jnp.array([[2.0, 0.0]]), jnp.array([[0.0, 0.0]])
        >>> round(float(server_kl(global_logits, personal_logits)), 4)  # KL(p_w || p_theta)
        0.3278
        >>> round(float(server_kl(global_logits, personal_logits, direction="student_first")), 4)  # KL(p_theta || p_w)
        0.4338
    """
    personal_logits = jax.lax.stop_gradient(personal_logits)
    if direction == "teacher_first":
        return batch_losses.kd_kl(global_logits, personal_logits, temperature, mask)
    if direction == "student_first":
        return batch_losses.kd_kl(personal_logits, global_logits, temperature, mask)
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def server_kl_gradient(global_logits_fn: Callable, global_params, personal_logits, temperature: float = 1.0,
                       direction: str = "teacher_first", mask=None):
    """grad_w of `server_kl` on one batch: ``global_logits_fn(params) -> logits [B, C]``.

    Examples:
        >>> import numpy as np
        >>> def global_logits_fn(params):  # a global model whose logits are its parameters
        ...     return params[None, :]
        >>> grad = server_kl_gradient(global_logits_fn, jnp.array([2.0, 0.0]), jnp.array([[0.0, 0.0]]))
        >>> print(np.asarray(grad).round(4))  # pushes p_w toward the personal model's uniform output
        [ 0.21 -0.21]
    """
    return jax.grad(lambda p: server_kl(global_logits_fn(p), personal_logits, temperature, direction, mask))(
        global_params)


def client_server_gradient(global_logits_fn: Callable, global_params, personal_logits_fn: Callable, x, n, *,
                           temperature: float = 1.0, direction: str = "teacher_first", chunk_size: int = 1024):
    """g_i = grad_w of `server_kl` over a client's whole (padded) train set.

    ``x`` [n_max, ...] holds the client's samples in rows 0..n-1 (padding after);
    ``global_logits_fn(params, x_chunk)`` and ``personal_logits_fn(x_chunk)``
    return logits [chunk, C] (normalise inside). The set is processed in chunks
    of ``chunk_size`` rows (bounded memory) and the gradient is that of the mean
    over all n real samples, exactly as one full-batch pass. n = 0 gives zeros.
    Returns (mean KL, gradient pytree like ``global_params``).

    Examples:
        >>> import numpy as np
        >>> def global_logits_fn(params, x):  # a linear global model
        ...     return x @ params
        >>> def personal_logits_fn(x):  # the client's fixed personal model
        ...     return jnp.zeros((x.shape[0], 2))
        >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])  # 2 real samples, one padding row
        >>> value, grad = client_server_gradient(global_logits_fn, jnp.eye(2), personal_logits_fn, x, 2, chunk_size=2)
        >>> round(float(value), 4)  # mean KL over the 2 real samples
        0.1109
        >>> print(np.asarray(grad).round(4))
        [[ 0.0983 -0.0983]
         [-0.0983  0.0983]]
    """
    n_max = x.shape[0]
    chunk = max(1, min(chunk_size, n_max))
    num = math.ceil(n_max / chunk)
    pad = num * chunk - n_max
    xs = jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)).reshape((num, chunk) + x.shape[1:])
    masks = (jnp.arange(num * chunk) < n).reshape(num, chunk)

    def chunk_sum(params, xc, mc):
        count = jnp.sum(mc.astype(jnp.float32))
        target = personal_logits_fn(xc)
        return server_kl(global_logits_fn(params, xc), target, temperature, direction, mc) * count

    def body(t, carry):
        value_sum, grad_sum = carry
        value, grad = jax.value_and_grad(chunk_sum)(global_params, xs[t], masks[t])
        return value_sum + value, tree_ops.add(grad_sum, grad)

    zeros = jax.tree.map(jnp.zeros_like, global_params)
    real_chunks = (jnp.asarray(n, jnp.int32) + chunk - 1) // chunk  # padding-only chunks are skipped
    value_sum, grad_sum = jax.lax.fori_loop(0, real_chunks, body, (jnp.zeros((), jnp.float32), zeros))
    scale = 1.0 / jnp.maximum(jnp.asarray(n, jnp.float32), 1.0)
    return value_sum * scale, tree_ops.scale(grad_sum, scale)
