"""DiversiFed (methods/diversifed.py): options, server storage, anchors under
partial participation, the proximal client step, the server step's
diagnostics, mixing and finiteness on the Dirichlet(0.5) preset, and learning
on FMNIST."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import float32_bounds as f32
import fmnist_two_class
import majority_baseline
import mixing_check
import pfl_reference as ref
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import model_distance as md
from fedjax_pfl.core import tree_ops
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import diversifed, get_method
from fedjax_pfl.methods.base import ClientRound, ServerRound
from fedjax_pfl.methods.diversifed import DIVERSIFED, DiversiFedConfig
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

N, FEATURES, CLASSES = 6, 8, 3
SIGMA = 25.0  # the kernel variant's scale for `_two_group_params` (63 parameters): within-group k ~ 1, across ~ 0.05
ALPHA05 = "configs/diversifed_fmnist_dirichlet0.5.yaml"


def _setup(epochs=2, lr=0.05):
    model = build_model("mlp", (FEATURES,), CLASSES, hidden=(5,))
    return local_setup(model=model, optimizer=optax.adam, lr=lr, batch_size=4, local_epochs=epochs,
                       normalize=lambda x: x.astype(jnp.float32))


def _data(seed=0, sizes=(9, 12, 5, 10, 7, 11)):
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    x = rng.normal(size=(total, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=total).astype(np.int32)
    idx, start = [], 0
    for n in sizes:
        idx.append(np.arange(start, start + n))
        start += n
    return stack_clients(x, y, idx)


def _two_group_params(method, key):
    """Stored models: clients 0-2 near one model, 3-5 near another."""
    _, clients = method.init(key, N)
    rng = np.random.default_rng(1)

    def leaf(a):
        centers = rng.normal(size=(2,) + a.shape[1:])
        rows = np.repeat(centers, N // 2, axis=0) + 0.05 * rng.normal(size=a.shape)
        return jnp.asarray(rows, a.dtype)

    return jax.tree.map(leaf, clients["variables"]["params"])


# ------------------------------------------------------------------- options
@pytest.mark.parametrize("options", [
    {"tau": 0.0}, {"tau": -1.0}, {"tau": float("nan")}, {"eta": -0.1}, {"lamda": -1.0},
    {"lamda": float("inf")}, {"sigma": 0.0}, {"sigma": -2.0}, {"start": "middle"}, {"form": "gaussian"},
])
def test_bad_options_raise_user_error(options):
    with pytest.raises(UserError):
        DiversiFedConfig(**options)
    with pytest.raises(UserError):
        config_lib.method_options(DiversiFedConfig, options)


def test_unknown_or_mistyped_option_is_a_user_error():
    with pytest.raises(UserError):
        config_lib.method_options(DiversiFedConfig, {"temperature": 1.0})
    with pytest.raises(UserError):
        config_lib.method_options(DiversiFedConfig, {"tau": "warm"})


def test_registered_and_options_parse():
    assert get_method("diversifed") is DIVERSIFED
    hp = config_lib.method_options(DiversiFedConfig, {"tau": 2, "eta": 0.5, "sigma": 3, "start": "anchor",
                                                      "form": "kernel"})
    assert hp.tau == 2.0 and hp.eta == 0.5 and hp.sigma == 3.0 and hp.start == "anchor" and hp.form == "kernel"


def test_defaults_are_the_papers_form():
    """The default is the written loss (logits d_ij / tau) and the client starts from its own model; the
    kernel reading is a named variant."""
    hp = DiversiFedConfig()
    assert hp.form == "distance" and hp.start == "own"
    method = DIVERSIFED(_setup())
    server, clients = method.init(jax.random.key(0), N)
    server = {"params": _two_group_params(method, jax.random.key(1))}
    selected = jnp.arange(N)
    prepared = jax.jit(method.prepare)(server, clients, selected)
    written, _, _ = md.mix_models(server["params"], hp.tau, hp.eta, rows=selected)
    kernel, _, _ = md.mix_models(server["params"], hp.tau, hp.eta, form="kernel", sigma=hp.sigma, rows=selected)
    # both float32 paths within the float32 bound of the exact written step (tests/float32_mixing_bound.py)
    u_exact, _, u_bound, _ = f32.exact_mixing(server["params"], hp.tau, hp.eta, selected)
    f32.assert_within(tree_ops.flatten_stacked(prepared["anchor"]), u_exact, u_bound, "prepare's anchors")
    f32.assert_within(tree_ops.flatten_stacked(written), u_exact, u_bound, "mix_models' anchors")
    for got, other in zip(jax.tree.leaves(prepared["anchor"]), jax.tree.leaves(kernel)):
        assert not np.allclose(got, other, rtol=1e-3, atol=1e-3)
    variant = DIVERSIFED(_setup(), DiversiFedConfig(form="kernel", sigma=SIGMA))
    u, xi = jax.jit(lambda s, rows: diversifed.anchors(variant, s, rows))(server, selected)
    _, xi_exact, _, xi_bound = f32.exact_mixing(server["params"], hp.tau, hp.eta, selected, form="kernel",
                                                sigma=SIGMA)
    f32.assert_within(xi, xi_exact, xi_bound, "the kernel variant's Xi")


# ---------------------------------------------------------------- mechanics
def test_init_stores_every_model_in_distinct_buffers():
    method = DIVERSIFED(_setup())
    server, clients = method.init(jax.random.key(0), N)
    leaves = [jax.tree.leaves(server["params"]), jax.tree.leaves(clients["variables"]["params"]),
              jax.tree.leaves(clients["anchor"])]
    for a, b, c in zip(*leaves):
        assert a.shape[0] == N
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        pointers = {a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer(), c.unsafe_buffer_pointer()}
        assert len(pointers) == 3
    # identical initial models: the anchors are the models themselves
    prepared = jax.jit(method.prepare)(server, clients, jnp.arange(N))
    for u, w in zip(jax.tree.leaves(prepared["anchor"]), leaves[0]):
        np.testing.assert_allclose(u, w, rtol=1e-6, atol=1e-7)


def test_prepare_uses_all_stored_models_and_attracts_own_group():
    method = DIVERSIFED(_setup(), DiversiFedConfig(tau=1.0, eta=1e-3))
    server, clients = method.init(jax.random.key(0), N)
    server = {"params": _two_group_params(method, jax.random.key(1))}
    selected = jnp.array([4, 1])
    chosen = tree_ops.gather(clients, selected)
    prepared = jax.jit(method.prepare)(server, chosen, selected)
    u_exact, _, u_bound, _ = f32.exact_mixing(server["params"], 1.0, 1e-3, selected)
    f32.assert_within(tree_ops.flatten_stacked(prepared["anchor"]), u_exact, u_bound, "prepare's anchors")
    w = np.asarray(tree_ops.flatten_stacked(server["params"]))
    u = np.asarray(tree_ops.flatten_stacked(prepared["anchor"]))
    groups = {4: (w[3:].mean(0), w[:3].mean(0)), 1: (w[:3].mean(0), w[3:].mean(0))}
    for row, i in enumerate([4, 1]):
        own, other = groups[i]
        assert np.linalg.norm(u[row] - own) < np.linalg.norm(w[i] - own)
        assert np.linalg.norm(u[row] - other) > np.linalg.norm(w[i] - other)


def test_server_stores_only_arrived_uploads():
    method = DIVERSIFED(_setup())
    server, clients = method.init(jax.random.key(0), N)
    selected = jnp.array([5, 2, 0])
    new = jax.tree.map(lambda a: a[selected] + 1.0, server["params"])
    info = ServerRound(jnp.int32(0), selected, jnp.ones(3), jnp.array([True, False, True]))
    out, _ = method.server_update(server, tree_ops.gather(clients, selected), {"params": new, "loss": jnp.zeros(3)},
                                  info)
    for before, after in zip(jax.tree.leaves(server["params"]), jax.tree.leaves(out["params"])):
        before, after = np.asarray(before), np.asarray(after)
        np.testing.assert_array_equal(after[[5, 0]], before[[5, 0]] + 1.0)
        np.testing.assert_array_equal(after[[1, 2, 3, 4]], before[[1, 2, 3, 4]])


@pytest.mark.parametrize("start", ["own", "anchor"])
def test_client_trains_toward_its_anchor(start):
    data = _data()
    client0 = tree_ops.gather(DIVERSIFED(_setup()).init(jax.random.key(0), N)[1], 0)
    data0 = jax.tree.map(lambda a: a[0], data)
    anchor = jax.tree.map(lambda a: a + 0.5, client0["anchor"])
    client0 = {**client0, "anchor": anchor}
    info = ClientRound(jnp.int32(0), jnp.int32(2))
    key = jax.random.key(3)

    def train(lamda):
        method = DIVERSIFED(_setup(), DiversiFedConfig(lamda=lamda, start=start))
        out, upload = jax.jit(method.client_update)({}, client0, data0, key, info)
        assert math.isfinite(float(upload["loss"]))
        jax.tree.map(np.testing.assert_array_equal, upload["params"], out["variables"]["params"])
        return out

    def gap(out):
        return float(jnp.sqrt(tree_ops.squared_norm(tree_ops.sub(out["variables"]["params"], anchor))))

    free, pulled = train(0.0), train(100.0)
    start_gap = float(jnp.sqrt(tree_ops.squared_norm(tree_ops.sub(client0["variables"]["params"], anchor))))
    assert gap(pulled) < 0.5 * gap(free)
    # lamda = 0 is Local's client step from the client's own model (start='own') or from u_i ('anchor')
    begin = client0["variables"] if start == "own" else {**client0["variables"], "params": anchor}
    local = get_method("local")(_setup())
    out_local, _ = jax.jit(local.client_update)({}, {"variables": begin}, data0, key, info)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), out_local["variables"],
                 free["variables"])
    if start == "own":
        assert gap(free) > 0.5 * start_gap
    else:
        assert gap(free) < 0.5 * start_gap


def test_partial_participation_round():
    """Selected clients get anchors from all N stored models; the server stores their uploads."""
    data = _data()
    method = DIVERSIFED(_setup(), DiversiFedConfig(tau=0.5, eta=0.01))
    eng = engine_lib.Engine(method, data, data, engine_config(clients_per_round=3,
                                                                        client_mapping="vmap"))
    server, clients = eng.init(jax.random.key(0))
    server = {"params": _two_group_params(method, jax.random.key(1))}
    clients = {**clients, "variables": {**clients["variables"],
                                        "params": jax.tree.map(jnp.copy, server["params"])}}
    stored_before = jax.tree.map(np.asarray, server["params"])
    server, clients, metrics = eng.round(server, clients, jax.random.key(7), 0)
    selected = np.asarray(metrics["selected"])
    others = np.setdiff1d(np.arange(N), selected)
    expected_u, _, _ = md.mix_models(stored_before, 0.5, 0.01, rows=jnp.asarray(selected))
    for got, exp in zip(jax.tree.leaves(clients["anchor"]), jax.tree.leaves(expected_u)):
        np.testing.assert_allclose(np.asarray(got)[selected], exp, rtol=1e-5, atol=1e-5)
    for stored, before, trained in zip(jax.tree.leaves(server["params"]), jax.tree.leaves(stored_before),
                                       jax.tree.leaves(clients["variables"]["params"])):
        stored = np.asarray(stored)
        np.testing.assert_array_equal(stored[selected], np.asarray(trained)[selected])
        np.testing.assert_array_equal(stored[others], before[others])
        assert not np.allclose(stored[selected], before[selected])


# -------------------------------------------------------------- diagnostics
def test_round_diagnostics_report_the_server_step():
    """self-weight, mass on others, attracting / repelling parts and distances of this round's Xi."""
    method = DIVERSIFED(_setup(), DiversiFedConfig(tau=1.0, eta=0.01))
    server = {"params": _two_group_params(method, jax.random.key(1))}
    selected = jnp.array([4, 1, 2])
    info = ServerRound(jnp.int32(3), selected, jnp.ones(3), jnp.ones(3, bool))
    moved = {"params": jax.tree.map(lambda a: a.at[0].multiply(3.0), server["params"])}  # after the round
    out = jax.jit(method.round_diagnostics)(server, moved, {}, info)
    _, xi, d = md.mix_models(server["params"], 1.0, 0.01, rows=selected)
    xi, d = np.asarray(xi, np.float64), np.asarray(d, np.float64)
    own = xi[np.arange(3), np.asarray(selected)]
    others = xi.copy()
    others[np.arange(3), np.asarray(selected)] = 0.0
    off = ~np.eye(N, dtype=bool)
    d_after = np.asarray(md.pairwise_distances(moved["params"]), np.float64)
    step = md.step_diagnostics(md.pairwise_sq_distances(server["params"]), jnp.asarray(xi, jnp.float32), 1.0, 0.01,
                               rows=selected)
    expected = {"self_weight": own.mean(), "other_weight": np.abs(others).sum(1).mean(),
                "attraction": np.clip(others, 0, None).sum(1).mean(), "repulsion": np.clip(others, None, 0).sum(1).mean(),
                "distance_mean": d[off].mean(), "distance_max": d[off].max(),
                "distance_max_growth": d_after[off].max() - d[off].max(),
                **{name: float(value) for name, value in step.items()}}  # tested against float64 in test_model_distance
    assert set(out) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(float(out[name]), value, rtol=1e-5, atol=1e-7, err_msg=name)
    assert out["self_weight"] < 1 and out["attraction"] > 0 and out["repulsion"] < 0


