"""Ditto, APFL, FedAMP and FedProto (issue 14): kernels against float64 NumPy
loops, the published mechanisms, the engine against a per-client Python loop,
learning on real Fashion-MNIST, and option errors.

The per-client references share only the documented key contract with the
engine (round key -> selection / straggler / client keys; each client's
per-epoch shuffle, `local_training.epoch_order`); they train with an unpadded
Python loop over real batches and aggregate in float64 NumPy.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fmnist_two_class
import majority_baseline
import pfl_reference as ref
from fedjax_pfl import losses
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import attentive_mixing, local_training
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import prototypes
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.apfl import APFLConfig
from fedjax_pfl.methods.base import ClientRound, LocalSetup, ServerRound
from fedjax_pfl.methods.ditto import DittoConfig
from fedjax_pfl.methods.fedamp import FedAMPConfig
from fedjax_pfl.methods.fedproto import FedProtoConfig
from fedjax_pfl.models.networks import build_model

SIZES = [7, 15, 1, 10, 12]  # ragged, a one-sample client; few distinct batch shapes (fewer compiles)
N, B, E, S, C, LR = len(SIZES), 5, 2, 3, 4, 0.1
N_MAX = max(SIZES)


def _normalize(x):
    return x.astype(jnp.float32) / 255.0 - 0.5


MODEL = build_model("mlp", (6, 6, 1), C, hidden=(8,))


def _model():
    return MODEL


def _setup(optimizer=None, epochs=E):
    return LocalSetup(model=MODEL, optimizer=optimizer or optax.sgd(LR, momentum=0.9), batch_size=B,
                      local_epochs=epochs, normalize=_normalize, learning_rate=LR)


def _raw_data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(sum(SIZES), 6, 6, 1), dtype=np.uint8)
    y = rng.integers(0, C, size=sum(SIZES)).astype(np.int32)
    idx = np.split(np.arange(sum(SIZES)), np.cumsum(SIZES)[:-1])
    return x, y, idx


def _client_data(c):
    x, y, idx = _raw_data()
    return ClientData(*jax.tree.map(lambda a: a[c], tuple(stack_clients(x, y, idx))))


def _f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _assert_close(a, b, tol=1e-5):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=tol, atol=tol)


def _sq_dist(a, b):
    return float(sum(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2)
                     for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


# ------------------------------------------------------- reference training
def _batches(key, n, epochs):
    """The real batches of one client, in the engine's documented order."""
    sched_key, _ = jax.random.split(key)
    epoch_keys = jax.random.split(sched_key, E)
    for e in range(epochs):
        order = np.asarray(local_training.epoch_order(epoch_keys[e], n, N_MAX))[:n]
        for s in range(math.ceil(n / B)):
            yield e, s, order[s * B:(s + 1) * B]


def _logits(params, x):
    return _model().apply({"params": params}, _normalize(x), train=False).logits


def _features(params, x):
    return _model().apply({"params": params}, _normalize(x), train=False).features


def _ce(params, x, y):
    return losses.cross_entropy(_logits(params, x), jnp.asarray(y))


@functools.lru_cache(maxsize=None)
def _jit_grad(loss_fn, argnums=0):
    return jax.jit(jax.grad(loss_fn, argnums=argnums))


def _ref_sgd(loss_fn, params, x, y, key, *extra):
    """Per-client loop over real batches: SGD momentum 0.9 on loss_fn(params, xb, yb, *extra)."""
    opt = optax.sgd(LR, momentum=0.9)
    state = opt.init(params)
    grad = _jit_grad(loss_fn)
    for _, _, b in _batches(key, x.shape[0], E):
        updates, state = opt.update(grad(params, x[b], y[b], *extra), state, params)
        params = optax.apply_updates(params, updates)
    return params


def _prox_loss(p, xb, yb, anchor, weight):
    return _ce(p, xb, yb) + weight * 0.5 * tree_ops.squared_norm(tree_ops.sub(p, anchor))


def _proto_loss(p, xb, yb, global_protos, present, lam):
    f = _features(p, xb)
    target = jnp.where(present[yb][:, None], global_protos[yb], jax.lax.stop_gradient(f))
    return _ce(p, xb, yb) + lam * jnp.mean((f - target) ** 2)


