"""Any client count on any device count: 20 clients on 3, 4 and 8 (forced host) devices
give the numbers of one device, with the client state split over the 'clients' axis."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from forced_devices import cpu_devices_env

# Both scripts: every leaf of a run on several devices equals the one-device run's.
ASSERT_SAME = textwrap.dedent("""
    def assert_same(got, want, what):
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5, err_msg=what)
""")


def run_script(script: str, devices: int, done: str, timeout: int = 600):
    """``script`` (with `ASSERT_SAME`) in a fresh process on ``devices`` host devices; it prints ``done``
    within ``timeout`` seconds (a hung program fails the test)."""
    source = script.replace("import jax, jax.numpy as jnp, numpy as np, optax\n",
                            "import jax, jax.numpy as jnp, numpy as np, optax\n" + ASSERT_SAME, 1)
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **cpu_devices_env(devices)})
    assert proc.returncode == 0 and done in proc.stdout, proc.stderr[-3000:]


SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import PartitionSpec
    from fedjax_pfl.engine import engine as engine_lib, sharding
    from fedjax_pfl.data.client_data import stack_clients
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.models.networks import build_model
    from fedjax_pfl.runs.config import TrainConfig
    from fedjax_pfl.runs.experiment import engine_config, local_setup
    from dataclasses import replace
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    sizes = rng.integers(2, 9, 20)
    x = rng.integers(0, 256, (sum(sizes), 4, 4, 1), dtype=np.uint8)
    y = rng.integers(0, 3, sum(sizes)).astype(np.int32)
    data = stack_clients(x, y, np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1]))
    setup = local_setup(TrainConfig(lr=0.1, batch_size=4, local_epochs=1),
                        build_model("mlp", (4, 4, 1), 3, hidden=(6,)), lambda a: a.astype(jnp.float32) / 255.0)

    def run(method, devices, mapping):
        sharding.client_mesh = lambda d=None: jax.sharding.Mesh(np.asarray(jax.devices()[:devices]), ("clients",))
        eng = engine_lib.Engine(get_method(method)(setup), data, data,
                                replace(engine_config(TrainConfig(client_mapping=mapping), 7), shard=devices > 1))
        server, clients = eng.init(jax.random.key(0))
        if devices > 1:
            assert eng.padded_clients % devices == 0 and eng.padded_clients >= 20
            for leaf in jax.tree.leaves(clients):
                assert leaf.shape[0] == eng.padded_clients, leaf.shape
                assert leaf.sharding.spec == PartitionSpec("clients"), leaf.sharding
                assert len(leaf.sharding.device_set) == devices
        server, clients, metrics, evals = eng.run_rounds(server, clients, jax.random.key(1), 0, 2, 2, 1)
        if devices > 1:
            assert all(l.sharding.spec == PartitionSpec("clients") for l in jax.tree.leaves(clients))
        assert sorted(evals) == [0, 1] and evals[1]["count"].shape == (20,)
        real = jax.tree.map(lambda a: np.asarray(a)[:20], clients)
        return jax.device_get((server, real, metrics, evals))

    # each mapping once (vmap, map: the CPU default, chunked), each device count once; fedala: the
    # engine's step on every client (Method.update_every_client) over padded, sharded rows
    for method, mapping, device_counts in (("fedavg", "vmap", (3,)), ("fedas", "map", (4,)),
                                           ("fedper", "chunked", (8,)), ("fedala", "vmap", (3,))):
        want = run(method, 1, mapping)
        for devices in device_counts:
            assert_same(run(method, devices, mapping), want, f"{method} on {devices} devices")
    print("SHARDED_OK")
""")


def test_any_client_count_on_any_device_count_equals_one_device():
    run_script(SCRIPT, 8, "SHARDED_OK")


TWO_DEVICES = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax
    from fedjax_pfl.engine import engine as engine_lib, sharding
    from fedjax_pfl.data.client_data import stack_clients
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.models.networks import build_model
    from fedjax_pfl.runs.config import TrainConfig
    from fedjax_pfl.runs.experiment import engine_config, local_setup
    from dataclasses import replace
    assert jax.device_count() == 2, jax.devices()
    rng = np.random.default_rng(1)
    sizes = rng.integers(3, 12, 7)  # 7 clients: padded to 8 rows; 5 a round: a repeated row dropped
    x = rng.integers(0, 256, (sum(sizes), 16, 16, 1), dtype=np.uint8)
    y = rng.integers(0, 3, sum(sizes)).astype(np.int32)
    data = stack_clients(x, y, np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1]))
    # momentum: each client builds its optimizer state from the server's message inside the devices' map
    # (zeros_like of the server state once failed there: its sharding named the mesh outside shard_map)
    setup = local_setup(TrainConfig(lr=0.05, momentum=0.5, batch_size=4, local_epochs=1),
                        build_model("fedavgcnn", (16, 16, 1), 3), lambda a: a.astype(jnp.float32) / 255.0)

    def run(method, mapping, shard):
        eng = engine_lib.Engine(get_method(method)(setup), data, data,
                                replace(engine_config(TrainConfig(client_mapping=mapping, chunk_size=2), 5),
                                        shard=shard))
        server, clients = eng.init(jax.random.key(0))
        if shard:  # each device maps its own clients (shard_map), no vmap over the devices
            jaxpr = str(jax.make_jaxpr(eng._round_impl)(server, clients, eng.train, jax.random.key(1), 0, {}))
            assert "shard_map" in jaxpr, jaxpr[:2000]
        server, clients, metrics, evals = eng.run_rounds(server, clients, jax.random.key(1), 0, 2, 2, 1)
        return jax.device_get((server, jax.tree.map(lambda a: np.asarray(a)[:7], clients), metrics, evals))

    # a CNN under map (the CPU default: per-client direct convolutions), and a method that needs the selected
    # clients' state before training (Schedule.needs_selected_state) under chunked
    for method, mapping in (("fedavg", "map"), ("fedpac", "chunked")):
        assert_same(run(method, mapping, True), run(method, mapping, False), f"{method} on 2 devices")
    print("TWO_DEVICES_OK")
