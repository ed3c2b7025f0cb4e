"""pFedKD-WCL: the server KL gradient, the client loss, the round, learning on MNIST."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import majority_baseline
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl import losses
from fedjax_pfl.kernels import kd_server
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method, step_counted
from fedjax_pfl.methods.base import ClientRound
from fedjax_pfl.methods.pfedkd import PFedKDConfig
from fedjax_pfl.methods.step_counted import random_batch, random_batch_index
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

C = 3  # classes of the small problems


# ------------------------------------------------------------------ float64 references
def _np_mlp(params, x):
    """numpy float64 MLP: params = (W1, b1, W2, b2), relu hidden."""
    w1, b1, w2, b2 = params
    return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


def _np_log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _np_kl(p_logits, q_logits, t):
    """T^2 * mean_i KL(softmax(p/T) || softmax(q/T)) in float64."""
    lp, lq = _np_log_softmax(p_logits / t), _np_log_softmax(q_logits / t)
    return t * t * np.mean(np.sum(np.exp(lp) * (lp - lq), axis=1))


def _flat(params):
    return np.concatenate([np.ravel(p) for p in params])


def _unflat(vec, like):
    out, i = [], 0
    for p in like:
        out.append(vec[i:i + p.size].reshape(p.shape))
        i += p.size
    return out


def _fd_gradient(f, params, eps=1e-6):
    """Central finite differences of a float64 scalar function of a parameter list."""
    v = _flat(params)
    g = np.zeros_like(v)
    for i in range(v.size):
        d = np.zeros_like(v)
        d[i] = eps
        g[i] = (f(_unflat(v + d, params)) - f(_unflat(v - d, params))) / (2 * eps)
    return _unflat(g, params)


def _jnp_mlp(params, x):
    w1, b1, w2, b2 = params
    return jnp.maximum(x @ w1 + b1, 0.0) @ w2 + b2


@pytest.mark.parametrize("direction", ["teacher_first", "student_first"])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_server_gradient_equals_float64_finite_differences(direction, temperature):
    """grad_w of the KL over a padded client set, chunked, equals float64 central differences."""
    rng = np.random.default_rng(0)
    d, h, n, n_max = 4, 5, 11, 16
    w = [rng.normal(size=(d, h)), rng.normal(size=h) * 0.1, rng.normal(size=(h, C)), rng.normal(size=C) * 0.1]
    theta = [rng.normal(size=(d, h)), rng.normal(size=h) * 0.1, rng.normal(size=(h, C)), rng.normal(size=C) * 0.1]
    x = rng.normal(size=(n_max, d))
    x[n:] = 1e3  # padding rows must not count
    personal = _np_mlp(theta, x[:n])

    def reference_loss(wp):
        g = _np_mlp(wp, x[:n])
        return _np_kl(g, personal, temperature) if direction == "teacher_first" else _np_kl(personal, g, temperature)

    expected = _fd_gradient(reference_loss, w)
    with jax.enable_x64(True):
        wj = [jnp.asarray(a) for a in w]
        thetaj = [jnp.asarray(a) for a in theta]
        value, grad = kd_server.client_server_gradient(
            lambda p, xc: _jnp_mlp(p, xc), wj, lambda xc: _jnp_mlp(thetaj, xc), jnp.asarray(x), jnp.int32(n),
            temperature=temperature, direction=direction, chunk_size=4)
        # losses.kd_kl computes in float32 (by design), hence float32 tolerances
        np.testing.assert_allclose(float(value), reference_loss(w), rtol=1e-6)
        for got, want in zip(grad, expected):
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6)
        # one batch, no chunks: the same gradient
        single = kd_server.server_kl_gradient(lambda p: _jnp_mlp(p, jnp.asarray(x[:n])), wj,
                                              _jnp_mlp(thetaj, jnp.asarray(x[:n])), temperature, direction)
        for got, want in zip(single, expected):
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6)


def test_the_two_directions_differ_and_bad_direction_fails():
    rng = np.random.default_rng(1)
    g = jnp.asarray(rng.normal(size=(6, C)), jnp.float32)
    p = jnp.asarray(rng.normal(size=(6, C)) * 3, jnp.float32)
    a = kd_server.server_kl(g, p, 1.0, "teacher_first")
    b = kd_server.server_kl(g, p, 1.0, "student_first")
    assert abs(float(a) - float(b)) > 1e-3
    np.testing.assert_allclose(float(a), _np_kl(np.asarray(g, np.float64), np.asarray(p, np.float64), 1.0), rtol=1e-5)
    # the personal side carries no gradient
    dp = jax.grad(lambda q: kd_server.server_kl(g, q, 1.0, "student_first"))(p)
    assert float(jnp.max(jnp.abs(dp))) == 0.0
    with pytest.raises(ValueError):
        kd_server.server_kl(g, p, 1.0, "both")


def test_client_server_gradient_of_empty_client_is_zero():
    x = jnp.ones((5, 2))
    w = jnp.ones((2, C))
    value, grad = kd_server.client_server_gradient(lambda p, xc: xc @ p, w, lambda xc: xc @ (2 * w), x, 0)
    assert float(value) == 0.0 and float(jnp.max(jnp.abs(grad))) == 0.0


def test_weighted_kd_loss_matches_float64():
    """(1 - alpha) NLL + alpha T^2 KL(p_teacher || p_student) with the teacher fixed."""
    rng = np.random.default_rng(2)
    s, t, y = rng.normal(size=(7, C)), rng.normal(size=(7, C)), rng.integers(0, C, 7)
    alpha, temp = 0.3, 2.0
    nll = -np.mean(_np_log_softmax(s)[np.arange(7), y])
    want = (1 - alpha) * nll + alpha * _np_kl(t, s, temp)
    got = losses.weighted_kd_loss(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32), jnp.asarray(y), alpha, temp)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    dt = jax.grad(lambda q: losses.weighted_kd_loss(jnp.asarray(s, jnp.float32), q, jnp.asarray(y), alpha, temp))(
        jnp.asarray(t, jnp.float32))
    assert float(jnp.max(jnp.abs(dt))) == 0.0


# ------------------------------------------------------------------ the method on a small problem
SIZES = [9, 30, 17, 1, 25, 12]
INPUT = (3, 3, 1)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    total = sum(SIZES)
    x = rng.integers(0, 256, size=(total,) + INPUT).astype(np.uint8)
    y = rng.integers(0, C, size=total).astype(np.int32)
    bounds = np.cumsum([0] + SIZES)
    return x, y, [np.arange(bounds[i], bounds[i + 1]) for i in range(len(SIZES))]


def _setup(model, lr=0.1, steps=4, batch_size=5):
    return local_setup(model=model, optimizer=optax.sgd, lr=lr, batch_size=batch_size, local_epochs=steps,
                       normalize=lambda x: x.astype(jnp.float32) / 255.0 - 0.5)


def _method(name="pfedkd", **options):
    model = build_model("mlp", INPUT, C, hidden=(6,))
    cls = get_method(name)
    return cls(_setup(model), config_lib.method_options(cls.hparams_type, options))


def test_random_batch_draws_distinct_valid_rows():
    for n, n_max, b in [(30, 40, 5), (3, 40, 5), (7, 7, 20)]:
        idx, mask = random_batch_index(jax.random.key(n), n, n_max, b)
        idx, mask = np.asarray(idx), np.asarray(mask)
        real = idx[mask]
        assert len(real) == min(n, b) and len(set(real)) == len(real) and real.max() < n
    draws = jax.vmap(lambda k: random_batch_index(k, 30, 40, 5)[0])(jax.random.split(jax.random.key(0), 100))
    seen = set(np.asarray(draws).ravel().tolist())
    assert seen == set(range(30))  # every valid row is drawn sometime, padding never


def _reference_local_ce(method, params, data, key, steps):
    """R plain SGD steps on CE, each on the batch the method draws from the same key."""
    keys = jax.random.split(key, step_counted.local_steps(method.hparams, method.setup.local_epochs))

    @jax.jit
    def sgd(params, k):
        batch = random_batch(k, data, method.setup.batch_size, method.setup.normalize)
        ce = lambda p: losses.cross_entropy(step_counted.logits(method, p, batch.x), batch.y, batch.mask)  # noqa: E731
        g = jax.grad(ce)(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)

    for r in range(steps):
        params = sgd(params, jax.random.split(keys[r])[1])
    return params


def test_alpha_zero_is_pure_local_training_of_the_personal_model():
    method = _method(alpha=0.0)
    x, y, idx = _data()
    train = stack_clients(x, y, idx)
    data = ClientData(train.x[1], train.y[1], train.n[1])
    server, clients = method.init(jax.random.key(0), len(SIZES))
    client = jax.tree.map(lambda a: a[1], clients)
    key = jax.random.key(7)
    info = ClientRound(jnp.int32(0), jnp.int32(method.setup.local_epochs))
    update = jax.jit(method.client_update)
    out, upload = update(server, client, data, key, info)
    want = _reference_local_ce(method, client["variables"]["params"], data, key,
                               step_counted.local_steps(method.hparams, method.setup.local_epochs))
    for a, b in zip(jax.tree.leaves(out["variables"]["params"]), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the global model does not touch the personal model at alpha = 0, but does at alpha > 0
    other = jax.tree.map(lambda a: a * 3.0 + 0.1, server)
    out2, _ = update(other, client, data, key, info)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(out2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    kd_update = jax.jit(_method(alpha=0.5).client_update)
    o1, _ = kd_update(server, client, data, key, info)
    o2, _ = kd_update(other, client, data, key, info)
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(o1), jax.tree.leaves(o2))) > 1e-4


def test_stragglers_take_fewer_steps_and_masked_steps_change_nothing():
    method = _method(alpha=0.2, local_steps=8)
    x, y, idx = _data()
    train = stack_clients(x, y, idx)
    server, clients = method.init(jax.random.key(0), len(SIZES))
    client = jax.tree.map(lambda a: a[2], clients)
    data = ClientData(train.x[2], train.y[2], train.n[2])
    # E = 4 epochs -> R = 8 steps; a straggler with 2 epochs takes 4 steps
    assert int(step_counted.steps_this_round(method.hparams, method.setup.local_epochs, jnp.int32(2))) == 4
    assert int(step_counted.steps_this_round(method.hparams, method.setup.local_epochs, jnp.int32(1))) == 2
    empty = ClientData(train.x[2], train.y[2], jnp.int32(0))
    out, upload = jax.jit(method.client_update)(server, client, empty, jax.random.key(1), ClientRound(0, jnp.int32(4)))
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(client)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(upload["loss"]) == 0.0
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(upload["grad"]))
    del data


def test_personal_models_are_initialised_independently():
    method = _method()
    server, clients = method.init(jax.random.key(0), 4)
    flat = np.stack([_flat(jax.tree.leaves(jax.tree.map(lambda a: np.asarray(a)[i], clients))) for i in range(4)])
    glob = _flat(jax.tree.leaves(server))
    for i in range(4):
        for j in range(i + 1, 4):
            assert np.abs(flat[i] - flat[j]).max() > 1e-3
        assert np.abs(flat[i] - glob).max() > 1e-3


def authors_accumulation(grads, sizes):
    """What the authors' ``aggregate`` leaves in the global model's .grad, replayed step by step: per client,
    ``compute_kl_gradients`` zeroes the buffer (``global_model.zero_grad()``) and its ``backward`` writes g_i
    into it; ``aggregate`` then adds (n_i / sum n) g_i to that buffer."""
    buffer, total = None, float(sum(sizes))
    for g, n in zip(grads, sizes):
        buffer = np.zeros_like(g)  # zero_grad
        buffer = buffer + g  # kl_loss.backward()
        buffer = buffer + g * (n / total)  # g_param.grad.add_(grad * weight)
    return buffer


@pytest.mark.parametrize("direction,weights", [
    ("teacher_first", "sample_size"),  # the default: the authors' direction and aggregate as written
    ("student_first", "sample_size"),
    ("student_first", "uniform"),  # the paper's text
    ("teacher_first", "last_client"),  # the step the authors' code takes
])
def test_round_takes_one_sgd_step_with_the_combined_gradient(direction, weights):
    """An engine round: w_new = w - server_lr * sum_i a_i g_i, every g_i at the old w, recomputed in float64
    numpy from each selected client's trained personal model; a_i = n_i / sum n, 1/S, or the authors'
    accumulation loop replayed (`authors_accumulation`) over the clients in the order they were selected."""
    method = _method(alpha=0.1, temperature=1.5, server_lr=0.7, server_kl=direction, server_weights=weights)
    x, y, idx = _data()
    train = stack_clients(x, y, idx)
    eng = engine_lib.Engine(method, train, train, engine_config(3, client_mapping="vmap"))
    server, clients = eng.init(jax.random.key(0))
    w0 = jax.tree.map(np.asarray, server)
    server, clients, metrics = eng.round(server, clients, jax.random.key(1), 0)
    selected = np.asarray(metrics["selected"])
    norm, model = method.setup.normalize, method.model
    leaves0, treedef = jax.tree.flatten(w0["variables"]["params"])

    def logits64(vec, xc):  # the model in float64, parameters from a flat vector
        out, i = [], 0
        for a in leaves0:
            out.append(vec[i:i + a.size].reshape(a.shape))
            i += a.size
        return model.apply({"params": jax.tree.unflatten(treedef, out)}, xc, train=False).logits

    w_vec = _flat(leaves0).astype(np.float64)
    eps = 1e-6
    shifts = np.concatenate([np.eye(w_vec.size), -np.eye(w_vec.size)]) * eps
    grads, sizes = [], []
    with jax.enable_x64(True):
        many = jax.jit(jax.vmap(logits64, in_axes=(0, None)))
        for c in selected:
            xc = jnp.asarray(np.asarray(norm(x[idx[c]]), np.float64))
            theta = _flat(jax.tree.leaves(jax.tree.map(lambda a: np.asarray(a)[c], clients["variables"]["params"])))
            pers = np.asarray(many(jnp.asarray(theta[None], jnp.float64), xc))[0]
            shifted = np.asarray(many(jnp.asarray(w_vec[None] + shifts), xc))  # [2P, n, C]
            kl = [_np_kl(g, pers, 1.5) if direction == "teacher_first" else _np_kl(pers, g, 1.5) for g in shifted]
            kl = np.asarray(kl)
            grads.append((kl[:w_vec.size] - kl[w_vec.size:]) / (2 * eps))
            sizes.append(SIZES[c])
    sizes = np.asarray(sizes, np.float64)
    combined = {"sample_size": lambda: np.tensordot(sizes / sizes.sum(), np.stack(grads), axes=1),
                "uniform": lambda: np.mean(np.stack(grads), axis=0),
                "last_client": lambda: authors_accumulation(grads, sizes)}[weights]()
    want = w_vec - 0.7 * combined
    got = _flat(jax.tree.leaves(server["variables"]["params"]))
    assert np.abs(got - w_vec).max() > 1e-4  # the step is not trivially zero
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6)


def test_bad_options_raise_user_error():
    cls = get_method("pfedkd")
    for bad in [{"alpha": 1.5}, {"alpha": -0.1}, {"temperature": 0}, {"local_steps": 0}, {"server_lr": -1.0},
                {"server_kl": "reverse"}, {"local_steps": 2.5}, {"grad_chunk": 0}, {"kd_weight": 0.1},
                {"server_weights": "mean"}]:
        with pytest.raises(UserError):
            config_lib.method_options(cls.hparams_type, bad)
    assert config_lib.method_options(cls.hparams_type, {"server_kl": "student_first"}).server_kl == "student_first"
    assert PFedKDConfig().alpha == 0.1 and PFedKDConfig().temperature == 1.0


# ------------------------------------------------------------------ learning on real data
def mnist_config(data_dir, method, rounds=12, **method_options):
    """20 MNIST clients (Dirichlet 0.5, 200 train + 100 test each), 5 per round, B=20, lr 0.01, MLR."""
    overrides = ["data.name=mnist", f"data.data_dir={data_dir}", "partition.scheme=dirichlet",
                 "partition.num_clients=20", "partition.alpha=0.5", "partition.train_per_client=200",
                 "partition.test_per_client=100", "model.name=mlr", "train.join_ratio=0.25",
                 "train.batch_size=20", "train.lr=0.01", "train.local_epochs=20", f"train.rounds={rounds}",
                 f"method_name={method}"] + [f"method.{k}={v}" for k, v in method_options.items()]
    return config_lib.build(None, overrides)


def run_rounds(cfg):
    """-> (accuracy before training, after the rounds, the partition's per-client majority baseline)."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    eng = build_experiment(validate(cfg)).engine
    key = jax.random.key(cfg.seed)
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    first = eng.evaluate_summary(server, clients, key)["accuracy"]
    for t in range(cfg.train.rounds):
        round_key, eval_key = jax.random.split(jax.random.fold_in(key, t))
        server, clients, metrics = eng.round(server, clients, round_key, t)
    last = eng.evaluate_summary(server, clients, eval_key)
    assert math.isfinite(last["loss"])
    return first, last["accuracy"], majority_baseline.from_engine(eng)


def test_pfedkd_learns_on_mnist(data_dir):
    first, acc, majority = run_rounds(mnist_config(data_dir, "pfedkd", rounds=12))
    assert first < 0.25
    # measured over partition seeds 0-2: majority 0.35-0.40, pFedKD 0.79-0.81 (FedAvg 0.86-0.89)
    assert acc > majority + 0.3, (acc, majority)


def test_presets_parse_and_the_facade_exports_the_kernels():
    from pathlib import Path

    from fedjax_pfl.runs import experiment

    root = Path(__file__).resolve().parents[1] / "configs"
    seen = {}
    for name in ("pfedkd_mnist_mlr", "pfedkd_mnist_mlp", "pfedkd_synthetic"):
        cfg = config_lib.build(str(root / f"{name}.yaml"))
        experiment.validate(cfg)
        seen[name] = cfg
        assert cfg.method_name == "pfedkd" and cfg.train.batch_size == 20 and cfg.train.lr == 0.01
    assert seen["pfedkd_mnist_mlp"].model.hidden == (128,)
    assert seen["pfedkd_mnist_mlr"].partition.num_clients == 20 and seen["pfedkd_mnist_mlr"].train.join_ratio == 0.25
    assert seen["pfedkd_synthetic"].partition.num_clients == 100 and seen["pfedkd_synthetic"].train.join_ratio == 0.1
    for name in ("pfedkd_mnist_mlr", "pfedkd_mnist_mlp"):  # the authors' data (partition.client_dirichlet)
        p = seen[name].partition
        assert (p.scheme, p.size_range, p.max_classes_per_client, p.test_from) == (
            "client_dirichlet", (1165, 3834), 3, "split_train")
    assert seen["pfedkd_synthetic"].data.synthetic_size_factor == 5
    assert all(cfg.model.init == "torch" for cfg in seen.values())
    # the baselines reuse the presets: no pFedKD-only options in them
    for m in ("fedavg", "fedprox", "perfedavg", "pfedme"):
        cfg = config_lib.build(str(root / "pfedkd_mnist_mlr.yaml"), base={"method_name": m})
        experiment.validate(cfg)
    assert losses.server_kl is kd_server.server_kl and losses.client_server_gradient is kd_server.client_server_gradient
