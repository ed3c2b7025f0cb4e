"""pFedHN (methods/pfedhn.py, hypernetwork.py): the hypernetwork update against the
finite-difference directional derivative of the paper's objective (float64), the
server step, the engine against a per-client loop, learning on FMNIST."""

import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import majority_baseline
import pfl_reference as ref
from engine_rows import run_rows
from forced_devices import cpu_devices_env
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import hypernetwork as hn
from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.base import ServerRound
from fedjax_pfl.methods import pfedhn
from fedjax_pfl.methods.pfedhn import PFEDHN, PFedHNConfig
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup


def _setup(lr=0.1):
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    return local_setup(model=model, optimizer=optax.sgd, lr=lr, batch_size=ref.B, local_epochs=1,
                       normalize=ref.normalize)


def _dot(a, b):
    return sum(float(jnp.vdot(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_update_equals_finite_difference_of_the_objective():
    """<vjp of Delta theta, d> = d/de sum_i w_i 1/2 ||h(phi + e d; v_i) - theta~_i||^2 at e = 0 (float64)."""
    with jax.enable_x64(True):
        target = {"w": jax.ShapeDtypeStruct((3, 2), jnp.float64), "b": jax.ShapeDtypeStruct((2,), jnp.float64)}
        init = jax.jit(lambda k: hn.init_hypernetwork(k, 4, target, embed_dim=3, hidden=5, n_hidden=2))
        phi = jax.tree.map(lambda a: a.astype(jnp.float64), init(jax.random.key(0)))
        rng = np.random.default_rng(0)
        indices = jnp.array([2, 0])
        deltas = {"w": jnp.asarray(rng.normal(size=(2, 3, 2))), "b": jnp.asarray(rng.normal(size=(2, 2)))}
        weights = jnp.array([0.7, 0.3])
        trained = jax.jit(lambda p: tree_ops.sub(hn.generate_many(p, indices, target), deltas))(phi)  # theta - Delta
        direction = jax.tree.map(lambda a: rng.normal(size=a.shape), phi)

        @jax.jit
        def check(p, d):
            grad = hn.hypernetwork_gradient(p, indices, deltas, weights, target)
            f = lambda q: hn.surrogate_objective(q, indices, trained, weights, target)
            eps = 1e-6
            fd = (f(tree_ops.add(p, tree_ops.scale(d, eps))) - f(tree_ops.sub(p, tree_ops.scale(d, eps)))) / (2 * eps)
            return grad, sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(d))), fd

        grad, directional, fd = check(phi, direction)
        assert float(directional) == pytest.approx(float(fd), rel=1e-7)
        # the embeddings of clients not in the round get no gradient
        np.testing.assert_array_equal(grad["embeddings"][np.array([1, 3])], 0.0)
        assert float(jnp.abs(grad["embeddings"][2]).max()) > 0


def test_server_step_is_clipped_sgd_on_the_vjp_and_generates_the_client_model():
    method = PFEDHN(_setup(), PFedHNConfig(server_lr=0.5, server_momentum=0.0, server_wd=0.0, hidden=6,
                                           n_hidden=1))
    server, clients = method.init(jax.random.key(0), 5)
    selected = jnp.array([3, 1])
    target = pfedhn.target(method)

    @jax.jit
    def step_and_gradient(server, deltas, arrived):
        info = ServerRound(jnp.int32(0), selected, jnp.ones(2), arrived)
        new, _ = method.server_update(server, tree_ops.gather(clients, selected), {"delta": deltas}, info)
        mean = arrived.astype(jnp.float32) / jnp.maximum(arrived.sum(), 1)  # aggregate=mean (default)
        return new, hn.hypernetwork_gradient(server["hnet"], selected, deltas, mean, target)

    for scale, arrived in [(1e-3, [True, True]), (1e3, [True, True]), (1e-3, [False, True])]:
        deltas = jax.tree.map(lambda a: scale * jnp.ones((2,) + a.shape, a.dtype), target)
        new, g = step_and_gradient(server, deltas, jnp.array(arrived))
        norm = math.sqrt(_dot(g, g))
        step = tree_ops.scale(g, 0.5 * min(1.0, 50.0 / norm))
        ref.assert_close(new["hnet"], tree_ops.sub(server["hnet"], step), tol=1e-5)
    new, _ = step_and_gradient(server, deltas, jnp.array([False, False]))
    ref.assert_close(new, server, tol=0)  # nothing arrived: no step

    # the evaluated model is h(phi; v_i), shaped like the client model, different per client
    assert server["hnet"]["embeddings"].shape == (5, 2)  # 1 + N/4
    v = method.eval_variables(server, tree_ops.gather(clients, 2), None, None)
    like = method.model.init(jax.random.key(1))
    assert jax.tree.structure(v) == jax.tree.structure(like)
    for a, b in zip(jax.tree.leaves(v), jax.tree.leaves(like)):
        assert a.shape == b.shape
    # PyTorch's default inits (the authors' code): U(+-1/sqrt(fan_in)) for Linear, N(0, 1) embeddings
    phi = server["hnet"]
    assert float(jnp.abs(phi["mlp"][0]["w"]).max()) <= 1 / math.sqrt(2) + 1e-6
    assert float(jnp.abs(phi["mlp"][0]["w"]).max()) > 1 / math.sqrt(6)
    assert all(float(jnp.abs(h).max()) <= 1 / math.sqrt(6) + 1e-6 for h in jax.tree.leaves(phi["heads"]))
    other = method.eval_variables(server, tree_ops.gather(clients, 3), None, None)
    assert not np.allclose(jax.tree.leaves(v)[0], jax.tree.leaves(other)[0])


@pytest.mark.parametrize("options", [{"local_steps": 0}, {"server_lr": 0.0}, {"embed_dim": 0},
                                     {"n_hidden": -1}, {"aggregate": "median"}, {"server_wd": -1.0}])
def test_bad_options_raise_user_error(options):
    with pytest.raises(UserError):
        config_lib.method_options(PFedHNConfig, options)


# ------------------------------------------------------- engine = per-client loop
def _ce(params, xb, yb, *, model):
    return losses.cross_entropy(model.apply({"params": params}, xb).logits, yb)


def _server_step(phi, trace, grad, hp):
    """The authors' hypernetwork step: clip the norm at 50, weight decay, SGD with momentum."""
    grad = tree_ops.scale(grad, min(1.0, 50.0 / math.sqrt(_dot(grad, grad))))
    grad = tree_ops.add(grad, tree_ops.scale(phi, hp.server_wd))
    trace = tree_ops.add(grad, tree_ops.scale(trace, hp.server_momentum))
    return tree_ops.sub(phi, tree_ops.scale(trace, hp.server_lr)), trace


def _reference(method, rounds, key):
    """phi after ``rounds`` rounds as a per-client loop: a server step after each client (sequential,
    the authors' trainer.py) or one per round on the summed / averaged products (sum, mean)."""
    import functools
    hp, target = method.hparams, pfedhn.target(method)
    xs, ys = ref.client_arrays(method.model.input_shape)
    init_key, key = jax.random.split(key)
    phi = hn.init_hypernetwork(init_key, len(ref.SIZES), target, 2, hp.hidden, hp.n_hidden)
    trace = jax.tree.map(jnp.zeros_like, phi)
    ce = functools.partial(_ce, model=method.model)
    inner = optax.chain(optax.clip_by_global_norm(50.0), optax.sgd(0.1))
    generate = jax.jit(lambda p, c: hn.generate(p, c, target))
    pullback = jax.jit(lambda p, c, delta: jax.vjp(lambda q: hn.generate(q, c, target), p)[1](delta)[0])
    for t in range(rounds):
        selected, keys = ref.round_keys(key, t)
        grads = []
        for j, c in enumerate(selected):
            theta = generate(phi, c)
            trained = ref.train_random_batches(ce, inner, theta, xs[c], ys[c], keys[j], hp.local_steps)
            grads.append(pullback(phi, c, tree_ops.sub(theta, trained)))
            if hp.aggregate == "sequential":  # the next client trains the model of the stepped phi
                phi, trace = _server_step(phi, trace, grads.pop(), hp)
        if grads:
            grad = functools.reduce(tree_ops.add, grads)
            grad = tree_ops.scale(grad, 1.0 / len(selected)) if hp.aggregate == "mean" else grad
            phi, trace = _server_step(phi, trace, grad, hp)
    return phi


def _engine(method, clients_per_round=ref.S, mapping="vmap"):
    xs, ys = ref.client_arrays(method.model.input_shape)
    data = ref.stacked(xs, ys)
    return engine_lib.Engine(method, data, data, engine_config(clients_per_round, client_mapping=mapping))


def _method(aggregate, local_steps=3):
    return PFEDHN(_setup(), PFedHNConfig(local_steps=local_steps, hidden=6, n_hidden=1, aggregate=aggregate))


@pytest.mark.parametrize("aggregate, mapping, fused", [("sequential", "chunked", True), ("mean", "vmap", False),
                                                       ("sum", "map", False)])
def test_engine_equals_per_client_loop(aggregate, mapping, fused):
    """Each aggregate (sequential: the default) equals its per-client loop, under any client mapping
    (sequential ignores it: no sorting of clients by cost) and in fused rounds."""
    method = _method(aggregate)
    assert method.schedule.server_steps_per_client == (aggregate == "sequential")
    key = jax.random.key(6)
    ref_phi = _reference(method, 2, key)
    eng = _engine(method, mapping=mapping)
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    before = jax.tree.map(np.asarray, server["hnet"])
    if fused:
        server, clients, metrics, _ = eng.run_rounds(server, clients, key, 0, 2, 2, 2)
        assert np.all(metrics["executed_steps"] == metrics["real_steps"])  # one client at a time: no padding
    else:
        server, clients, _ = eng.run(server, clients, key, 2)
    ref.assert_close(server["hnet"], ref_phi, tol=2e-5)
    assert not np.allclose(before["embeddings"], server["hnet"]["embeddings"])


def test_sequential_is_s_server_steps_not_one():
    """With S = 1 the three aggregates take the same step; with S = 3 per round the default
    (sequential) differs from one averaged step (the old default) by far more than rounding."""
    key = jax.random.key(3)

    def phi_after_a_round(aggregate, clients_per_round):
        eng = _engine(_method(aggregate, local_steps=2), clients_per_round)
        server, clients = eng.init(key)
        return eng.run(server, clients, key, 1)[0]["hnet"]

    single = phi_after_a_round("sequential", 1)
    for aggregate in ("mean", "sum"):
        ref.assert_close(phi_after_a_round(aggregate, 1), single, tol=1e-6)
    sequential, mean = phi_after_a_round("sequential", 3), phi_after_a_round("mean", 3)
    gap = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(sequential), jax.tree.leaves(mean)))
    assert gap > 1e-3, gap