def _collapsed_models(far_distance, seed=0):
    """The geometry of a collapsed federation (40 models on `_setup`'s network): 39 models about 0.5 apart
    around one point, and one model ``far_distance`` away from it."""
    method = DIVERSIFED(_setup())
    _, clients = method.init(jax.random.key(0), 40)
    like = clients["variables"]["params"]
    p = md.num_parameters(like)
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=p)
    w = np.tile(rng.normal(size=p), (40, 1)) + rng.normal(size=(40, p)) * 0.5 / np.sqrt(2 * p)
    w[39] = w[39] + far_distance * direction / np.linalg.norm(direction)
    return tree_ops.unflatten_stacked(jnp.asarray(w, jnp.float32), like)


def test_diagnostics_read_a_collapsed_federation():
    """39 of 40 models merged and one expelled (the state the written loss reached in parameter units at tau 1,
    eta 0.1): the rows' softmax is a hard max, the step bound binds on every row but the expelled one's, 39 of
    40 models lie within 1% of the mean distance of another, and the largest distance grew by the round's
    outward move; the anchors are the mean of the others (self-weight about 1e-4 in the merged rows)."""
    method = DIVERSIFED(_setup(), DiversiFedConfig(tau=1.0, eta=0.1, distance_unit="raw"))
    before, after = _collapsed_models(3430.0), _collapsed_models(3436.9)
    selected = jnp.arange(40)
    info = ServerRound(jnp.int32(400), selected, jnp.ones(40), jnp.ones(40, bool))
    out = {k: float(v) for k, v in jax.jit(method.round_diagnostics)({"params": before}, {"params": after}, {},
                                                                     info).items()}
    assert out["softmax_entropy_min"] < 1e-3 and out["softmax_entropy_mean"] < 0.1 * math.log(39), out
    assert out["bound_rows"] == 39.0 and out["merged_fraction"] == pytest.approx(39 / 40), out
    assert out["distance_max_growth"] == pytest.approx(6.9, abs=0.05), out
    assert out["distance_mean"] == pytest.approx(172.0, rel=0.01), out
    assert out["self_weight"] == pytest.approx(0.026, abs=0.002), out
    assert out["attraction"] == pytest.approx(0.975, abs=0.002), out
    assert -0.002 < out["repulsion"] < 0.0, out
    # a federation spread out evenly reads as graded: no row's step cut, nothing merged
    spread = DIVERSIFED(_setup(), DiversiFedConfig(tau=1.0, eta=0.01, distance_unit="mean"))
    models = jax.tree.map(lambda a: jnp.asarray(np.random.default_rng(1).normal(size=a.shape), a.dtype), before)
    even = {k: float(v) for k, v in jax.jit(spread.round_diagnostics)({"params": models}, {"params": models}, {},
                                                                      info).items()}
    assert even["bound_rows"] == 0.0 and even["merged_fraction"] == 0.0 and even["distance_max_growth"] == 0.0
    assert even["softmax_entropy_min"] > 0.95 * math.log(39), even


