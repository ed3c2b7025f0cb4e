"""Issue-16 training options: drop_last, persistent_optimizer, all_clients_train.

Each option at its neutral value is today's behaviour (the rest of the suite);
here each one on equals a hand-written per-step loop or a reference built from
the method's own functions, with the key contract of tests/test_engine.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import method_sample

from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import local_training
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method, method_names, training
from fedjax_pfl.methods.base import ClientRound, Schedule
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, run_facts
from test_engine import _OPT, _assert_close, _data, _setup, _sgd_step, _weighted_mean64

MODEL = build_model("mlp", (6, 6, 1), 4, hidden=(8,))


def _reference_train(variables, x, y, key, epochs, batch_size, n_max, opt_state=None, drop_last=False, part="all"):
    """Per-step loop over real batches of one client, training ``part`` -> (variables, optimizer state)."""
    n = x.shape[0]
    step = _sgd_step(MODEL, part)
    epoch_keys = jax.random.split(jax.random.split(key)[0], epochs)
    params = tree_ops.trainable_of(variables, part)
    opt_state = _OPT.init(params) if opt_state is None else opt_state
    steps = n // batch_size if drop_last else -(-n // batch_size)
    for e in range(epochs):
        order = np.asarray(local_training.epoch_order(epoch_keys[e], n, n_max))[:n]
        for s in range(steps):
            b = order[s * batch_size:(s + 1) * batch_size]
            params, opt_state = step(params, opt_state, variables, x[b], y[b])
    return tree_ops.with_trainable(variables, part, params), opt_state


def _client(n, n_max, seed=0):
    x, y, _ = _data(MODEL.input_shape, seed=seed, sizes=[n_max])
    return ClientData(jnp.asarray(x), jnp.asarray(y), jnp.int32(n)), x[:n], y[:n]


def _local_method(name="local", hparams=None, **options):
    return get_method(name)(dataclasses.replace(_setup(MODEL), **options), hparams)


def _checked(name, **options):
    """What the run's validation checks of method ``name`` with setup options ``options``."""
    get_method(name).check_run(None, run_facts(dataclasses.replace(_setup(MODEL), **options)))


# ------------------------------------------------------------------ drop_last
def test_drop_last_takes_floor_n_over_b_steps_and_never_sees_the_leftover():
    """n=25, B=10, 2 epochs: 2 steps per epoch on the first 20 of each epoch's shuffle."""
    method = _local_method(batch_size=10, drop_last=True)
    data, x, y = _client(25, 30)
    v0 = MODEL.init(jax.random.key(0))
    key = jax.random.key(3)
    out, _ = jax.jit(lambda v, d, k: training.train(method.local, training.supervised_objective(method), v, d, k, 2))(
        v0, data, key)
    ref, _ = _reference_train(v0, x, y, key, 2, 10, 30, drop_last=True)
    _assert_close(out, ref)
    assert int(local_training.real_steps(25, 10, 2, drop_last=True)) == 4
    assert int(local_training.real_steps(25, 10, 2, drop_last=False)) == 6


def test_drop_last_client_smaller_than_a_batch_takes_no_step():
    method = _local_method(batch_size=10, drop_last=True)
    data, _, _ = _client(7, 12)
    v0 = MODEL.init(jax.random.key(0))
    out, loss = training.train(method.local, training.supervised_objective(method), v0, data, jax.random.key(1), 2)
    _assert_close(out, v0, tol=0)
    assert float(loss) == 0.0


