"""The ``packed:W`` client mapping (engine/packed_loops.py): clients dealt to W lanes, trained back to back.

A packed round equals ``map`` and a per-client Python loop with the same keys
(the method's own client update called one client at a time, unbatched;
tests/test_engine.py holds packed against its unpadded reference loop too) for
the methods whose updates are one or several loops (FedAvg, FedProx, FedAS's
four passes, FedPAC's head then body, Ditto's two models, pFedMe's step
scan, FedRep), on ragged clients that include one with a single batch and
one with no samples; evaluation (a statistics pass) packs too. The lanes do
no padding work: a counted loop's body runs W x (longest lane's load) times,
not S x (largest count). Several devices equal one; bad ``packed:W`` values
are one-line errors.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_pfl.core import declared, tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.engine import client_mapping, mapping_choice
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.engine import packed_loops
from fedjax_pfl.kernels.counted_loop import PLAIN
from fedjax_pfl.methods import get_method, training
from fedjax_pfl.methods.base import ClientRound, ServerRound
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.runs.config import TrainConfig
from settings_records import engine_config, local_setup
from test_sharding import run_script

# Dirichlet-like: one large client, a one-batch client (3 < B), an empty one, the rest in between
SIZES = [23, 3, 0, 11, 16, 7]
B, E, S = 5, 2, 4
MODEL = build_model("mlp", (4, 4, 1), 3, hidden=(6,))
METHODS = ["fedavg", "fedprox", "fedas", "fedpac", "ditto", "pfedme", "fedrep"]
EVALUATED = ("fedavg", "fedas")  # the global model; each client's own model after its last training
# FedPAC's feature statistics are float32 (kernels/prototypes.py) and its server's QP over them amplifies their
# rounding, which differs between a vmapped and a one-client program: vmap differs from map as much as packed.
TOLERANCE = {"fedpac": 1e-4}


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


def _train():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (sum(SIZES), 4, 4, 1), dtype=np.uint8)
    y = rng.integers(0, 3, sum(SIZES)).astype(np.int32)
    return stack_clients(x, y, np.split(np.arange(sum(SIZES)), np.cumsum(SIZES)[:-1]))


def _normalize(x):
    return x.astype(jnp.float64) / 255.0 - 0.5


def _method(name):
    setup = local_setup(model=MODEL, optimizer=functools.partial(optax.sgd, momentum=0.5), lr=0.1, batch_size=B,
                        local_epochs=E, normalize=_normalize)
    return get_method(name)(setup)


def _as_float64(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _engine(name, mapping):
    train = _train()
    return engine_lib.Engine(_method(name), train, train, engine_config(S, client_mapping=mapping))


def _rounds(eng, evaluate=True):
    """(server, clients, evaluation or None, metrics) after rounds 0 and 1 from a float64 init (key 0)."""
    server, clients = _as_float64(eng.init(jax.random.key(0)))
    key, metrics = jax.random.key(1), []
    for t in range(2):
        server, clients, m = eng.round(server, clients, engine_lib.round_keys(key, t)[0], t)
        metrics.append(jax.device_get(m))
    evaluation = eng.evaluate(server, clients, jax.random.key(2)) if evaluate else None
    return jax.device_get((server, clients, evaluation, metrics))


def _loop_rounds(method, server, clients, train, key):
    """Rounds 0 and 1 as a per-client Python loop over the method's own functions (the engine's key contract:
    round key -> selection, stragglers, client keys), each step compiled once."""

    @jax.jit
    def start(server, clients, round_key):
        k_sel, k_strag, k_clients = jax.random.split(round_key, 3)
        selected = engine_lib.select_clients(k_sel, len(SIZES), S)
        epochs, uploaded = engine_lib.straggler_plan(k_strag, S, E, 0.0, 0.0)
        chosen = method.prepare(server, tree_ops.gather(clients, selected), selected)
        return selected, epochs, uploaded, jax.random.split(k_clients, S), chosen

    @jax.jit
    def one_client(server, chosen, selected, keys, epochs, j, t):
        data = ClientData(*tree_ops.gather(tuple(train), selected[j]))
        return method.client_update(server, tree_ops.gather(chosen, j), data, keys[j], ClientRound(t, epochs[j]))

    @jax.jit
    def finish(server, clients, outs, selected, uploaded, t):
        new, uploads = jax.tree.map(lambda *a: jnp.stack(a), *outs)
        info = ServerRound(t, selected, train.n[selected].astype(jnp.float32), uploaded)
        server, new = method.server_update(server, new, uploads, info)
        return server, tree_ops.scatter(clients, selected, new)

    for t in range(2):
        selected, epochs, uploaded, keys, chosen = start(server, clients, engine_lib.round_keys(key, t)[0])
        outs = [one_client(server, chosen, selected, keys, epochs, jnp.int32(j), jnp.int32(t)) for j in range(S)]
        server, clients = finish(server, clients, outs, selected, uploaded, jnp.int32(t))
    return server, clients


def _loop_evaluation(method, server, clients, data, key):
    """Every client's correct test predictions, one client at a time."""

    @jax.jit
    def correct(client, data, key):
        variables = method.eval_variables(server, client, data, key)
        return training.sum_batches(method.local, lambda b: (jnp.argmax(method.eval_logits(variables, b.x), -1) == b.y)
                                    @ b.mask.astype(jnp.int32), data)

    keys = jax.random.split(key, len(SIZES))
    return np.asarray([correct(tree_ops.gather(clients, c), ClientData(*tree_ops.gather(tuple(data), c)), keys[c])
                       for c in range(len(SIZES))])


