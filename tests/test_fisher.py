"""Fisher traces from the per-batch terms of fedjax_pfl.kernels.fisher against float64 references, with padding
(the terms summed over a client's batches by tests/fisher_traces.py).

References: (1) a Python loop in float64 over the real samples / the real part
of every batch, each gradient taken separately with jax.grad on float64
parameters and a float64 NLL written here; (2) for a linear softmax model, the
closed-form gradients in NumPy float64 (no autodiff at all).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.kernels import fisher
from fisher_traces import TRACES, as_batches, trace_batch, trace_per_sample
from fedjax_pfl.models.networks import build_model

B = 8
N_REAL = 21  # 3 batches: 8, 8, 5 real samples
N_MAX = 32  # + one batch that is all padding


def _problem(name, seed=0):
    if name == "mlp":
        model = build_model("mlp", (6, 6, 1), 4, hidden=(16,))
    elif name == "lenet":
        model = build_model("lenet", (16, 16, 1), 4, conv_impl="im2col")
    else:
        model = build_model("mlr", (5,), 3)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_MAX,) + model.input_shape).astype(np.float32)
    y = rng.integers(0, model.num_classes, N_MAX).astype(np.int32)
    # Padding rows hold garbage (not zeros): the traces must ignore them.
    x[N_REAL:] *= 50.0
    x, y = jnp.asarray(x), jnp.asarray(y)
    variables = jax.jit(model.init)(jax.random.key(seed))
    # Move away from the init so gradients are not special.
    variables = {**variables, "params": jax.tree.map(lambda a: a * 1.5, variables["params"])}
    return model, variables, x, y


def _logits_fn(model, variables):
    return lambda p, x: model.apply({**variables, "params": p}, x, train=False).logits


def _f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _reference(model, variables, x, y):
    """(batch-form trace, per-sample trace) by loops in float64."""
    with jax.enable_x64(True):
        params = jax.tree.map(jnp.asarray, _f64(variables["params"]))
        xs = jnp.asarray(np.asarray(x, np.float64))

        def nll(p, xb, yb):
            logits = model.apply({**variables, "params": p}, xb, train=False).logits
            assert logits.dtype == jnp.float64
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(logp[jnp.arange(yb.shape[0]), yb])

        grad = jax.jit(jax.grad(nll))

        def sq(g):
            return sum(float(np.sum(np.asarray(a, np.float64) ** 2)) for a in jax.tree.leaves(g))

        per_sample = [sq(grad(params, xs[i:i + 1], y[i:i + 1])) for i in range(N_REAL)]
        batch = 0.0
        for start in range(0, N_REAL, B):
            stop = min(start + B, N_REAL)
            batch += sq(grad(params, xs[start:stop], y[start:stop]))
    return batch, float(np.mean(per_sample))


def _close(value, ref, tol=1e-4):
    assert abs(float(value) - ref) / abs(ref) < tol, (float(value), ref)


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_traces_match_float64_loop_reference_with_padding(name):
    model, variables, x, y = _problem(name)
    ref_batch, ref_per_sample = _reference(model, variables, x, y)
    xb, yb, mb = as_batches(x, y, N_REAL, B)
    assert xb.shape[:2] == (N_MAX // B, B) and int(mb.sum()) == N_REAL and not bool(mb[-1].any())
    logits_fn = _logits_fn(model, variables)
    got_batch = jax.jit(lambda p: trace_batch(logits_fn, p, xb, yb, mb))(variables["params"])
    got_ps = jax.jit(lambda p: trace_per_sample(logits_fn, p, xb, yb, mb))(variables["params"])
    assert got_batch.dtype == jnp.float32
    _close(got_batch, ref_batch)
    _close(got_ps, ref_per_sample)


def test_traces_match_closed_form_numpy_for_linear_softmax():
    """mlr: logits = x W + b, so grad_W NLL_i = x_i (p_i - e_yi)^T and grad_b = p_i - e_yi."""
    model, variables, x, y = _problem("mlr", seed=3)
    head = variables["params"]["head"]["logits"]
    w, b = np.asarray(head["kernel"], np.float64), np.asarray(head["bias"], np.float64)
    xn, yn = np.asarray(x, np.float64)[:N_REAL], np.asarray(y)[:N_REAL]
    z = xn @ w + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    delta = p - np.eye(3)[yn]  # [n, C]
    per_sample = (np.sum(xn ** 2, axis=1) + 1.0) * np.sum(delta ** 2, axis=1)
    batch = 0.0
    for s in range(0, N_REAL, B):
        d, xs = delta[s:s + B], xn[s:s + B]
        g_w, g_b = xs.T @ d / len(d), d.mean(axis=0)
        batch += np.sum(g_w ** 2) + np.sum(g_b ** 2)
    xb, yb, mb = as_batches(x, y, N_REAL, B)
    logits_fn = _logits_fn(model, variables)
    _close(TRACES["batch"](logits_fn, variables["params"], xb, yb, mb), batch)
    _close(TRACES["per_sample"](logits_fn, variables["params"], xb, yb, mb), per_sample.mean())
    norms = fisher.per_sample_gradient_sq_norms(logits_fn, variables["params"], xb[0], yb[0])
    np.testing.assert_allclose(np.asarray(norms), per_sample[:B], rtol=1e-4)


def test_empty_batches_and_empty_client_give_zero_not_nan():
    model, variables, x, y = _problem("mlp")
    logits_fn = _logits_fn(model, variables)
    xb, yb, mb = as_batches(x, y, 0, B)
    assert float(trace_batch(logits_fn, variables["params"], xb, yb, mb)) == 0.0
    assert float(trace_per_sample(logits_fn, variables["params"], xb, yb, mb)) == 0.0


def test_bad_form_is_rejected():
    """The form is a FedAS option declared with the kernels' FORMS: another name is refused when the options are
    built, naming the allowed ones."""
    from fedjax_pfl.core.errors import UserError
    from fedjax_pfl.methods.fedas import FedASConfig

    assert set(TRACES) == set(fisher.FORMS)
    with pytest.raises(UserError, match="batch"):
        FedASConfig(fisher="diag")