def test_drop_last_counts_real_steps_in_the_engine():
    sizes = [7, 23, 1, 16, 12]
    x, y, idx = _data(MODEL.input_shape, sizes=sizes)
    train = stack_clients(x, y, idx)
    method = _local_method("fedavg", drop_last=True)
    eng = engine_lib.Engine(method, train, train, engine_config(3, client_mapping="map"))
    server, clients = eng.init(jax.random.key(0))
    _, _, metrics = eng.round(server, clients, jax.random.key(1), 0)
    b, e = method.setup.batch_size, method.setup.local_epochs
    expected = sum(e * (sizes[c] // b) for c in np.asarray(metrics["selected"]))
    assert int(metrics["real_steps"]) == int(metrics["executed_steps"]) == expected


def test_drop_last_does_not_apply_to_random_batch_methods():
    with pytest.raises(UserError, match="drop_last does not apply"):
        get_method("pfedme").check_run(None, run_facts(dataclasses.replace(_setup(MODEL), drop_last=True, lr=0.1)))


# ------------------------------------------------------- persistent_optimizer
@pytest.mark.parametrize("name", ["local", "pfakd", "ditto"])
def test_persistent_momentum_equals_two_local_phases_sharing_the_buffer(name):
    """Local, PFAKD with beta 0 (CE only) on an unchanged global body and Ditto's personal
    model with lamda 0: the second local phase starts from the first one's momentum buffer."""
    hparams = {"pfakd": {"beta": 0.0}, "ditto": {"lamda": 0.0}}.get(name)
    hparams = get_method(name).hparams_type(**hparams) if hparams else None
    method = _local_method(name, hparams, persistent_optimizer=True)
    data, x, y = _client(13, 16)
    server, clients = method.init(jax.random.key(0), 1)
    client = tree_ops.gather(clients, 0)
    v0 = client["variables"]
    info = ClientRound(jnp.int32(0), jnp.int32(method.setup.local_epochs))
    k1, k2 = jax.random.key(1), jax.random.key(2)
    update = jax.jit(lambda c, k: method.client_update(server, c, data, k, info)[0])
    client = update(update(client, k1), k2)
    e, b = method.setup.local_epochs, method.setup.batch_size
    ref, buf = _reference_train(v0, x, y, k1, e, b, 16)
    if name == "pfakd":  # the second phase starts from the received (initial) global body and its own head
        ref = tree_ops.with_part(ref, "body", tree_ops.part_of(v0, "body"))
    fresh, _ = _reference_train(ref, x, y, k2, e, b, 16)
    ref, buf = _reference_train(ref, x, y, k2, e, b, 16, opt_state=buf)
    _assert_close(client["variables"], ref)
    _assert_close(client["personal_opt_state" if name == "ditto" else "opt_state"], buf)
    assert max(float(jnp.max(jnp.abs(p - q)))
               for p, q in zip(jax.tree.leaves(client["variables"]), jax.tree.leaves(fresh))) > 1e-5


def test_persistent_momentum_fedavg_engine_keeps_each_clients_buffer():
    """Two FedAvg rounds with every client selected: each client's second local phase
    starts from the global model and its own first-round momentum buffer."""
    sizes = [7, 23, 1, 16, 12]
    x, y, idx = _data(MODEL.input_shape, sizes=sizes)
    train = stack_clients(x, y, idx)
    method = _local_method("fedavg", persistent_optimizer=True)
    eng = engine_lib.Engine(method, train, train, engine_config(len(sizes), client_mapping="vmap"))
    key = jax.random.key(5)
    init_key, run_key = jax.random.split(key)
    server, clients = eng.init(init_key)
    server, clients, _ = eng.run(server, clients, run_key, 2)
    e, b = method.setup.local_epochs, method.setup.batch_size
    ref_server, buffers = MODEL.init(init_key), [None] * len(sizes)
    for t in range(2):
        k_sel, _, k_clients = jax.random.split(engine_lib.round_keys(run_key, t)[0], 3)
        selected = np.asarray(engine_lib.select_clients(k_sel, len(sizes), len(sizes)))
        keys = jax.random.split(k_clients, len(sizes))
        trained = []
        for j, c in enumerate(selected):
            v, buffers[c] = _reference_train(ref_server, x[idx[c]], y[idx[c]], keys[j], e, b, max(sizes), buffers[c])
            trained.append(v)
        ref_server = _weighted_mean64(trained, [sizes[c] for c in selected])
    _assert_close(server["variables"], ref_server, tol=2e-5)
    for c in range(len(sizes)):
        _assert_close(tree_ops.gather(clients["opt_state"], c), buffers[c], tol=2e-5)


def test_persistent_momentum_fedrep_keeps_one_buffer_for_the_head_and_one_for_the_body():
    """Two FedRep local phases on an unchanged global body: each phase's head epoch and
    body epochs start from that part's buffer of the previous phase (PFLlib's two optimizers)."""
    method = _local_method("fedrep", persistent_optimizer=True)
    data, x, y = _client(13, 16)
    server, clients = method.init(jax.random.key(0), 1)
    client = tree_ops.gather(clients, 0)
    v0 = client["variables"]
    e, b = method.setup.local_epochs, method.setup.batch_size
    info = ClientRound(jnp.int32(0), jnp.int32(e))
    update = jax.jit(lambda c, k: method.client_update(server, c, data, k, info)[0])
    keys = [jax.random.key(1), jax.random.key(2)]
    client = update(update(client, keys[0]), keys[1])
    ref, buffers = v0, {"head": None, "body": None}
    for key in keys:
        ref = tree_ops.with_part(ref, "body", tree_ops.part_of(v0, "body"))  # the received global body
        for part, k, epochs in zip(("head", "body"), jax.random.split(key), (1, e)):
            ref, buffers[part] = _reference_train(ref, x, y, k, epochs, b, 16, buffers[part], part=part)
    _assert_close(client["variables"], ref)
    _assert_close(client["head_opt_state"], buffers["head"])
    _assert_close(client["body_opt_state"], buffers["body"])


def _kept_states(clients):
    return sorted(k for k in clients if k.endswith("opt_state"))


@pytest.mark.parametrize("name, kept", [("pfakd", ["opt_state"]), ("fedrep", ["body_opt_state", "head_opt_state"]),
                                        ("fedpac", ["body_opt_state", "head_opt_state"]), ("gpfl", ["opt_state"])])
def test_persistent_plain_sgd_equals_fresh_optimizer(name, kept):
    """Without momentum the run's optimizer has no state to keep: on == off, round for round
    (FedPAC's head optimizer has momentum 0.5 by default: set to 0 here)."""
    import optax

    sizes = [7, 23, 1, 16, 12]
    x, y, idx = _data(MODEL.input_shape, sizes=sizes)
    train = stack_clients(x, y, idx)
    hparams = get_method(name).hparams_type(head_momentum=0.0) if name == "fedpac" else None
    out = []
    for on in (False, True):
        setup = dataclasses.replace(_setup(MODEL), optimizer=optax.sgd, lr=0.1, persistent_optimizer=on)
        eng = engine_lib.Engine(get_method(name)(setup, hparams), train, train, engine_config(3))
        server, clients = eng.init(jax.random.key(0))
        server, clients, _ = eng.run(server, clients, jax.random.key(1), 2)
        out.append((server, clients["variables"]))
        assert _kept_states(clients) == (kept if on else [])
    _assert_close(out[0], out[1], tol=0)


def test_persistent_momentum_changes_the_next_round_and_is_kept_per_client():
    """FedPAC with momentum (its head and body buffers): a client's second round from its kept buffers
    differs from a fresh start; clients never selected keep their initial (zero) buffers."""
    sizes = [7, 23, 1, 16, 12]
    x, y, idx = _data(MODEL.input_shape, sizes=sizes)
    train = stack_clients(x, y, idx)
    out = []
    for on in (False, True):
        setup = dataclasses.replace(_setup(MODEL), persistent_optimizer=on)
        eng = engine_lib.Engine(get_method("fedpac")(setup), train, train, engine_config(2))
        server, clients = eng.init(jax.random.key(0))
        selected = []
        for t in range(3):
            server, clients, metrics = eng.round(server, clients, jax.random.key(t + 1), t)
            selected += list(np.asarray(metrics["selected"]))
        out.append(server["body"])
    never = sorted(set(range(len(sizes))) - set(int(c) for c in selected))
    for state in _kept_states(clients):
        norms = [sum(float(jnp.sum(jnp.abs(leaf))) for leaf in jax.tree.leaves(tree_ops.gather(clients[state], c)))
                 for c in range(len(sizes))]
        assert all(norms[c] == 0.0 for c in never) and all(norms[c] > 0.0 for c in set(selected)), (state, norms)
    assert max(float(jnp.max(jnp.abs(p - q))) for p, q in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1]))) > 1e-5