def _plain(a):
    """A leaf as NumPy (a typed key as its key data)."""
    return np.asarray(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a)


def _assert_equal(got, want, what, tol=1e-10):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
        a, b, where = _plain(a), _plain(b), f"{what} {jax.tree_util.keystr(path)}"
        if jnp.issubdtype(a.dtype, jnp.floating):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=where)
        else:  # integer and boolean state, keys: exact
            np.testing.assert_array_equal(a, b, err_msg=where)


@pytest.mark.parametrize("name", METHODS)
def test_packed_equals_map_and_a_per_client_loop(name, float64):
    packed = _engine(name, "packed:2")
    assert str(packed.mapping) == "packed:2" and packed.eval_mapping.packed
    server, clients, evaluation, metrics = _rounds(packed, evaluate=name in EVALUATED)
    tol = TOLERANCE.get(name, 1e-10)
    _assert_equal((server, clients), _rounds(_engine(name, "map"), evaluate=False)[:2], f"{name}: packed against map",
                  tol)
    method, train = packed.method, _train()
    ref_server, ref_clients = _loop_rounds(method, *_as_float64(packed.init(jax.random.key(0))), train,
                                           jax.random.key(1))
    _assert_equal((server, clients), jax.device_get((ref_server, ref_clients)), f"{name}: packed against the loop",
                  tol)
    if name in EVALUATED:
        np.testing.assert_array_equal(evaluation["correct"],
                                      _loop_evaluation(method, ref_server, ref_clients, train, jax.random.key(2)))
    for m in metrics:  # every selected client's real steps, at most W x the longest lane's load
        assert m["real_steps"] <= m["executed_steps"] == 2 * m["sequential_steps"] <= 2 * m["real_steps"]
    if name != "fedavg":
        return
    # what the run's record and log line say of the first round: the counts its metrics give
    round_key = engine_lib.round_keys(jax.random.key(1), 0)[0]
    _, record = mapping_choice.choose_or_default(packed, "packed:2", 30, None, None, round_key, 0)
    padding = record["padding"]
    assert record["chosen"] == "packed:2" and padding["executed_client_steps"] == metrics[0]["executed_steps"]
    assert padding["padding_efficiency"] == round(metrics[0]["real_steps"] / metrics[0]["executed_steps"], 4)
    assert f"padding efficiency {padding['padding_efficiency']:.3f} in round 1" in mapping_choice.describe(record)


def test_lanes_run_no_padding_steps():
    """A counted loop's body runs (longest lane's load) steps of W lanes packed, (largest count) steps of S
    clients under vmap: a callback in the body, vmapped, is called once per lane-step."""
    counts = jnp.array([9, 1, 5, 0, 4, 3])
    calls = []

    def client(loops, n, x):
        def body(i, acc):
            jax.debug.callback(calls.append, i)
            return acc + x * (i + 1)
        return packed_loops.counted_loop(body, n, jnp.float32(0), loops)

    x = jnp.arange(1.0, 7.0)
    want = np.asarray([c * (c + 1) / 2 for c in counts.tolist()]) * np.asarray(x)
    np.testing.assert_allclose(jax.jit(jax.vmap(functools.partial(client, PLAIN)))(counts, x), want)
    jax.effects_barrier()
    assert len(calls) == 6 * 9
    calls.clear()
    got = jax.jit(packed_loops.in_lanes(client, 2))(counts, x)
    jax.effects_barrier()
    np.testing.assert_allclose(got, want)
    assert len(calls) == 2 * 12  # lanes 9+3 and 5+4+1: 22 real steps of 24
    assert int(client_mapping.executed_steps(counts, client_mapping.of("packed:2"))) == 24
    assert int(client_mapping.sequential_steps(counts, client_mapping.of("packed:2"))) == 12