def _mixed_loss(v, a, w, xb, yb):
    return losses.cross_entropy(a * _logits(v, xb) + (1 - a) * _logits(w, xb), jnp.asarray(yb))


def _weighted_mean64(trees, weights):
    w = np.asarray(weights, np.float64) / np.sum(weights)
    return jax.tree.map(lambda *a: sum(wi * np.asarray(ai, np.float64) for wi, ai in zip(w, a)), *trees)


def _round_plan(key, t):
    k_sel, _, k_clients = jax.random.split(jax.random.fold_in(key, t), 3)
    return np.asarray(engine_lib.select_clients(k_sel, N, S)), jax.random.split(k_clients, S)


def _run_engine(method, mapping, rounds, key):
    x, y, idx = _raw_data()
    train = stack_clients(x, y, idx)
    eng = engine_lib.Engine(method, train, train, engine_lib.EngineConfig(S, client_mapping=mapping))
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    for t in range(rounds):
        server, clients, _ = eng.round(server, clients, jax.random.fold_in(key, t), t)
    return eng, server, clients


# ------------------------------------------------- per-method reference loops
def _ref_ditto(rounds, key, lamda):
    x, y, idx = _raw_data()
    init_key, key = jax.random.split(key)
    w = _model().init(init_key)["params"]
    personal = [w] * N
    for t in range(rounds):
        selected, keys = _round_plan(key, t)
        trained = []
        for j, c in enumerate(selected):
            xc, yc = x[idx[c]], y[idx[c]]
            trained.append(_ref_sgd(_ce, w, xc, yc, keys[j]))
            personal[c] = _ref_sgd(_prox_loss, personal[c], xc, yc, keys[j], w, lamda)
        w = _weighted_mean64(trained, [SIZES[c] for c in selected])
    return w, personal


def _ref_apfl(rounds, key, alpha0, decay=0.02):
    """APFL's client loop written step by step: w on CE(w); v and alpha on the
    output mixture with w of the step start; alpha only at the round's first step."""
    x, y, idx = _raw_data()
    init_key, key = jax.random.split(key)
    w = _model().init(init_key)["params"]
    personal, local, alpha = [w] * N, [w] * N, [alpha0] * N
    opt = optax.sgd(LR, momentum=0.9)
    grad_w, grad_va = _jit_grad(_ce), _jit_grad(_mixed_loss, (0, 1))
    for t in range(rounds):
        selected, keys = _round_plan(key, t)
        trained = []
        for j, c in enumerate(selected):
            xc, yc = x[idx[c]], y[idx[c]]
            wc, v, a = w, personal[c], alpha[c]
            sw, sv = opt.init(wc), opt.init(v)
            for step, (_, _, b) in enumerate(_batches(keys[j], xc.shape[0], E)):
                gw = grad_w(wc, xc[b], yc[b])
                gv, ga = grad_va(v, a, wc, xc[b], yc[b])
                uw, sw = opt.update(gw, sw, wc)
                uv, sv = opt.update(gv, sv, v)
                wc, v = optax.apply_updates(wc, uw), optax.apply_updates(v, uv)
                if step == 0:
                    a = float(np.clip(a - LR * (float(ga) + decay * a), 0.0, 1.0))
            personal[c], local[c], alpha[c] = v, wc, a
            trained.append(wc)
        w = _weighted_mean64(trained, [SIZES[c] for c in selected])
    return w, personal, local, alpha


def _np_fedamp_mix(stored, alpha_k, sigma, rows):
    """u_i = sum_j xi_ij w_j by a float64 double loop over pairs (the paper's Eq. 8)."""
    flat = [np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(m)]) for m in stored]
    xi = np.zeros((len(rows), len(flat)))
    for r, i in enumerate(rows):
        for j in range(len(flat)):
            if j != i:
                d2 = np.sum((flat[i] - flat[j]) ** 2)
                xi[r, j] = alpha_k * np.exp(-d2 / sigma) / sigma
        xi[r, i] = 1.0 - xi[r].sum()
    u = [sum(xi[r, j] * flat[j] for j in range(len(flat))) for r in range(len(rows))]
    return xi, u


