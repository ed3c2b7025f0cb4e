"""The jit-compiled round equals a plain per-client Python loop with the same keys.

The reference below shares only the documented key contract with the engine
(how the round key is split into selection, straggler and client keys, and the
per-epoch shuffling of each client's own samples); its training is an
unpadded, unmasked Python loop over real batches, and its aggregation is
float64 NumPy.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.engine import client_mapping
from fedjax_pfl.kernels import local_training
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.methods import get_method, training
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

SIZES = [7, 23, 1, 16, 12]
B, E, S = 5, 2, 3


def _data(input_shape, seed=0, sizes=SIZES):
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    x = rng.integers(0, 256, size=(total, *input_shape), dtype=np.uint8)
    y = rng.integers(0, 4, size=total).astype(np.int32)
    idx, start = [], 0
    for n in sizes:
        idx.append(np.arange(start, start + n))
        start += n
    return x, y, idx


def _normalize(x):
    return x.astype(jnp.float32) / 255.0 - 0.5


def _setup(model):
    return local_setup(model=model, optimizer=functools.partial(optax.sgd, momentum=0.9), lr=0.1, batch_size=B,
                       local_epochs=E, normalize=_normalize)


_OPT = optax.sgd(0.1, momentum=0.9)


@functools.lru_cache(maxsize=None)
def _sgd_step(model, part):
    """One jitted SGD-momentum step on ``part`` of the model, compiled once per (model, part)."""

    @jax.jit
    def step(params, opt_state, variables, xb, yb):
        def loss(p):
            v = tree_ops.with_trainable(variables, part, p)
            return losses.cross_entropy(model.apply(v, _normalize(xb), train=True).logits, yb)
        updates, opt_state = _OPT.update(jax.grad(loss)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


def _reference_client(model, variables, x, y, key, part_epochs, n_max=max(SIZES)):
    """Per-client loop over real batches. part_epochs: list of (part, epochs, max_epochs, key)."""
    n = x.shape[0]
    for part, epochs, max_epochs, k in part_epochs:
        step = _sgd_step(model, part)
        sched_key, _ = jax.random.split(k)
        epoch_keys = jax.random.split(sched_key, max_epochs)
        params = tree_ops.trainable_of(variables, part)
        opt_state = _OPT.init(params)
        for e in range(epochs):
            order = np.asarray(local_training.epoch_order(epoch_keys[e], n, n_max))[:n]
            for s in range(math.ceil(n / B)):
                b = order[s * B:(s + 1) * B]
                params, opt_state = step(params, opt_state, variables, x[b], y[b])
        variables = tree_ops.with_trainable(variables, part, params)
    return variables


def _weighted_mean64(trees, weights):
    w = np.asarray(weights, np.float64)
    w = w / w.sum()
    return jax.tree.map(lambda *a: sum(wi * np.asarray(ai, np.float64) for wi, ai in zip(w, a)), *trees)


def _assert_close(a, b, tol=1e-5):
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(la, np.float64), np.asarray(lb, np.float64), rtol=tol, atol=tol)


def _run_engine(method_name, model, mapping, rounds, key, sizes=SIZES):
    x, y, idx = _data(model.input_shape, sizes=sizes)
    train = stack_clients(x, y, idx)
    method = get_method(method_name)(_setup(model))
    eng = engine_lib.Engine(method, train, train, engine_config(S, client_mapping=mapping, chunk_size=2))
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    for t in range(rounds):
        server, clients, _ = eng.round(server, clients, engine_lib.round_keys(key, t)[0], t)
    return server, clients


def _reference(method_name, model, rounds, key, sizes=SIZES):
    x, y, idx = _data(model.input_shape, sizes=sizes)
    init_key, key = jax.random.split(key)
    v0 = model.init(init_key)
    server = v0
    personal = [v0] * len(sizes)
    for t in range(rounds):
        k_sel, _, k_clients = jax.random.split(engine_lib.round_keys(key, t)[0], 3)
        selected = np.asarray(engine_lib.select_clients(k_sel, len(sizes), S))
        keys = jax.random.split(k_clients, S)
        trained = []
        for j, c in enumerate(selected):
            if method_name == "fedavg":
                start = server
                plan = [("all", E, E, keys[j])]
            else:  # fedper / fedrep: global body, own head
                start = tree_ops.with_part(personal[c], "body", tree_ops.part_of(server, "body"))
                plan = [("all", E, E, keys[j])] if method_name == "fedper" else \
                    [("head", 1, 1, jax.random.split(keys[j])[0]), ("body", E, E, jax.random.split(keys[j])[1])]
            trained.append(_reference_client(model, start, x[idx[c]], y[idx[c]], keys[j], plan, max(sizes)))
        weights = [sizes[c] for c in selected]
        if method_name == "fedavg":
            server = _weighted_mean64(trained, weights)
        else:
            body = _weighted_mean64([tree_ops.part_of(v, "body") for v in trained], weights)
            server = tree_ops.with_part(server, "body", body)
            for j, c in enumerate(selected):
                personal[c] = trained[j]
    return server, personal


@pytest.mark.parametrize("method_name", ["fedavg", "fedper", "fedrep"])
def test_engine_equals_per_client_loop_mlp(method_name):
    """Every client mapping (packed in 2 lanes too), two rounds, ragged clients (sizes 1..23, B=5)."""
    model = build_model("mlp", (6, 6, 1), 4, hidden=(16,))
    key = jax.random.key(3)
    ref_server, ref_personal = _reference(method_name, model, 2, key)
    for mapping in ("vmap", "map", "chunked", "packed:2"):
        server, clients = _run_engine(method_name, model, mapping, 2, key)
        if method_name == "fedavg":
            _assert_close(server["variables"], ref_server)
        else:
            _assert_close(server["body"], tree_ops.part_of(ref_server, "body"))
            for c in range(len(SIZES)):
                _assert_close(tree_ops.gather(clients["variables"], c), ref_personal[c])


def test_engine_equals_per_client_loop_cnn():
    model = build_model("lenet", (16, 16, 1), 4, conv_impl="im2col")
    key = jax.random.key(5)
    ref_server, _ = _reference("fedavg", model, 1, key)
    for mapping in ("vmap", "map"):
        server, _ = _run_engine("fedavg", model, mapping, 1, key)
        _assert_close(server["variables"], ref_server, tol=2e-5)


def test_masked_steps_leave_params_unchanged():
    """A client with 0 samples, or with 0 epochs, returns its variables unchanged."""
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    setup = _setup(model)
    v = model.init(jax.random.key(0))
    x = jnp.zeros((10, 6, 6, 1), jnp.uint8)
    y = jnp.zeros((10,), jnp.int32)
    from fedjax_pfl.data.client_data import ClientData
    method = get_method("local")(setup)
    for n, epochs in [(0, E), (10, 0)]:
        out, loss = training.train(method.local, training.supervised_objective(method), v,
                                   ClientData(x, y, jnp.int32(n)), jax.random.key(1), epochs)
        _assert_close(out, v, tol=0)
        assert float(loss) == 0.0


def test_same_seed_same_numbers_different_seed_different():
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    a, _ = _run_engine("fedavg", model, "vmap", 1, jax.random.key(0))
    b, _ = _run_engine("fedavg", model, "vmap", 1, jax.random.key(0))
    c, _ = _run_engine("fedavg", model, "vmap", 1, jax.random.key(1))
    _assert_close(a, b, tol=0)
    diff = max(float(jnp.max(jnp.abs(p - q))) for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(c)))
    assert diff > 1e-4


def test_stragglers_and_dropped_uploads():
    epochs, uploaded = engine_lib.straggler_plan(jax.random.key(0), 10, 6, 0.5, 0.3)
    epochs, uploaded = np.asarray(epochs), np.asarray(uploaded)
    assert (epochs < 6).sum() == 5 and epochs.min() >= 1 and epochs.max() == 6
    assert set(epochs[epochs < 6]) <= {1, 2, 3}
    assert (~uploaded).sum() == 3
    # nobody uploads: the server keeps its model
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    x, y, idx = _data(model.input_shape)
    train = stack_clients(x, y, idx)
    method = get_method("fedavg")(_setup(model))
    eng = engine_lib.Engine(method, train, train, engine_config(S, drop_fraction=1.0))
    server, clients = eng.init(jax.random.key(0))
    before = jax.tree.map(np.asarray, server)
    server, clients, _ = eng.round(server, clients, jax.random.key(1), 0)
    _assert_close(server, before, tol=0)


SKEWED = [1, 500, 37, 3, 120, 9]


@pytest.mark.parametrize("method_name", ["fedavg", "fedper"])
def test_engine_equals_per_client_loop_strongly_skewed(method_name):
    """Client sizes 1..500 (B=5: 1 to 100 steps per epoch): every mapping runs each
    client's own steps and equals the unpadded per-client loop."""
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    key = jax.random.key(11)
    ref_server, ref_personal = _reference(method_name, model, 2, key, sizes=SKEWED)
    for mapping in ("vmap", "map", "chunked"):
        server, clients = _run_engine(method_name, model, mapping, 2, key, sizes=SKEWED)
        if method_name == "fedavg":
            _assert_close(server["variables"], ref_server, tol=2e-5)
        else:
            _assert_close(server["body"], tree_ops.part_of(ref_server, "body"), tol=2e-5)
            for c in range(len(SKEWED)):
                _assert_close(tree_ops.gather(clients["variables"], c), ref_personal[c], tol=2e-5)