def test_packed_loop_carries_each_clients_own_inputs_keys_and_state_under_an_outer_vmap():
    """Closed-over per-client values (data, key schedules), typed keys in the carry, any width, and a vmap over
    experiments outside the clients' (a sweep's program) all give the unpacked loop's numbers."""
    def client(loops, n, x, key):
        keys = jax.random.split(key, 10)

        def body(i, carry):
            acc, k = carry
            return acc + x[i] * jax.random.uniform(keys[i]), jax.random.fold_in(k, i)
        return packed_loops.counted_loop(body, n, (jnp.float32(0), key), loops)

    counts = jnp.array([3, 0, 10, 1, 4, 7, 2])
    x = jnp.arange(70.0).reshape(7, 10)
    keys = jax.random.split(jax.random.key(0), 7)
    want = jax.vmap(functools.partial(client, PLAIN))(counts, x, keys)
    for lanes in (1, 3, 9):
        got = jax.jit(packed_loops.in_lanes(client, lanes))(counts, x, keys)
        _assert_equal(got, want, f"{lanes} lanes", tol=1e-6)

    def experiment(counts, x, keys):
        return packed_loops.in_lanes(client, 3)(counts, x, keys)

    got = jax.jit(jax.vmap(experiment))(jnp.stack([counts, counts[::-1]]), jnp.stack([x, 2 * x]),
                                        jnp.stack([keys, keys]))
    _assert_equal(jax.tree.map(lambda a: a[1], got), jax.vmap(functools.partial(client, PLAIN))(counts[::-1], 2 * x, keys),
                  "experiment 1", tol=1e-6)


def test_lane_queues_deal_longest_first_to_the_least_loaded_lane():
    rng = np.random.default_rng(0)
    for rows, lanes in [(1, 1), (20, 3), (5, 8)]:
        counts = rng.integers(0, 50, rows)
        width = min(lanes, rows)
        queue, lengths, loads = (np.asarray(a) for a in jax.jit(packed_loops.lane_queues, static_argnums=1)(
            jnp.asarray(counts), width))
        ref = np.zeros(width)
        for r in np.argsort(-counts, kind="stable"):
            ref[np.argmin(ref)] += counts[r]
        np.testing.assert_array_equal(np.sort(loads), np.sort(ref))
        queued = np.concatenate([queue[l, :lengths[l]] for l in range(width)])
        np.testing.assert_array_equal(np.sort(queued), np.flatnonzero(counts > 0))  # each busy client once
        for l in range(width):
            assert np.all(np.diff(counts[queue[l, :lengths[l]]]) <= 0) and counts[queue[l, :lengths[l]]].sum() == loads[l]