def test_persistent_optimizer_refused_by_methods_that_train_their_own_way():
    with pytest.raises(UserError, match="'fedrod' does not support train.persistent_optimizer"):
        _checked("fedrod", persistent_optimizer=True)


# ----------------------------------------------------------- all_clients_train
def _engine(name, count, all_clients_train, sizes=(7, 23, 1, 16, 12), **setup_options):
    x, y, idx = _data(MODEL.input_shape, sizes=list(sizes))
    train = stack_clients(x, y, idx)
    method = get_method(name)(dataclasses.replace(_setup(MODEL), lr=0.1, **setup_options))
    config = engine_config(count, all_clients_train=all_clients_train)
    return engine_lib.Engine(method, train, train, config), train


def test_all_clients_train_with_every_client_sampled_is_the_default_round():
    out = []
    for on in (False, True):
        eng, _ = _engine("fedavg", 5, on)
        server, clients = eng.init(jax.random.key(0))
        server, clients, metrics = eng.round(server, clients, jax.random.key(1), 0)
        out.append((server, clients, metrics["selected"], metrics["uploaded"]))
    _assert_close(out[0], out[1], tol=0)


def test_all_clients_train_every_client_trains_and_only_the_sampled_aggregate():
    """pFedMe, 2 of 5 sampled: every client's theta is its client_update from the global
    model; the server mixes in the mean of the 2 sampled clients' uploads only."""
    eng, train = _engine("pfedme", 2, True)
    method, n = eng.method, eng.num_clients
    server0, clients0 = eng.init(jax.random.key(0))
    server0, clients0 = jax.tree.map(np.asarray, (server0, clients0))
    round_key = jax.random.key(4)
    server, clients, metrics = eng.round(server0, clients0, round_key, 0)
    k_sel, _, k_clients = jax.random.split(round_key, 3)
    sampled = np.asarray(engine_lib.select_clients(k_sel, n, 2))
    order = [*sampled, *sorted(set(range(n)) - set(sampled))]
    keys = jax.random.split(k_clients, n)
    info = ClientRound(jnp.int32(0), jnp.int32(method.setup.local_epochs))
    update = jax.jit(lambda c, d, k: method.client_update(server0, c, ClientData(*d), k, info))
    results = {c: update(tree_ops.gather(clients0, c), tuple(tree_ops.gather(train, c)), keys[j])
               for j, c in enumerate(order)}
    for c in range(n):
        _assert_close(tree_ops.gather(clients, c), results[c][0])
        assert not np.allclose(tree_ops.gather(clients, c)["variables"]["params"]["head"]["logits"]["kernel"],
                               clients0["variables"]["params"]["head"]["logits"]["kernel"][c])
    uploads = jax.tree.map(lambda *a: jnp.stack(a), *[results[c][1] for c in sampled])
    ref_info = engine_lib.ServerRound(jnp.int32(0), jnp.asarray(sampled), train.n[sampled].astype(jnp.float32),
                                      jnp.ones(2, bool))
    ref_server, _ = method.server_update(server0, {}, uploads, ref_info)
    _assert_close(server, ref_server)
    assert sorted(np.asarray(metrics["selected"])[np.asarray(metrics["uploaded"])]) == sorted(sampled)