def _skewed_engine(method_name, mapping, sizes=SKEWED, chunk_size=2):
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    x, y, idx = _data(model.input_shape, sizes=sizes)
    train = stack_clients(x, y, idx)
    method = get_method(method_name)(_setup(model))
    return engine_lib.Engine(method, train, train, engine_config(
        4, client_mapping=mapping, chunk_size=chunk_size))


@pytest.mark.parametrize("mapping", ["map", "chunked"])
def test_fused_rounds_equal_single_rounds(mapping):
    """K rounds in one call (two calls of K=3 over 5 rounds, the last slot skipped) equal
    5 single-round calls, evaluations at the same rounds included."""
    eng = _skewed_engine("fedper", mapping)
    key = jax.random.key(2)
    server, clients = eng.init(key)
    single_evals = {}
    for t in range(5):
        round_key, eval_key = engine_lib.round_keys(key, t)
        server, clients, _ = eng.round(server, clients, round_key, t)
        if engine_lib.is_eval_round(t, 5, 2):
            single_evals[t] = eng.evaluate(server, clients, eval_key)
    fused_server, fused_clients = eng.init(key)
    fused_evals, active = {}, []
    for first in (0, 3):
        fused_server, fused_clients, metrics, evals = eng.run_rounds(fused_server, fused_clients, key, first, 3, 5, 2)
        fused_evals.update(evals)
        active += list(metrics["active"])
    assert active == [True] * 5 + [False]
    assert sorted(fused_evals) == sorted(single_evals) == [1, 3, 4]
    _assert_close(fused_server, server, tol=1e-6)
    _assert_close(fused_clients, clients, tol=1e-6)
    for t in single_evals:
        _assert_close(fused_evals[t], single_evals[t], tol=1e-6)


