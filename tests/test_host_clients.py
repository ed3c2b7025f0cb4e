"""Client state kept on the host (engine/host_clients.py) gives the device-kept engine's numbers."""

import functools

import jax
import numpy as np
import optax
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.engine import host_clients
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

SIZES = [7, 23, 1, 16, 12, 9, 4, 18]
S, ROUNDS = 4, 4  # 4 of 8 clients a round: cohorts overlap from one round to the next


def _host(data):
    return ClientData(*(np.asarray(a) for a in data))


def _federation(method_name, mapping="vmap", seed=0, persistent_optimizer=True, **options):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(sum(SIZES), 6)).astype(np.float32)
    y = rng.integers(0, 3, size=sum(SIZES)).astype(np.int32)
    bounds = np.cumsum([0] + SIZES)
    idx = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    train = _host(stack_clients(x, y, idx))
    test = _host(stack_clients(x[::-1].copy(), y[::-1].copy(), idx))
    model = build_model("mlp", (6,), 3, hidden=(8,))
    setup = local_setup(model=model, optimizer=functools.partial(optax.sgd, momentum=0.9), lr=0.05, batch_size=5,
                        local_epochs=2, normalize=lambda a: a, persistent_optimizer=persistent_optimizer)
    method = get_method(method_name)(setup, **options)
    config = engine_config(S, client_mapping=mapping, chunk_size=3, straggler_fraction=0.25)
    return method, train, test, config


def _close(a, b):
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(la, np.float64), np.asarray(lb, np.float64), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method_name,mapping", [("fedavg", "vmap"), ("ditto", "vmap"), ("fedper", "chunked"),
                                                 ("fedas", "vmap"), ("fedpac", "chunked")])
def test_host_kept_equals_device_kept(method_name, mapping):
    method, train, test, config = _federation(method_name, mapping, persistent_optimizer=method_name in (
        "fedavg", "ditto", "fedper", "fedpac"))
    device = engine_lib.Engine(method, train, test, config)
    host = host_clients.HostClients(engine_lib.Engine(method, train, test, config), eval_chunk=3)
    init_key, key = jax.random.split(jax.random.PRNGKey(1))
    server, clients = device.init(init_key)
    host_server = host.init(init_key)
    _close((server, clients), (host_server, host.clients))
    selections = []
    for t in range(ROUNDS):
        server, clients, metrics = device.round(server, clients, engine_lib.round_keys(key, t)[0], t)
        selections.append(set(np.asarray(metrics["selected"]).tolist()))
    assert any(a & b for a, b in zip(selections, selections[1:]))  # some client trains two rounds running
    host_server, history = host.run(host_server, key, ROUNDS)
    assert [set(m["selected"].tolist()) for m in history] == selections
    _close(metrics["train_loss"], history[-1]["train_loss"])
    _close(server, host_server)
    _close(clients, host.clients)
    eval_key = jax.random.PRNGKey(7)
    _close(device.evaluate(server, clients, eval_key, round_index=ROUNDS - 1),
           host.evaluate(host_server, host.clients, eval_key, round_index=ROUNDS - 1))


def test_single_rounds_equal_the_prefetched_run():
    method, train, test, config = _federation("ditto")
    key = jax.random.PRNGKey(3)
    a = host_clients.HostClients(engine_lib.Engine(method, train, test, config))
    b = host_clients.HostClients(engine_lib.Engine(method, train, test, config), folder=None)
    sa, sb = a.init(key), b.init(key)
    sa, _ = a.run(sa, key, 3)
    for t in range(3):
        sb, _ = b.round(sb, engine_lib.round_keys(key, t)[0], t)
    _close((sa, a.clients), (sb, b.clients))


def test_memory_mapped_store_equals_host_memory(tmp_path):
    method, train, test, config = _federation("fedper")
    key = jax.random.PRNGKey(4)
    a = host_clients.HostClients(engine_lib.Engine(method, train, test, config))
    b = host_clients.HostClients(engine_lib.Engine(method, train, test, config), folder=str(tmp_path / "store"))
    sa, _ = a.run(a.init(key), key, 2)
    sb, _ = b.run(b.init(key), key, 2)
    assert all(isinstance(leaf, np.memmap) for leaf in jax.tree.leaves(b.clients))
    _close((sa, a.clients), (sb, b.clients))


@pytest.mark.parametrize("method_name,words", [("fedala", "updates every client"),
                                               ("pfedhn", "after each client"),
                                               ("apple", "sized by the number of clients"),
                                               ("diversifed", "sized by the number of clients")])
def test_methods_needing_every_client_are_refused(method_name, words):
    method, train, test, config = _federation(method_name, persistent_optimizer=False)
    with pytest.raises(UserError, match=f"{words}.*train.client_state=device"):
        host_clients.HostClients(engine_lib.Engine(method, train, test, config))


