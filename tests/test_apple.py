"""APPLE (methods/apple.py, core_mixing.py): the core mix against float64 NumPy, the
decaying proximal schedule, p_i a valid mix where required, the engine against a
per-client loop, learning on FMNIST."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import majority_baseline
import mixing_check
import pfl_reference as ref
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import core_mixing
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.apple import APPLE, APPLEConfig
from fedjax_pfl.methods.base import ClientRound
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup, run_facts


def _setup(epochs=1, lr=0.1, model_name="mlp"):
    kwargs = {"hidden": (8,)} if model_name == "mlp" else {}
    model = build_model(model_name, (6, 6, 1) if model_name == "mlp" else (8, 8, 3), 4, **kwargs)
    return local_setup(model=model, optimizer=optax.sgd, lr=lr, batch_size=ref.B, local_epochs=epochs,
                       normalize=ref.normalize)


# ------------------------------------------------------------------- kernel
def test_mix_cores_equals_float64_loop():
    rng = np.random.default_rng(0)
    n = 5
    cores = {"w": rng.normal(size=(n, 3, 2)), "b": rng.normal(size=(n, 2))}
    own = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))}
    p = rng.normal(size=n)
    got = core_mixing.mix_cores(jnp.asarray(p, jnp.float32), jax.tree.map(jnp.float32, cores), 2,
                                jax.tree.map(jnp.float32, own))
    for k in cores:
        want = sum(p[j] * (own[k] if j == 2 else cores[k][j]) for j in range(n))
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-5)


def test_weighted_rows_gradients_equal_tensordot_in_float64():
    """The mix's hand-written backward (rows @ g) against autodiff of tensordot, both arguments, also vmapped."""
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        weights, stacked = jnp.asarray(rng.normal(size=4)), jnp.asarray(rng.normal(size=(4, 3, 2)))
        probe = jnp.asarray(rng.normal(size=(3, 2)))
        for f in (core_mixing.weighted_rows, lambda w, s: jnp.tensordot(w, s, axes=1)):
            assert f(weights, stacked).dtype == jnp.float64
        loss = lambda f: lambda w, s: jnp.sum(jnp.sin(f(w, s)) * probe)  # noqa: E731
        got = jax.grad(loss(core_mixing.weighted_rows), argnums=(0, 1))(weights, stacked)
        want = jax.grad(loss(lambda w, s: jnp.tensordot(w, s, axes=1)), argnums=(0, 1))(weights, stacked)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        batch = jnp.asarray(rng.normal(size=(5, 4)))  # five clients' weights over the same rows
        got = jax.vmap(jax.grad(loss(core_mixing.weighted_rows)), in_axes=(0, None))(batch, stacked)
        want = jax.vmap(jax.grad(loss(lambda w, s: jnp.tensordot(w, s, axes=1))), in_axes=(0, None))(batch, stacked)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_sequential_round_never_copies_the_cores_stack_into_its_transpose():
    """The p gradient as rows @ g: XLA:CPU keeps the [N, P] stack as it lies in the local-step loop (autodiff's
    g @ rows^T form copied it, transposed, at every step: benchmarks/apple_mix.py times both forms)."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        apple_mix = importlib.import_module("apple_mix")
    finally:
        sys.path.pop(0)
    *_, compiled, _, biggest = apple_mix.compiled_round("weighted_rows", clients=4, per_client=100)
    assert apple_mix.transposed_stack_copies(compiled.as_text(), 4, biggest) == 0


def test_proximal_schedule():
    mu, L = 0.1, 10
    for r in [0, 3, 9, 10, 25]:
        exp = float(core_mixing.proximal_coefficient(r, mu, L, "exponential"))
        cos = float(core_mixing.proximal_coefficient(r, mu, L, "cosine"))
        assert exp == pytest.approx(mu * 1e-3 ** (r / L) if r < L else 0.0, rel=1e-5)
        assert cos == pytest.approx(mu * (math.cos(math.pi * r / L) + 1) / 2 if r < L else 0.0, rel=1e-5, abs=1e-9)
    assert float(core_mixing.proximal_coefficient(0, 0.0, L)) == 0.0
    p0 = core_mixing.initial_relationships(4, sizes=[1, 1, 2, 4])
    np.testing.assert_allclose(p0, [0.125, 0.125, 0.25, 0.5])
    assert float(core_mixing.relationship_penalty(jnp.ones(4), p0, 2.0)) == pytest.approx(2 * float(jnp.sum((1 - p0) ** 2)))


# ---------------------------------------------------------------- mechanism
def _one_client_round(method, round_indices, seed=0):
    """Client 1's update from the initial state, once per round index (one compile per method)."""
    xs, ys = ref.client_arrays((6, 6, 1), seed=seed)
    data = ref.stacked(xs, ys)
    server, clients = method.init(jax.random.key(0), len(ref.SIZES))
    client = tree_ops.gather(clients, 1)
    d1 = jax.tree.map(lambda a: a[1], data)
    update = jax.jit(method.client_update)
    outs = [update(server, client, d1, jax.random.key(2), ClientRound(jnp.int32(r), jnp.int32(method.setup.local_epochs)))
            for r in round_indices]
    return server, clients, outs