def test_width_from_the_data_and_the_auto_candidates():
    eng = _engine("fedavg", "packed")
    steps = np.asarray([E * -(-n // B) for n in SIZES])  # 10, 2, 0, 6, 8, 4: 30 steps, 4 of 6 clients a round
    assert eng.packed_width() == int(30 * S / len(SIZES) // 10) == 2 and str(eng.mapping) == "packed:2"
    assert client_mapping.packed_width(steps, S) == 2
    assert client_mapping.packed_width([5] * 200, 200, backend="gpu") == client_mapping.MAX_LANES_ACCELERATOR
    assert client_mapping.packed_width([5] * 200, 200, devices=4, backend="cpu") == client_mapping.MAX_LANES["cpu"]
    assert client_mapping.packed_width([0, 0], 2) == 1
    assert ("packed:3", None) in mapping_choice.candidates(10, "gpu", packed_width=3)
    assert mapping_choice.candidates(10, "cpu", packed_width=3) == mapping_choice.candidates(10, "cpu")
    assert client_mapping.default_mapping("cpu") == "map"  # auto on a CPU still runs map untimed
    # elsewhere one federation vmaps its clients; several (engine/rows.py) share packed lanes
    assert [client_mapping.default_mapping("gpu", f) for f in (1, 2)] == ["vmap", "packed"]
    assert client_mapping.default_mapping("cpu", 2) == "map"


@pytest.mark.parametrize("mapping, message", [
    ("packed:0", "W in packed:W must be a whole number >= 1"), ("packed:-2", "must be a whole number >= 1"),
    ("packed:two", "got 'two'"), ("packed:1.5", "got '1.5'"), ("packed:", "got ''"),
    ("chunked:4", "unknown client mapping 'chunked:4'"), ("packd", "unknown client mapping")])
def test_bad_packed_widths_are_one_line_user_errors(mapping, message):
    with pytest.raises(UserError, match=message) as raised:
        client_mapping.parse(mapping)
    assert "\n" not in str(raised.value)
    with pytest.raises(UserError, match="train.client_mapping"):  # the setting's check, before any engine
        declared.check_fields(TrainConfig(client_mapping=mapping), "train.")


TWO_DEVICES = """
import dataclasses
import jax, jax.numpy as jnp, numpy as np, optax
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.runs.config import TrainConfig
from fedjax_pfl.runs.experiment import engine_config, local_setup
assert jax.device_count() == 2, jax.devices()
sizes = [23, 3, 0, 11, 16, 7, 30]
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (sum(sizes), 4, 4, 1), dtype=np.uint8)
y = rng.integers(0, 3, sum(sizes)).astype(np.int32)
data = stack_clients(x, y, np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1]))
setup = local_setup(TrainConfig(lr=0.1, momentum=0.5, batch_size=5, local_epochs=2),
                    build_model("mlp", (4, 4, 1), 3, hidden=(6,)), lambda a: a.astype(jnp.float32) / 255.0)

def run(shard):
    eng = engine_lib.Engine(get_method("fedas")(setup), data, data,
                            dataclasses.replace(engine_config(TrainConfig(client_mapping="packed:2"), 6), shard=shard))
    assert (eng.mesh is not None) == shard and str(eng.mapping) == "packed:2"
    server, clients = eng.init(jax.random.key(0))
    server, clients, metrics = eng.round(server, clients, jax.random.key(1), 1)  # round 1: FedAS aligns
    evaluation = eng.evaluate(server, clients, jax.random.key(2))
    return jax.device_get((server, jax.tree.map(lambda a: np.asarray(a)[:7], clients), evaluation)), metrics

# FedAS: four packed loops a client (class means, alignment, training, Fisher) and a packed evaluation
(one, m1), (two, m2) = run(False), run(True)
assert_same(two, one, "fedas packed on 2 devices")
assert m2["real_steps"] == m1["real_steps"] and m2["executed_steps"] >= m2["real_steps"]
print("PACKED_TWO_DEVICES_OK")
"""


def test_packed_on_two_host_devices_equals_one_device():
    """Clients dealt to devices (balanced by steps), then each device packs its own into lanes (shard_map)."""
    run_script(TWO_DEVICES, 2, "PACKED_TWO_DEVICES_OK")


def test_loops_under_a_methods_own_vmap_or_inside_a_packed_loop_run_plainly_with_the_same_numbers():
    """Only the engine's vmap of rows packs (the runner is tied to the row's position, not to an axis size): a
    method's own vmap of as many members as there are rows, and a loop nested in a packed loop's body, run
    plainly inside their row's lane, with the unpacked numbers."""
    counts = jnp.array([3, 0, 5])
    x = jnp.arange(1.0, 4.0)

    def client(loops, n, x):
        def member(scale):  # a method's own vmap over 3 members, as many as the rows
            def body(i, acc):  # a loop of i + 1 steps inside each step
                return acc + packed_loops.counted_loop(lambda j, a: a + x * scale, i + 1, jnp.float32(0), loops)
            return packed_loops.counted_loop(body, n, jnp.float32(0), loops)
        return jax.vmap(member)(jnp.arange(1.0, 4.0)), packed_loops.counted_loop(
            lambda i, acc: acc + packed_loops.counted_loop(lambda j, a: a + x, i, jnp.float32(0), loops), n,
            jnp.float32(0), loops)

    want = jax.vmap(functools.partial(client, PLAIN))(counts, x)
    for lanes in (1, 2):
        _assert_equal(jax.jit(packed_loops.in_lanes(client, lanes))(counts, x), want, f"{lanes} lanes", tol=1e-6)