def test_sequential_as_federations_equals_single_runs():
    """Two seeds as federations of one program (engine/rows.py: each visits its clients in turn, side by side)
    give each seed's run_rounds numbers."""
    eng = _engine(_method("sequential", local_steps=2))
    keys = jax.random.split(jax.random.key(1), 4).reshape(2, 2)
    pool, servers, rows, metrics, evals = run_rows(eng, keys[:, 0], keys[:, 1], 2, 2)
    for e in range(2):
        server, clients = eng.init(keys[e, 0])
        server, clients, lone, single = eng.run_rounds(server, clients, keys[e, 1], 0, 2, 2, 2)
        ref.assert_close(pool.state(servers, rows, e), (server, clients), tol=2e-5)
        np.testing.assert_array_equal(metrics[e]["selected"], lone["selected"])
        ref.assert_close(evals[e][1], single[1], tol=2e-5)


MULTI_DEVICE = textwrap.dedent("""
    import jax, numpy as np, sys
    sys.path.insert(0, "tests")
    import test_pfedhn as t, pfl_reference as ref, settings_records as records
    from fedjax_pfl.engine import engine as engine_lib
    assert jax.device_count() == 2, jax.devices()
    xs, ys = ref.client_arrays(t._setup().model.input_shape)
    data = ref.stacked(xs, ys)
    out = []
    for shard in (False, True):  # 5 clients: padded to 6 rows on 2 devices
        eng = engine_lib.Engine(t._method("sequential", 2), data, data, records.engine_config(ref.S, shard=shard))
        assert (eng.mesh is not None) == shard
        server, clients = eng.init(jax.random.key(0))
        server, clients, _, evals = eng.run_rounds(server, clients, jax.random.key(1), 0, 2, 2, 1)
        out.append(jax.device_get((server["hnet"], evals)))
    ref.assert_close(out[1], out[0], tol=2e-5)
    print("SHARDED_OK")
""")


def test_sequential_on_two_devices_equals_one_device():
    proc = subprocess.run([sys.executable, "-c", MULTI_DEVICE], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **cpu_devices_env(2)})
    assert proc.returncode == 0 and "SHARDED_OK" in proc.stdout, proc.stderr[-3000:]


# ------------------------------------------------------------------ learning
def test_pfedhn_learns_on_fmnist(data_dir):
    """The default (a hypernetwork step after each client): 6 clients, 4 rounds (24 server steps)."""
    options = ("method.local_steps=20", "method.server_lr=0.03", "train.lr=0.001")
    eng = ref.fmnist_engine(data_dir, "pfedhn", options)
    first, last, metrics, server, _ = ref.run_engine(eng, 4)
    baseline = majority_baseline.from_engine(eng)
    assert math.isfinite(float(metrics["train_loss"]))
    assert first < 0.4 and last["accuracy"] > baseline + 0.1, (first, last, baseline)