def test_padding_efficiency_by_mapping():
    """map executes exactly the real client-steps; sorted chunks waste less than one vmap."""
    effs = {}
    for mapping in ("map", "vmap", "chunked"):
        eng = _skewed_engine("fedavg", mapping)
        server, clients = eng.init(jax.random.key(0))
        _, _, metrics, _ = eng.run_rounds(server, clients, jax.random.key(1), 0, 4, 4, 4)
        effs[mapping] = metrics["real_steps"].sum() / metrics["executed_steps"].sum()
    assert effs["map"] == 1.0
    assert effs["vmap"] < effs["chunked"] < 1.0, effs


def test_executed_steps_counts_chunks_to_their_own_maximum():
    steps = jnp.array([10, 9, 4, 4, 1])
    assert int(client_mapping.executed_steps(steps, client_mapping.MAP)) == 28
    assert int(client_mapping.executed_steps(steps, client_mapping.VMAP)) == 50
    assert int(client_mapping.executed_steps(steps, client_mapping.of("chunked", 2))) == 2 * 10 + 2 * 4 + 1


def test_sum_batches_skips_padding_batches():
    """sum_batches calls fn only on batches holding real rows (counted by a host-visible
    counter in the result) and equals the float64 sum over real rows."""
    from fedjax_pfl.data.client_data import ClientData
    x = jnp.arange(40, dtype=jnp.float32).reshape(40, 1)
    data = ClientData(x, jnp.zeros(40, jnp.int32), jnp.int32(13))
    out = local_training.sum_batches(lambda b: (jnp.sum(b.x[:, 0] * b.mask), jnp.int32(1)), data, 4, lambda a: a)
    assert float(out[0]) == float(np.arange(13, dtype=np.float64).sum())
    assert int(out[1]) == 4  # ceil(13 / 4) batches, not ceil(40 / 4)