def test_p_starts_as_a_valid_mix_and_the_proximal_term_keeps_it_there():
    method = APPLE(_setup(epochs=3), APPLEConfig(mu=1.0, p_lr=0.2, reg_rounds=4))
    server, clients, ((held, _), (free, _)) = _one_client_round(method, (0, 4))  # coef(0) = mu; coef(4) = 0
    np.testing.assert_allclose(clients["p"], np.full((5, 5), 0.2))
    # the initial personalized model is the p^0 mix of the (distinct) initial cores
    mix = jax.tree.map(lambda c: c.mean(axis=0), server["cores"])
    ref.assert_close(tree_ops.gather(clients["variables"], 3), mix, tol=1e-6)
    kernel = server["cores"]["params"]["head"]["logits"]["kernel"]
    assert float(jnp.abs(kernel[0] - kernel[1]).max()) > 0

    drift = lambda out: float(jnp.abs(out["p"] - 0.2).max())
    assert drift(free) > 1e-2
    assert drift(held) < 0.2 * drift(free)  # the proximal term keeps p near p^0 (a valid mix)
    p = np.asarray(free["p"])
    assert p.min() < 0 or abs(p.sum() - 1) > 1e-3  # once it is off, p is unconstrained (authors' code)


def test_simplex_option_and_what_is_trained_and_uploaded():
    method = APPLE(_setup(epochs=3), APPLEConfig(mu=0.0, p_lr=1.0, simplex=True))
    server, _, ((out, upload),) = _one_client_round(method, (0,))
    p = np.asarray(out["p"])
    assert p.min() >= 0 and abs(p.sum() - 1) < 1e-5
    assert np.abs(p - 0.2).max() > 1e-2  # it did learn
    # only the own core trains and is uploaded; the personalized model is the p-mix with
    # the others' cores as received
    cores = server["cores"]
    ref.assert_close(upload["core"], out["core"], tol=0)
    assert not np.allclose(tree_ops.flatten_stacked(jax.tree.map(lambda a: a[None], out["core"])),
                           tree_ops.flatten_stacked(jax.tree.map(lambda a: a[1:2], cores)))
    mix = core_mixing.mix_cores(out["p"], cores["params"], 1, out["core"]["params"])
    ref.assert_close(out["variables"]["params"], mix, tol=1e-6)


PFLLIB = {"same_init": True, "core_after_round": "mix", "p_gradient": "layer_mean", "p_momentum": 0.0,
          "schedule": "cosine", "mu": 0.0, "sequential": True}  # PFLlib's protocol, as the DiversiFed tables set it


def test_pfllib_protocol_replaces_the_core_by_the_personalized_mix():
    method = APPLE(_setup(epochs=3), APPLEConfig(p_lr=0.5, **PFLLIB))
    server, clients, ((out, upload),) = _one_client_round(method, (0,))
    kernel = server["cores"]["params"]["head"]["logits"]["kernel"]
    np.testing.assert_array_equal(kernel[0], kernel[1])  # one initialization for every core
    ref.assert_close(out["core"], out["variables"], tol=0)  # the core is now the personalized mix
    ref.assert_close(upload["core"], out["variables"], tol=0)  # and so is what the server sends around
    trained, _ = _one_client_round(APPLE(_setup(epochs=3), APPLEConfig(p_lr=0.5, **{**PFLLIB,
                                                                                    "core_after_round": "trained"})),
                                   (0,))[2][0]
    ref.assert_close(out["variables"], trained["variables"], tol=1e-6)  # the same training and mix
    ref.assert_close(upload["trained"], trained["core"], tol=1e-6)  # the trained core, for the later clients
    gap = np.abs(tree_ops.flatten_stacked(jax.tree.map(lambda a: a[None], trained["core"]))
                 - tree_ops.flatten_stacked(jax.tree.map(lambda a: a[None], out["core"]))).max()
    assert gap > 1e-3  # which the trained core is not
    assert 0 < float(jnp.abs(out["p"] - 0.2).max()) < 1e-2  # p moves, slowly (layer-averaged gradient)