""")


def test_cnn_and_selected_state_methods_on_two_devices_equal_one_device():
    run_script(TWO_DEVICES, 2, "TWO_DEVICES_OK")


FEDPAC_VMAP = textwrap.dedent("""
    import dataclasses
    import jax, jax.numpy as jnp, numpy as np, optax
    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment, validate
    assert jax.device_count() == 2, jax.devices()
    cfg = config_lib.build(PRESET, [
        f"data.data_dir={DATA_DIR}", "partition.num_clients=16", "partition.samples_per_client=100", "partition.test_per_client=50",
        "train.client_mapping=vmap", "train.local_epochs=1"])
    exp = build_experiment(validate(cfg))

    def run(shard):
        eng = exp.engine if shard else engine_lib.Engine(exp.engine.method, exp.data.train, exp.data.test,
                                                         dataclasses.replace(exp.engine.config, shard=False))
        assert (eng.mesh is not None) == shard
        server, clients = eng.init(jax.random.key(0))
        server, clients, _ = eng.round(server, clients, jax.random.key(1), 0)
        return jax.device_get((server, jax.tree.map(lambda a: np.asarray(a)[:16], clients)))

    assert_same(run(True), run(False), "fedpac under vmap on 2 devices")
    print("FEDPAC_VMAP_OK")
""")


def test_fedpac_round_under_vmap_on_two_devices_finishes_and_equals_one_device(data_dir):
    """The FMNIST preset's FedPAC round (16 clients, vmap, two host devices) once hung for good: its server's
    batched eigendecompositions after the devices' vmapped client updates (kernels/simplex_qp.py)."""
    preset = Path(__file__).resolve().parents[1] / "configs" / "fedpac_fmnist.yaml"
    script = FEDPAC_VMAP.replace("PRESET", repr(str(preset))).replace("{DATA_DIR}", str(data_dir))
    run_script(script, 2, "FEDPAC_VMAP_OK", timeout=300)


def _greedy_loads(costs, size):
    """NumPy reference of the deal: longest first, to the least-loaded device with a free slot."""
    import numpy as np

    per = -(-len(costs) // size)
    loads, counts = np.zeros(size), np.zeros(size, int)
    for r in np.argsort(-np.asarray(costs), kind="stable"):
        d = min((d for d in range(size) if counts[d] < per), key=lambda d: (loads[d], d))
        loads[d] += costs[r]
        counts[d] += 1
    return loads


def test_balanced_slots_deal_every_row_once_evenly_and_longest_first():
    import jax.numpy as jnp
    import numpy as np

    from fedjax_pfl.engine.sharding import balanced_slots

    rng = np.random.default_rng(0)
    for rows, size in [(1, 1), (1, 2), (5, 2), (20, 2), (7, 3), (30, 4), (8, 8)]:
        costs = rng.integers(0, 400, rows)
        slots, slot_of = (np.asarray(a) for a in balanced_slots(jnp.asarray(costs), size))
        per = -(-rows // size)
        assert slots.shape == (size * per,) and slot_of.shape == (rows,)
        np.testing.assert_array_equal(slots[slot_of], np.arange(rows))  # each row sits in its own slot
        padding = np.setdiff1d(np.arange(size * per), slot_of)
        assert np.all(costs[slots[padding]] == costs.min())  # the spare slots repeat the cheapest row
        loads = np.array([costs[slots[d * per:(d + 1) * per]].sum() - costs[slots[np.intersect1d(
            padding, np.arange(d * per, (d + 1) * per))]].sum() for d in range(size)])
        np.testing.assert_allclose(np.sort(loads), np.sort(_greedy_loads(costs, size)))
    # one large client: round-robin of the sorted rows left 918 against 731 steps on 2 devices; now within 25
    steps = np.array([318, 137, 133, 126, 111, 87, 87, 86, 79, 76, 64, 56, 56, 55, 36, 36, 32, 32, 24, 18])
    slots, _ = balanced_slots(jnp.asarray(steps), 2)
    halves = steps[np.asarray(slots)].reshape(2, -1).sum(1)
    assert abs(halves[0] - halves[1]) <= 25, halves