def test_auto_rule_from_a_device_memory_figure():
    method, train, test, _ = _federation("ditto")
    needed = host_clients.state_bytes(method, 100_000) + host_clients.data_bytes(train, test)
    assert needed > host_clients.state_bytes(method, 10)
    host, line = host_clients.choose("auto", needed, available=needed // 4)
    assert host and "host" in line and "\n" not in line
    host, line = host_clients.choose("auto", needed, available=needed * 4)
    assert not host and "device" in line
    assert host_clients.choose("host", 1, available=10**12)[0]
    assert not host_clients.choose("device", 10**12, available=1)[0]
    assert not host_clients.choose("auto", 10**12, available=None)[0]
    with pytest.raises(UserError, match="client_state"):
        host_clients.choose("gpu", 1, 1)


def test_hundred_thousand_clients_round_touches_only_its_cohort():
    n, n_max, features, classes = 100_000, 8, 10, 4
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, n_max + 1, size=n).astype(np.int32)
    x = rng.normal(size=(n, n_max, features)).astype(np.float32)
    y = rng.integers(0, classes, size=(n, n_max)).astype(np.int32)
    data = ClientData(x, y, sizes)
    model = build_model("mlr", (features,), classes)
    setup = local_setup(model=model, optimizer=functools.partial(optax.sgd, momentum=0.9), lr=0.1, batch_size=5,
                        local_epochs=1, normalize=lambda a: a, persistent_optimizer=True)
    method = get_method("fedavg")(setup)
    engine = engine_lib.Engine(method, data, data, engine_config(50, client_mapping="vmap"))
    host = host_clients.HostClients(engine)
    key = jax.random.PRNGKey(0)
    server = host.init(key)
    before = jax.tree.map(np.copy, host.clients)
    start = jax.device_get(server)
    server, (metrics,) = host.run(server, key, 1)
    cohort = np.zeros(n, bool)
    cohort[metrics["selected"]] = True
    assert cohort.sum() == 50
    for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(host.clients)):
        changed = np.any((old != new).reshape(n, -1), axis=1)
        assert np.array_equal(changed, cohort)
    assert any(np.any(a != b) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(jax.device_get(server))))


def test_fused_calls_equal_the_engines_with_evaluations_at_their_rounds():
    """`HostClients.run_rounds` (the run loop's call) equals `Engine.run_rounds`: the same rounds' metrics and
    an evaluation after each evaluated round, of the state after that round, not after the call."""
    method, train, test, config = _federation("fedavg")
    device = engine_lib.Engine(method, train, test, config)
    host = host_clients.HostClients(engine_lib.Engine(method, train, test, config), eval_chunk=4)
    init_key, key = jax.random.split(jax.random.PRNGKey(2))
    server, clients = device.init(init_key)
    host_server = host.init(init_key)
    for first, count in ((0, 3), (3, 4)):  # evaluations after rounds 1, 3 and 4 (the last: 5 rounds, every 2)
        server, clients, want, want_evals = device.run_rounds(server, clients, key, first, count, 5, 2)
        host_server, store, got, got_evals = host.run_rounds(host_server, host.clients, key, first, count, 5, 2)
        assert store is host.clients
        ran = int(np.asarray(want["active"]).sum())
        assert got["round"].tolist() == np.asarray(want["round"])[:ran].tolist()
        _close(np.asarray(want["train_loss"])[:ran], got["train_loss"])
        assert sorted(got_evals) == sorted(want_evals)
        for t in want_evals:
            _close(want_evals[t], got_evals[t])
    assert sorted(want_evals) == [3, 4]


def test_a_run_with_client_state_on_the_host_equals_one_on_the_device_and_resumes_exactly(tmp_path, capsys):
    """`--client-state host` through the training command: the same metrics records as `device`; Ctrl-C after
    round 2 (a checkpoint of the host store), then --resume to the end, the same records again."""
    from fedjax_pfl import train
    from signal_after_round import signal_after
    from test_train_cli import TINY, _assert_close, _records

    args = ["--method", "ditto", *TINY, "--rounds", "4", "--join-ratio", "0.5"]
    assert train.main([*args, "--client-state", "device", "--out", str(tmp_path / "device")]) == 0
    assert train.main([*args, "--client-state", "host", "--out", str(tmp_path / "host")]) == 0
    printed = capsys.readouterr().out
    assert "client state on the host (asked)" in printed and "client state on the device (asked)" in printed
    want = _records(tmp_path / "device")
    assert len(want) == 4
    for got, expected in zip(_records(tmp_path / "host"), want, strict=True):
        _assert_close(got, expected)
    out = tmp_path / "resumed"
    assert train.main([*args, "--client-state", "host", "--out", str(out)], observe=signal_after(2, "INT")) == 130
    assert train.main(["--out", str(out), "--resume"]) == 0
    for got, expected in zip(_records(out), want, strict=True):
        _assert_close(got, expected)


def test_auto_keeps_a_method_that_needs_every_client_on_the_device_and_says_why(monkeypatch):
    method, train, test, config = _federation("fedavg")
    engine = engine_lib.Engine(method, train, test, config)
    assert host_clients.keep_on_host("auto", engine)[0] is False  # a few kB against the machine's memory
    assert host_clients.keep_on_host("host", engine) == (True, "client state on the host (asked)")
    monkeypatch.setattr(host_clients, "device_bytes", lambda: 1000)  # a device too small for [N, ...]
    host, why = host_clients.keep_on_host("auto", engine)
    assert host and why.startswith("client state on the host (streamed")
    monkeypatch.setattr(host_clients, "unsupported", lambda e: "method 'fedala' updates every client each round")
    host, why = host_clients.keep_on_host("auto", engine)
    assert not host and why == "client state on the device: method 'fedala' updates every client each round"