def test_layer_mean_gradient_equals_float64_reference():
    rng = np.random.default_rng(3)
    n = 4
    cores = {"w": rng.normal(size=(n, 3, 2)), "b": rng.normal(size=(n, 2))}
    own = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))}
    target = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))}
    p = rng.uniform(size=n)
    f32 = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)  # noqa: E731

    def loss(q):  # a quadratic in the mixed model: its gradient there is g = mix - target
        layered = core_mixing.layer_mean_relationships(q, f32(cores))
        mixed = core_mixing.mix_cores(layered, f32(cores), 1, f32(own))
        return 0.5 * sum(jnp.sum((mixed[k] - target[k]) ** 2) for k in mixed)

    got = np.asarray(jax.grad(loss)(jnp.asarray(p, jnp.float32)))
    mix = {k: sum(p[j] * (own[k] if j == 1 else cores[k][j]) for j in range(n)) for k in cores}
    g = {k: mix[k] - target[k] for k in cores}
    want = [np.mean([np.mean(g[k] * (own[k] if j == 1 else cores[k][j])) for k in cores]) for j in range(n)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss(jnp.asarray(p, jnp.float32))),
                               0.5 * sum(np.sum(g[k] ** 2) for k in g), rtol=1e-5)  # the same model


@pytest.mark.parametrize("options", [{"mu": -1.0}, {"reg_rounds": -1}, {"schedule": "linear"}, {"p_lr": 0.0},
                                     {"p_momentum": 1.0}, {"p_gradient": "mean"}, {"core_after_round": "own"},
                                     {"sequential": "yes"}, {"core_step": "sgd"}])
def test_bad_options_raise_user_error(options):
    with pytest.raises(UserError):
        config_lib.method_options(APPLEConfig, options)


def test_batchnorm_model_is_refused():
    model = build_model("resnet8", (8, 8, 3), 4)
    setup = local_setup(model=model, optimizer=optax.sgd, lr=0.1, batch_size=4, local_epochs=1, normalize=ref.normalize)
    with pytest.raises(UserError, match="BatchNorm"):
        APPLE.check_run(APPLEConfig(), run_facts(setup))


# ------------------------------------------------------- engine = per-client loop
def _apple_mix(params, cores, others):
    """p_c * own core + sum over the other clients j of p_j * core_j (a plain Python sum)."""
    n = others.shape[0]
    own_weight = jnp.sum(params["p"] * (1.0 - others))
    return jax.tree.map(lambda o, stacked: own_weight * o + sum(params["p"][j] * others[j] * stacked[j]
                                                                for j in range(n)), params["core"], cores)


def _apple_loss(params, xb, yb, cores, others, coef, *, model):
    logits = model.apply({"params": _apple_mix(params, cores, others)}, xb).logits
    n = others.shape[0]
    return losses.cross_entropy(logits, yb) + coef * jnp.sum((params["p"] - 1.0 / n) ** 2)


def _pfllib_gradient(params, xb, yb, cores, others, coef, *, model):
    """PFLlib's clientapple.py step direction, written out: the core's gradient through the mix, and for
    each j the mean over parameter tensors of mean(g * core_j), g the gradient at the mixed model."""
    mixed = _apple_mix(params, cores, others)
    g = jax.grad(lambda m: losses.cross_entropy(model.apply({"params": m}, xb).logits, yb))(mixed)
    own_weight = jnp.sum(params["p"] * (1.0 - others))
    n = others.shape[0]

    def core_j(j):
        return jax.tree.map(lambda o, stacked: others[j] * stacked[j] + (1.0 - others[j]) * o, params["core"], cores)

    leaves = lambda tree: jax.tree.leaves(tree)  # noqa: E731
    p_grad = jnp.stack([sum(jnp.mean(a * b) for a, b in zip(leaves(g), leaves(core_j(j)))) / len(leaves(g))
                        for j in range(n)])
    return {"core": jax.tree.map(lambda a: own_weight * a, g), "p": p_grad + 2 * coef * (params["p"] - 1.0 / n)}