def _alpha05_engine(data_dir, *extra):
    """The Dirichlet(0.5) preset with its method options (the defaults); ``extra`` overrides the data's size."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    cfg = config_lib.build(ALPHA05, [f"data.data_dir={data_dir}", *extra])
    assert cfg.method == {} and cfg.method_name == "diversifed"
    return build_experiment(validate(cfg)).engine


def test_preset_mixes_within_five_rounds_and_stays_finite_for_fifty(data_dir):
    """The alpha=0.5 preset (its model, training and method options; 20 of its 40 clients, 30 train / 20
    test samples a client and B = 30, so each epoch is still one step on all of a client's samples, to
    keep it cheap): the server step after 5 rounds of training mixes other clients in, near models
    attracting and far ones repelling; after 50 rounds, losses, models and distances are finite, the
    models still mix, far pairs still repel, and the models beat the majority class."""
    eng = _alpha05_engine(data_dir, "partition.num_clients=20", "partition.train_per_client=30",
                          "partition.test_per_client=20", "train.batch_size=30", "train.rounds=50")
    init_key, key = jax.random.split(jax.random.key(0))
    server, clients = eng.init(init_key)
    for t in range(50):  # one compiled round, called 50 times
        server, clients, metrics = eng.round(server, clients, jax.random.fold_in(key, t), t)
        if t == 5:  # this round's server step mixes the models of 5 rounds of training
            after_five = {k: float(v) for k, v in metrics["diagnostics"].items()}
    assert 0.0 < after_five["self_weight"] < 0.9, after_five
    assert after_five["attraction"] > 0.1 and after_five["repulsion"] < 0.0, after_five

    last = eng.evaluate_summary(server, clients, key)
    assert math.isfinite(last["loss"]) and math.isfinite(float(metrics["train_loss"]))
    assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(server))
    diagnostics = {k: float(v) for k, v in metrics["diagnostics"].items()}  # round 50's server step
    assert all(math.isfinite(v) for v in diagnostics.values()), diagnostics
    assert 0.0 < diagnostics["self_weight"] < 0.9, diagnostics
    assert diagnostics["attraction"] > 0.1 and diagnostics["repulsion"] < 0.0, diagnostics
    majority = majority_baseline.from_engine(eng)
    assert last["accuracy"] > majority + 0.25, (last, majority)  # 0.79 against 0.37 here


# ------------------------------------------------------------------ learning
def test_diversifed_learns_on_fmnist(data_dir):
    """10 FMNIST clients, 2 classes each, 150/50 samples, MLP 64, Adam 1e-3, all clients, 3 rounds."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    overrides = fmnist_two_class.overrides(data_dir, "diversifed")
    cfg = config_lib.build(None, overrides)
    eng = build_experiment(validate(cfg)).engine
    first, last, metrics, server, _ = ref.run_engine(eng, cfg.train.rounds)
    assert math.isfinite(last["loss"]) and math.isfinite(float(metrics["train_loss"]))
    mixing_check.assert_clients_mix(metrics)
    assert first < 0.3
    majority, fedavg = majority_baseline.from_engine(eng), ref.accuracy_of("fedavg", eng, cfg.train.rounds)
    assert last["accuracy"] > majority + 0.3, (last, majority)
    assert last["accuracy"] > fedavg + 0.2, (last, fedavg)  # the paper's claim on pathological label skew
    # the server step is active on the trained models: distances > 0, Xi finite, off-diagonal non-zero
    hp = eng.method.hparams
    u, xi, d = jax.jit(lambda p: md.mix_models(p, hp.tau, hp.eta, form=hp.form, sigma=hp.sigma))(server["params"])
    xi = np.asarray(xi)
    assert np.all(np.isfinite(xi)) and np.all(np.asarray(d)[~np.eye(10, dtype=bool)] > 0)
    assert np.abs(xi - np.diag(np.diag(xi))).max() > 0