def _round_outputs(method_name, mapping, chunk_size, stream=True, **options):
    """(server, clients, metrics) after one round with index 1 (FedAS aligns), stragglers and drops on."""
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    x, y, idx = _data(model.input_shape)
    train = stack_clients(x, y, idx)
    method = get_method(method_name)(_setup(model))
    cfg = engine_config(S, client_mapping=mapping, chunk_size=chunk_size, straggler_fraction=0.4,
                                  drop_fraction=0.3, stream_chunks=stream, **options)
    eng = engine_lib.Engine(method, train, train, cfg)
    assert eng.streams == (mapping == "chunked" and stream)
    server, clients = eng.init(jax.random.key(0))
    return jax.device_get(eng.round(server, clients, jax.random.key(1), 1))


@pytest.mark.parametrize("method_name, chunk_size, options", [
    ("fedas", 3, {}), ("fedper", 2, {"all_clients_train": True})])
def test_streamed_chunks_equal_the_whole_gather_and_vmap(method_name, chunk_size, options):
    """Chunk by chunk (gather, train, scatter per chunk; FedPer: all 5 clients train, in chunks
    of 2, two full chunks and a remainder) gives exactly the numbers of gathering all selected
    clients first; FedAS also vmap's, up to float rounding (state only: vmap sees the clients
    unsorted). FedAvg, FedPer and FedRep stream under 'chunked' in the per-client-loop tests above."""
    streamed = _round_outputs(method_name, "chunked", chunk_size, **options)
    _assert_close(streamed, _round_outputs(method_name, "chunked", chunk_size, stream=False, **options), tol=0)
    if method_name == "fedas":
        _assert_close(streamed[:2], _round_outputs(method_name, "vmap", chunk_size, **options)[:2], tol=1e-5)


def test_methods_that_need_the_selected_state_say_so():
    """A method with its own `prepare` gathers all selected clients (the streamed round skips it)."""
    from fedjax_pfl.methods import registry
    from fedjax_pfl.methods.base import no_preparation
    for name, algorithm in registry().items():
        assert algorithm.schedule_of().needs_selected_state or algorithm.prepare is no_preparation, name
    assert get_method("diversifed").schedule_of().needs_selected_state
    assert get_method("fedpac").schedule_of().needs_selected_state
    assert not get_method("fedas").schedule_of().needs_selected_state


def test_scan_chunks_visits_chunks_in_order_and_stacks_outputs():
    """Positions 0..6 in chunks of 3 (two full, a remainder of 1), as lax.map's batch_size."""
    seen = []

    def step(carry, positions):
        seen.append(positions.shape[0])
        return carry * 10 + positions[0], {"double": 2 * positions, "pair": jnp.stack([positions, -positions], 1)}

    carry, out = client_mapping.scan_chunks(step, jnp.int32(0), 7, 3)
    assert int(carry) == 36  # chunks start at 0, 3, 6
    np.testing.assert_array_equal(out["double"], 2 * np.arange(7))
    np.testing.assert_array_equal(out["pair"][:, 1], -np.arange(7))
    assert 1 in seen and 3 in seen
    carry, out = client_mapping.scan_chunks(step, jnp.int32(0), 2, 3)  # fewer than a chunk: one remainder
    assert int(carry) == 0 and out["double"].tolist() == [0, 2]