def _unflatten(vector, like):
    out, start = [], 0
    leaves, treedef = jax.tree.flatten(like)
    for a in leaves:
        out.append(vector[start:start + a.size].reshape(a.shape))
        start += a.size
    return jax.tree.unflatten(treedef, out)


def _ref_fedamp(rounds, key, hp):
    x, y, idx = _raw_data()
    init_key, key = jax.random.split(key)
    w0 = _model().init(init_key)["params"]
    personal, stored = [w0] * N, [w0] * N
    for t in range(rounds):
        selected, keys = _round_plan(key, t)
        _, u = _np_fedamp_mix(stored, hp.alpha_k, hp.sigma, list(selected))
        for j, c in enumerate(selected):
            anchor = jax.tree.map(jnp.float32, _unflatten(u[j], w0))
            personal[c] = _ref_sgd(_prox_loss, anchor, x[idx[c]], y[idx[c]], keys[j], anchor, hp.lamda / hp.alpha_k)
        for c in selected:
            stored[c] = personal[c]
    return personal, stored


def _np_prototypes(params, x, y):
    f = np.asarray(_features(params, x), np.float64)
    protos, counts = np.zeros((C, f.shape[1])), np.zeros(C)
    for k in range(C):
        if np.any(y == k):
            protos[k], counts[k] = f[y == k].mean(axis=0), np.sum(y == k)
    return protos, counts


def _np_aggregate(protos, counts, mode):
    out, present = np.zeros_like(protos[0]), np.zeros(C, bool)
    for k in range(C):
        w = [(n[k] if mode == "counts" else 1.0) for n in counts if n[k] > 0]
        p = [pr[k] for pr, n in zip(protos, counts) if n[k] > 0]
        if p:
            out[k] = sum(wi * pi for wi, pi in zip(w, p)) / sum(w)
            present[k] = True
    return out, present


def _ref_fedproto(rounds, key, lam):
    x, y, idx = _raw_data()
    init_key, key = jax.random.split(key)
    w0 = _model().init(init_key)["params"]
    personal = [w0] * N
    global_protos, present = np.zeros((C, 8)), np.zeros(C, bool)
    for t in range(rounds):
        selected, keys = _round_plan(key, t)
        protos, counts = [], []
        for j, c in enumerate(selected):
            xc, yc = x[idx[c]], y[idx[c]]
            gp, pr = jnp.asarray(global_protos, jnp.float32), jnp.asarray(present)
            personal[c] = _ref_sgd(_proto_loss, personal[c], xc, yc, keys[j], gp, pr, lam)
            p, n = _np_prototypes(personal[c], xc, yc)
            protos.append(p)
            counts.append(n)
        global_protos, present = _np_aggregate(protos, counts, "clients")
    return personal, global_protos, present


# --------------------------------------------------- engine == per-client loop
def test_ditto_engine_equals_per_client_loop():
    key = jax.random.key(3)
    ref_w, ref_personal = _ref_ditto(2, key, lamda=0.5)
    _, server, clients = _run_engine(get_method("ditto")(_setup(), DittoConfig(lamda=0.5)), "vmap", 2, key)
    _assert_close(server["variables"]["params"], ref_w)
    for c in range(N):
        _assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c])


def test_apfl_engine_equals_per_client_loop():
    key = jax.random.key(4)
    ref_w, ref_personal, ref_local, ref_alpha = _ref_apfl(2, key, alpha0=0.5)
    _, server, clients = _run_engine(get_method("apfl")(_setup()), "vmap", 2, key)
    _assert_close(server["variables"]["params"], ref_w)
    np.testing.assert_allclose(np.asarray(clients["alpha"]), ref_alpha, rtol=1e-5, atol=1e-6)
    assert np.any(np.abs(np.asarray(clients["alpha"]) - 0.5) > 1e-4)  # alpha moved for the selected clients
    for c in range(N):
        _assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c])
        _assert_close(tree_ops.gather(clients["local"]["params"], c), ref_local[c])