def test_all_clients_train_refused_by_a_method_whose_server_step_ignores_uploaded():
    ignores_uploaded = dataclasses.replace(get_method("fedavg"), name="ignores_uploaded",
                                           schedule=Schedule(aggregates_uploaded_only=False))
    x, y, idx = _data(MODEL.input_shape)
    train = stack_clients(x, y, idx)
    with pytest.raises(UserError, match="'ignores_uploaded' does not support train.all_clients_train"):
        engine_lib.Engine(ignores_uploaded(_setup(MODEL)), train, train,
                          engine_config(2, all_clients_train=True))


@pytest.mark.parametrize("name", method_sample.sample(  # one of each optimizer-state layout
    [m for m in method_names() if get_method(m).keeps_optimizer_state],
    ("local", "ditto", "fedrep", "knnper", "pfakd")))
def test_every_method_that_keeps_optimizer_state_keeps_it(name):
    """`keeps_optimizer_state` is a promise: with train.persistent_optimizer and momentum, after one round
    with every client selected, every client holds a momentum buffer that moved from its zero start."""
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment, validate
    from test_eval_protocols import EXTRA, SYNTHETIC

    cfg = config_lib.build(overrides=[f"method_name={name}", *SYNTHETIC, *EXTRA.get(name, []), "train.join_ratio=1.0",
                                      "train.persistent_optimizer=true", "train.momentum=0.9"])
    engine, key = build_experiment(validate(cfg), progress=False).engine, jax.random.key(0)
    server, clients = engine.init(key)
    _, clients, _, _ = engine.run_rounds(server, clients, key, 0, 1, 1, 1)
    kept = [k for k in clients if k.endswith("opt_state")]
    assert kept, (name, list(clients))
    for k in kept:
        moved = jnp.stack([jnp.any(leaf.reshape(leaf.shape[0], -1) != 0, axis=1)
                           for leaf in jax.tree.leaves(clients[k]) if jnp.issubdtype(leaf.dtype, jnp.floating)])
        assert bool(jnp.all(jnp.any(moved, axis=0))), (name, k)


@pytest.mark.parametrize("name", [m for m in method_names() if not get_method(m).keeps_optimizer_state])
def test_every_method_that_does_not_keep_optimizer_state_refuses_the_option(name):
    with pytest.raises(UserError, match="does not support train.persistent_optimizer"):
        _checked(name, persistent_optimizer=True)