def _reference(method, rounds, key, pfllib=False):
    model, hp = method.model, method.hparams
    xs, ys = ref.client_arrays(model.input_shape)
    n = len(ref.SIZES)
    init_key, key = jax.random.split(key)
    init_keys = jax.random.split(init_key, n)
    cores = [model.init(init_keys[0] if pfllib else k)["params"] for k in init_keys]
    own, p = list(cores), [np.full(n, 1.0 / n)] * n
    personal = [None] * n
    loss = functools.partial(_pfllib_gradient if pfllib else _apple_loss, model=model)
    p_opt = optax.sgd(hp.p_lr) if pfllib else optax.sgd(hp.p_lr, momentum=0.9)
    core_lr = 0.1 * n if hp.core_step == "pfllib" else 0.1  # PFLlib's by-hand step: N x train.lr
    opt = optax.multi_transform({"core": optax.sgd(core_lr), "p": p_opt}, {"core": "core", "p": "p"})
    for t in range(rounds):
        selected, keys = ref.round_keys(key, t)
        coef = hp.mu * 1e-3 ** (t / hp.reg_rounds) if t < hp.reg_rounds else 0.0
        seen = list(cores)  # pfllib: clients in turn, each seeing the cores the earlier ones trained
        for j, c in enumerate(selected):
            snapshot = jax.tree.map(lambda *a: jnp.stack(a), *seen)
            others = jnp.asarray(np.arange(n) != c, jnp.float32)
            start = {"core": own[c], "p": jnp.asarray(p[c], jnp.float32)}
            trained = ref.train_epochs(loss, opt, start, xs[c], ys[c], keys[j], epochs=1,
                                       extra=(snapshot, others, jnp.float32(coef)), gradient=pfllib)
            own[c], p[c] = trained["core"], np.asarray(trained["p"])
            personal[c] = _apple_mix(trained, snapshot, others)
            if pfllib:  # the later clients see its trained core; its core becomes the personalized mix
                seen[c] = own[c]
                own[c] = personal[c]
        for c in selected:
            cores[c] = own[c]
    return own, p, personal, cores


@pytest.mark.parametrize("pfllib,core_step", [(False, "run"), (True, "run"), (True, "pfllib")])
def test_engine_equals_per_client_loop(pfllib, core_step):
    options = {**PFLLIB, "schedule": "exponential", "mu": 0.5, "p_lr": 5.0} if pfllib else {"p_lr": 0.05}
    options["core_step"] = core_step
    method = APPLE(_setup(), APPLEConfig(**{"mu": 0.5, "reg_rounds": 4, **options}))
    key = jax.random.key(4)
    ref_own, ref_p, ref_personal, ref_cores = _reference(method, 2, key, pfllib)
    xs, ys = ref.client_arrays(method.model.input_shape)
    data = ref.stacked(xs, ys)
    eng = engine_lib.Engine(method, data, data, engine_config(ref.S, client_mapping="vmap"))
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    server, clients, _ = eng.run(server, clients, key, 2)
    for c in range(len(ref.SIZES)):
        ref.assert_close(tree_ops.gather(clients["core"]["params"], c), ref_own[c])
        ref.assert_close(tree_ops.gather(server["cores"]["params"], c), ref_cores[c])
        np.testing.assert_allclose(clients["p"][c], ref_p[c], rtol=1e-5, atol=1e-6)
        if ref_personal[c] is not None:
            ref.assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c])
    assert np.abs(np.asarray(clients["p"]) - 0.2).max() > 1e-4


# ------------------------------------------------------------------ learning
def test_apple_learns_on_fmnist(data_dir):
    eng = ref.fmnist_engine(data_dir, "apple", ("method.reg_rounds=2",))
    first, last, metrics, server, _ = ref.run_engine(eng, 3)
    assert math.isfinite(float(metrics["train_loss"]))
    mixing_check.assert_clients_mix(metrics)  # p moved weight onto the others' cores
    # measured over partition seeds 0-2: majority 0.55, FedAvg 0.50-0.61, APPLE 0.94-0.97
    majority, fedavg = majority_baseline.from_engine(eng), ref.fmnist_fedavg_accuracy(data_dir, 3)
    assert first < 0.4 and last["accuracy"] > majority + 0.3, (first, last, majority)
    assert last["accuracy"] > fedavg + 0.2, (last, fedavg)  # the paper's claim on pathological label skew