def test_fedamp_engine_equals_per_client_loop():
    """lax.map here (the other methods: vmap); three clients of five per round."""
    key = jax.random.key(5)
    hp = FedAMPConfig(alpha_k=0.5, sigma=2.0, lamda=0.2)
    ref_personal, ref_stored = _ref_fedamp(2, key, hp)
    _, server, clients = _run_engine(get_method("fedamp")(_setup(), hp), "map", 2, key)
    for c in range(N):
        _assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c], tol=2e-5)
        _assert_close(tree_ops.gather(server["params"], c), ref_stored[c], tol=2e-5)


def test_fedproto_engine_equals_per_client_loop():
    key = jax.random.key(6)
    ref_personal, ref_protos, ref_present = _ref_fedproto(2, key, lam=0.5)
    _, server, clients = _run_engine(get_method("fedproto")(_setup(), FedProtoConfig(lam=0.5)), "vmap", 2, key)
    np.testing.assert_array_equal(np.asarray(server["present"]), ref_present)
    np.testing.assert_allclose(np.asarray(server["prototypes"]), ref_protos, rtol=1e-5, atol=1e-5)
    for c in range(N):
        _assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c])


# ------------------------------------------------------------------- Ditto
def _one_client(method, client, c=1, key=jax.random.key(9), server=None):
    info = ClientRound(jnp.int32(0), jnp.int32(E))
    return jax.jit(method.client_update)(server, client, _client_data(c), key, info)


def test_ditto_lambda_zero_is_local_and_huge_lambda_stays_at_w():
    setup = _setup(optax.sgd(LR))
    w = _model().init(jax.random.key(0))
    v0 = jax.tree.map(lambda a: a + 1.0, w)  # a personal model far from w
    server = {"variables": w}
    free, _ = _one_client(get_method("ditto")(setup, DittoConfig(lamda=0.0)), {"variables": v0}, server=server)
    local, _ = _one_client(get_method("local")(setup), {"variables": v0}, server={})
    _assert_close(free["variables"], local["variables"], tol=1e-6)
    pulled, _ = _one_client(get_method("ditto")(setup, DittoConfig(lamda=1.0 / LR)), {"variables": v0},
                            server=server)
    start, gap_free, gap_pulled = (_sq_dist(m["params"], w["params"]) for m in
                                   (v0, free["variables"], pulled["variables"]))
    assert gap_free > 0.5 * start
    assert gap_pulled < 1e-3 * start


# -------------------------------------------------------------------- APFL
def test_output_mixture_cross_entropy_matches_float64():
    rng = np.random.default_rng(0)
    p, g = rng.normal(size=(6, C)), rng.normal(size=(6, C))
    y, mask = rng.integers(0, C, 6), np.array([1, 1, 1, 0, 1, 1], bool)

    def np_loss(a):
        z = a * p + (1 - a) * g
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return -np.mean(logp[np.arange(6), y][mask])

    a = 0.3
    value, grad = jax.value_and_grad(losses.output_mixture_cross_entropy, argnums=2)(
        jnp.asarray(p, jnp.float32), jnp.asarray(g, jnp.float32), jnp.float32(a), jnp.asarray(y), jnp.asarray(mask))
    np.testing.assert_allclose(value, np_loss(a), rtol=1e-5)
    np.testing.assert_allclose(grad, (np_loss(a + 1e-6) - np_loss(a - 1e-6)) / 2e-6, rtol=1e-4)


@pytest.mark.parametrize("mix", ["output", "params"])
def test_apfl_alpha_fixed_at_zero_is_fedavgs_local_model(mix):
    setup = _setup()
    method = get_method("apfl")(setup, APFLConfig(alpha=0.0, adapt_alpha=False, mix=mix))
    server, clients = method.init(jax.random.key(0), N)
    personal = jax.tree.map(lambda a: a + 0.3, tree_ops.gather(clients["variables"], 1))  # v_i != w
    client = {**tree_ops.gather(clients, 1), "variables": personal}
    out, upload = _one_client(method, client, server=server)
    _, fedavg_upload = _one_client(get_method("fedavg")(setup), {}, server=server)
    _assert_close(upload["variables"], fedavg_upload["variables"], tol=1e-6)
    _assert_close(out["local"], fedavg_upload["variables"], tol=1e-6)
    assert float(out["alpha"]) == 0.0
    x = _normalize(_client_data(1).x[:7])
    _assert_close(method.eval_logits(method.eval_variables(server, out, None, None), x),
                  setup.model.apply(fedavg_upload["variables"], x).logits, tol=1e-5)


def test_apfl_alpha_grows_when_the_personal_model_fits_better():
    """v_i trained on the client's data, w a fresh model: the mixed loss falls as alpha grows."""
    setup = _setup()
    method = get_method("apfl")(setup, APFLConfig(alpha=0.2, alpha_schedule="every_step", alpha_decay=0.0))
    server, clients = method.init(jax.random.key(0), N)
    local = get_method("local")(_setup(epochs=10))
    fitted, _ = jax.jit(local.client_update)({}, tree_ops.gather(clients, 1), _client_data(1), jax.random.key(1),
                                             ClientRound(jnp.int32(0), jnp.int32(10)))
    client = {**tree_ops.gather(clients, 1), "variables": fitted["variables"]}
    server = {"variables": _model().init(jax.random.key(42))}
    out, _ = _one_client(method, client, server=server)
    assert 0.2 < float(out["alpha"]) <= 1.0


# ------------------------------------------------------------------ FedAMP
def test_fedamp_weights_and_cloud_models_match_a_float64_double_loop():
    rng = np.random.default_rng(0)
    like = _model().init(jax.random.key(0))["params"]
    stored = [jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape) * 0.05 + 1.0, jnp.float32), like)
              for _ in range(N)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *stored)
    rows = [3, 0, 4]
    xi_ref, u_ref = _np_fedamp_mix(stored, 0.5, 3.0, rows)
    u, xi, _ = jax.jit(lambda m: attentive_mixing.personalized_cloud_models(m, 0.5, 3.0, rows=jnp.array(rows)))(
        stacked)
    np.testing.assert_allclose(np.asarray(xi), xi_ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(xi).sum(axis=1), 1.0, atol=1e-6)
    assert np.all(np.asarray(xi)[np.arange(3), rows] < 1.0) and np.all(np.asarray(xi) > 0)
    for r in range(len(rows)):
        _assert_close(tree_ops.gather(u, r), _unflatten(u_ref[r], like), tol=1e-5)


def test_fedamp_closer_models_get_larger_weights():
    d2 = jnp.array([[0.0, 1.0, 9.0], [1.0, 0.0, 4.0], [9.0, 4.0, 0.0]])
    xi = np.asarray(attentive_mixing.attention_weights(d2, 1.0, 3.0))
    assert xi[0, 1] > xi[0, 2] and xi[2, 1] > xi[2, 0]
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, atol=1e-6)


# ---------------------------------------------------------------- FedProto
@pytest.mark.parametrize("mode", ["counts", "clients"])
def test_fedproto_server_prototypes_are_the_weighted_mean(mode):
    rng = np.random.default_rng(1)
    protos = rng.normal(size=(S, C, 8)).astype(np.float32)
    counts = np.array([[3, 0, 5, 0], [1, 2, 0, 0], [4, 4, 4, 0]], np.float32)
    uploaded = np.array([True, True, False])
    method = get_method("fedproto")(_setup(), FedProtoConfig(proto_weights=mode))
    server, _ = method.init(jax.random.key(0), N)
    info = ServerRound(jnp.int32(0), jnp.arange(S), jnp.ones(S), jnp.asarray(uploaded))
    uploads = {"prototypes": jnp.asarray(protos), "counts": jnp.asarray(counts), "loss": jnp.zeros(S)}
    out, _ = method.server_update(server, {}, uploads, info)
    ref, present = _np_aggregate(list(protos[:2]), list(counts[:2]), mode)  # the dropped upload is excluded
    np.testing.assert_array_equal(np.asarray(out["present"]), present)
    np.testing.assert_allclose(np.asarray(out["prototypes"]), ref, rtol=1e-6, atol=1e-6)


def test_nearest_prototype_logits_match_float64():
    rng = np.random.default_rng(2)
    f, protos = rng.normal(size=(7, 5)), rng.normal(size=(C, 5))
    present = np.array([True, False, True, True])
    logits = np.asarray(prototypes.nearest_prototype_logits(jnp.asarray(f), jnp.asarray(protos),
                                                            jnp.asarray(present)))
    ref = -np.array([[np.sum((fi - p) ** 2) for p in protos] for fi in f])
    np.testing.assert_allclose(logits[:, present], ref[:, present], rtol=1e-5, atol=1e-5)
    assert np.all(logits[:, 1] < -1e29)
    ref[:, ~present] = -np.inf
    np.testing.assert_array_equal(logits.argmax(axis=1), ref.argmax(axis=1))


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("config_type,options", [
    (DittoConfig, {"lamda": -1.0}), (DittoConfig, {"lamda": float("inf")}),
    (APFLConfig, {"alpha": 1.5}), (APFLConfig, {"alpha_lr": 0.0}), (APFLConfig, {"mix": "weights"}),
    (APFLConfig, {"alpha_schedule": "sometimes"}), (APFLConfig, {"alpha_decay": -0.1}),
    (FedAMPConfig, {"sigma": 0.0}), (FedAMPConfig, {"alpha_k": -1.0}), (FedAMPConfig, {"lamda": -1.0}),
    (FedAMPConfig, {"start": "zero"}),
    (FedProtoConfig, {"lam": -1.0}), (FedProtoConfig, {"proto_weights": "size"}),
    (FedProtoConfig, {"eval_by": "knn"}),
])
def test_bad_options_raise_user_error(config_type, options):
    with pytest.raises(UserError):
        config_lib.method_options(config_type, options)


# ----------------------------------------------------------------- learning
@pytest.fixture(scope="module")
def fmnist_experiment(data_dir):
    """10 FMNIST clients, 2 classes each, 150/50 samples, MLP 64, Adam 1e-3, all clients per round."""
    from fedjax_pfl.runs.experiment import build_experiment

    overrides = fmnist_two_class.overrides(data_dir, "local")
    return build_experiment(config_lib.build(None, overrides)).engine


@pytest.fixture(scope="module")
def fmnist_fedavg_accuracy(fmnist_experiment):
    """FedAvg's accuracy after the same 3 rounds on the same clients."""
    return ref.accuracy_of("fedavg", fmnist_experiment, 3)


@pytest.mark.parametrize("method_name", ["ditto", "apfl", "fedamp", "fedproto", "local"])
def test_learns_on_fmnist(method_name, fmnist_experiment, fmnist_fedavg_accuracy):
    base = fmnist_experiment
    eng = engine_lib.Engine(get_method(method_name)(base.method.setup), base.train, base.test, base.config)
    first, last, metrics, server, clients = ref.run_engine(eng, 3)
    assert math.isfinite(last["loss"]) and math.isfinite(float(metrics["train_loss"]))
    majority = majority_baseline.from_engine(eng)
    assert first < 0.3 and last["accuracy"] > majority + 0.3, (first, last, majority)
    # personalized models beat FedAvg's global one on pathological label skew (each paper's table)
    assert last["accuracy"] > fmnist_fedavg_accuracy + 0.2, (last, fmnist_fedavg_accuracy)
    if method_name == "fedproto":  # the prototypes classify too (the flag), and they are all present
        assert bool(jnp.all(server["present"]))
        by_proto = engine_lib.Engine(get_method("fedproto")(base.method.setup, FedProtoConfig(eval_by="prototype")),
                                     base.train, base.test, base.config)
        eval_key = jax.random.split(jax.random.key(0))[1]  # run_engine's evaluation key
        assert by_proto.evaluate_summary(server, clients, eval_key)["accuracy"] > majority + 0.25
    if method_name == "apfl":
        alpha = np.asarray(clients["alpha"])
        assert np.all((alpha >= 0) & (alpha <= 1)) and np.any(alpha != 0.5)
    if method_name == "fedamp":  # the server step mixes: off-diagonal weights are non-zero
        _, xi = eng.method.anchors(server, jnp.arange(10))
        assert float(jnp.max(jnp.abs(xi - jnp.diag(jnp.diag(xi))))) > 1e-4
