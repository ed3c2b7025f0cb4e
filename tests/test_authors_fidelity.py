"""Six baselines as their authors ran them (issue 25): the engine's every-client step
(FedALA), BatchNorm masks in FedRoD and FedALA, FedBABU's whole-model fine-tuning,
pFedMe's weight decay, FedRep's head/body split and Per-FedAvg's two-step
adaptation, each against what the old code did differently."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_pfl.core import tree_ops
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import adaptive_aggregation as ala
from fedjax_pfl.kernels import local_training
from fedjax_pfl.kernels.local_training import Batch
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.base import ClientRound, LocalSetup, Method, ServerRound
from fedjax_pfl.methods.fedrod import PERSONAL
from fedjax_pfl.methods.step_counted import random_batch_index
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.runs import config as config_lib

SIZES = [7, 23, 13, 16, 12]
C, B = 3, 5
SHAPE = (4, 4, 1)


def _normalize(x):
    return x.astype(jnp.float32) / 255.0 - 0.5


def _train_data(seed=0):
    rng = np.random.default_rng(seed)
    total = sum(SIZES)
    x = rng.integers(0, 256, size=(total, *SHAPE), dtype=np.uint8)
    y = rng.integers(0, C, size=total).astype(np.int32)
    return stack_clients(x, y, np.split(np.arange(total), np.cumsum(SIZES)[:-1]))


def _client_data(c=2):
    return ClientData(*tree_ops.gather(tuple(_train_data()), c))


def _setup(model_name="mlp", epochs=2, lr=0.1, shape=SHAPE, batch_size=B):
    kwargs = {"hidden": (6,)} if model_name == "mlp" else {}
    return LocalSetup(model=build_model(model_name, shape, C, **kwargs), optimizer=optax.sgd(lr), batch_size=batch_size,
                      local_epochs=epochs, normalize=_normalize, learning_rate=lr)


def _method(name, setup=None, **options):
    cls = get_method(name)
    return cls(setup or _setup(), config_lib.method_options(cls.hparams_type, options))


def _host(tree):
    return jax.tree.map(np.array, tree)


def _steps_heard(fn, *args):
    """(done, total) of every local step ``fn(*args)`` takes, in order (local_training.reporting_steps)."""
    heard = []

    def report(kind, done, total, value):
        jax.debug.callback(lambda d, t: heard.append((int(d), int(t))), done, total, ordered=True)

    with local_training.reporting_steps(report):
        out = jax.jit(fn)(*args)
    jax.effects_barrier()
    return out, heard


# ------------------------------------------------------------ the engine's every-client step


class _Counting(Method):
    """A method whose every-client step counts, per client, the steps it took and records what it saw."""

    name = "counting"
    updates_every_client = True

    def init(self, key, num_clients):
        clients = {"steps": jnp.zeros(num_clients, jnp.int32), "version": jnp.zeros(num_clients, jnp.int32),
                   "n": jnp.zeros(num_clients, jnp.int32), "draw": jnp.zeros(num_clients)}
        return {"variables": self.init_variables(key), "version": jnp.zeros((), jnp.int32)}, clients

    def client_update(self, server, client, data, key, info):
        return client, {"loss": jnp.zeros(())}

    def server_update(self, server, clients, uploads, info):
        return {**server, "version": server["version"] + 1}, clients

    def update_every_client(self, server, client, data, key, round_index):
        return {"steps": client["steps"] + 1, "version": server["version"], "n": data.n,
                "draw": jax.random.uniform(key)}

    def eval_variables(self, server, client, data, key):
        return server["variables"]


def _counting_engine(mapping="vmap"):
    train = _train_data()
    config = engine_lib.EngineConfig(2, client_mapping=mapping)
    return engine_lib.Engine(_Counting(_setup()), train, train, config), train


def test_every_client_step_runs_on_all_clients_after_the_server_step():
    eng, train = _counting_engine()
    key = jax.random.key(0)
    server, clients = eng.init(key)
    for t in range(3):
        round_key = engine_lib.round_keys(key, t)[0]
        server, clients, metrics = eng.round(server, clients, round_key, t)
        assert len(set(np.asarray(metrics["selected"]).tolist())) == 2  # 2 of 5 selected, all 5 stepped
        np.testing.assert_array_equal(clients["steps"], t + 1)
        np.testing.assert_array_equal(clients["version"], t + 1)  # the server state after this round's step
        np.testing.assert_array_equal(clients["n"], train.n)
        want = jax.vmap(jax.random.uniform)(engine_lib.every_client_keys(round_key, len(SIZES)))
        np.testing.assert_array_equal(clients["draw"], want)


@pytest.mark.parametrize("mapping", ["map", "chunked"])
def test_every_client_step_under_fused_rounds_mappings_and_the_experiment_axis(mapping):
    """4 rounds in one fused call (any mapping) == 4 single calls; 2 seeds on the experiment axis == each alone."""
    eng, _ = _counting_engine(mapping)
    key = jax.random.key(1)
    server, clients = eng.init(key)
    for t in range(4):
        server, clients, _ = eng.round(server, clients, engine_lib.round_keys(key, t)[0], t)
    want = _host((server, clients))
    fused = eng.run_rounds(*eng.init(key), key, 0, 4, 4, 2)[:2]
    jax.tree.map(np.testing.assert_array_equal, _host(fused), want)
    keys = jnp.stack([key, jax.random.key(7)])
    servers, stacked = eng.init_batched(keys)
    servers, stacked, _, _ = eng.run_rounds_batched(servers, stacked, keys, 0, 4, 4, 2)
    jax.tree.map(np.testing.assert_array_equal, _host(jax.tree.map(lambda a: a[0], (servers, stacked))), want)
    other = eng.run_rounds(*eng.init(jax.random.key(7)), jax.random.key(7), 0, 4, 4, 2)[:2]
    jax.tree.map(np.testing.assert_array_equal, _host(jax.tree.map(lambda a: a[1], (servers, stacked))), _host(other))


# ------------------------------------------------------------------------------------ FedALA


def test_fedala_updates_and_evaluates_clients_that_were_not_selected():
    """After every round each client, selected or not, holds the ALA of its model with the NEW global model:
    its body equals the new global body (layers=1 adapts the head alone), and a client that did not train
    this round changed anyway."""
    method = _method("fedala", layers=1)
    train = _train_data()
    eng = engine_lib.Engine(method, train, train, engine_lib.EngineConfig(2, client_mapping="vmap"))
    key = jax.random.key(3)
    server, clients = eng.init(key)
    for t in range(3):
        before = _host(clients)
        server, clients, metrics = eng.round(server, clients, engine_lib.round_keys(key, t)[0], t)
        idle = sorted(set(range(len(SIZES))) - set(np.asarray(metrics["selected"]).tolist()))
        assert len(idle) == 3
        for c in range(len(SIZES)):  # layers=1: the whole body is the new global body
            body = tree_ops.gather(clients["variables"], c)["params"]["body"]
            jax.tree.map(np.testing.assert_array_equal, _host(body), _host(server["variables"])["params"]["body"])
        for c in idle:
            old, new = (tree_ops.gather(v["variables"]["params"]["head"], c) for v in (before, clients))
            assert not np.allclose(old["logits"]["kernel"], new["logits"]["kernel"]), (t, c)
        assert bool(np.all(clients["started"]))  # every client ran ALA in round 0 already
    # evaluation tests that ALA-initialised model
    data = ClientData(*tree_ops.gather(tuple(train), 0))
    got = method.eval_variables(server, tree_ops.gather(clients, 0), data, key)
    jax.tree.map(np.testing.assert_array_equal, got, tree_ops.gather(clients["variables"], 0))


# --------------------------------------------------------------------- BatchNorm masks


def _padded_batches(seed=0):
    """(3 real rows alone, the same + 3 zero rows, the same + 3 rows of noise), masks marking the real rows."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(3, 8, 8, 3)), jnp.float32)
    y = jnp.asarray([0, 2, 1])
    pad_y = jnp.zeros(3, jnp.int32)
    mask = jnp.arange(6) < 3
    noise = jnp.asarray(rng.normal(size=(3, 8, 8, 3)) * 5 + 3, jnp.float32)
    padded_y = jnp.concatenate([y, pad_y])
    return (Batch(x, y, jnp.ones(3, bool)), Batch(jnp.concatenate([x, jnp.zeros_like(x)]), padded_y, mask),
            Batch(jnp.concatenate([x, noise]), padded_y, mask))


def _assert_same_over_padding(objective, variables):
    outs = [jax.jit(objective)(variables, batch, jax.random.key(0)) for batch in _padded_batches()]
    for out in outs[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), out, outs[0])


def _bn_setup():
    return _setup("resnet8", shape=(8, 8, 3), batch_size=6)


def test_fedrod_batchnorm_statistics_ignore_padding_rows():
    method = _method("fedrod", _bn_setup())
    server, clients = method.init(jax.random.key(0), 1)
    generic = server["variables"]
    variables = {**generic, "params": {**generic["params"], PERSONAL: tree_ops.gather(clients["head"], 0)}}
    _assert_same_over_padding(method.objective(jnp.asarray([3.0, 1.0, 2.0])), variables)  # loss and batch_stats


def test_fedala_weight_learning_loss_ignores_padding_rows():
    method = _method("fedala", _bn_setup())
    server, clients = method.init(jax.random.key(0), 1)
    base = server["variables"]
    local_top = ala.top_of(base["params"], method.top_layers)
    global_top = jax.tree.map(lambda a: a + 0.1, local_top)
    weights = {"params": jax.tree.map(lambda a: 0.5 * a[0], clients["weights"])}
    _assert_same_over_padding(method.ala_objective(base, local_top, global_top), weights)


# ----------------------------------------------------------------------------------- FedBABU


def test_fedbabu_fine_tunes_the_whole_model_for_pfllibs_ten_epochs_by_default():
    method = _method("fedbabu")
    assert (method.hparams.finetune_epochs, method.hparams.finetune_part) == (10, "all")
    server, clients = method.init(jax.random.key(0), 1)
    client = tree_ops.gather(clients, 0)
    server = {"body": jax.tree.map(lambda a: a + 0.01, server["body"])}  # a "trained" global body
    data = _client_data(2)  # 13 samples, B = 5: 3 steps an epoch
    tuned, heard = _steps_heard(method.eval_variables, server, client, data, jax.random.key(1))
    assert heard == [(i + 1, 30) for i in range(30)]  # 10 epochs
    body, head = tuned["params"]["body"], tuned["params"]["head"]
    assert not np.allclose(body["mlp"]["dense0"]["kernel"], server["body"]["params"]["mlp"]["dense0"]["kernel"])
    assert not np.allclose(head["logits"]["kernel"], client["variables"]["params"]["head"]["logits"]["kernel"])
    head_only = _method("fedbabu", finetune_part="head")
    kept = jax.jit(head_only.eval_variables)(server, client, data, jax.random.key(1))
    jax.tree.map(np.testing.assert_array_equal, kept["params"]["body"], server["body"]["params"])


# ------------------------------------------------------------------------------------ pFedMe


def _softmax_ce_grad64(w, b, x, y):
    """Gradient (dW, db) of the mean cross-entropy of the linear model x @ w + b, float64."""
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return x.T @ p, p.sum(0)


def _batches64(data, keys):
    """The float64 (x, y) of the random batches `random_batch_index` draws from ``keys`` (all rows real here)."""
    out = []
    for k in keys:
        index, mask = random_batch_index(k, data.n, data.y.shape[0], B)
        assert bool(np.all(mask))
        index = np.asarray(index)
        x = np.asarray(data.x)[index].reshape(B, -1).astype(np.float64) / 255.0 - 0.5
        out.append((x, np.asarray(data.y)[index]))
    return out


def _linear64(params):
    logits = params["head"]["logits"]
    return np.asarray(logits["kernel"], np.float64), np.asarray(logits["bias"], np.float64)


def test_pfedme_inner_step_has_the_authors_weight_decay():
    """theta <- theta - plr (grad f(theta) + lamda (theta - w_loc) + mu theta), K times per batch; then
    w_loc <- w_loc - eta lamda (w_loc - theta); against float64 on a linear model."""
    lamda, plr, k_inner, eta, steps, mu = 2.0, 0.05, 3, 0.1, 3, 0.2
    assert _method("pfedme").hparams.weight_decay == 0.001  # the authors' pFedMeOptimizer mu
    setup = _setup("mlr", epochs=steps, lr=eta)
    method = _method("pfedme", setup, lamda=lamda, personal_lr=plr, K=k_inner, local_steps=steps, weight_decay=mu)
    server, clients = method.init(jax.random.key(0), 1)
    data = _client_data(2)
    key = jax.random.key(4)
    run = jax.jit(method.client_update)
    out, upload = run(server, tree_ops.gather(clients, 0), data, key, ClientRound(0, jnp.int32(steps)))
    keys = [jax.random.split(k, 2)[1] for k in jax.random.split(key, steps)]  # random_batch_steps' batch keys
    theta = list(_linear64(server["variables"]["params"]))
    local = list(theta)
    for x, y in _batches64(data, keys):
        for _ in range(k_inner):
            grads = _softmax_ce_grad64(*theta, x, y)
            theta = [t - plr * (g + lamda * (t - w) + mu * t) for t, g, w in zip(theta, grads, local)]
        local = [w - eta * lamda * (w - t) for w, t in zip(local, theta)]
    for got, want in ((out["variables"]["params"], theta), (upload["variables"]["params"], local)):
        for a, b in zip(_linear64(got), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    plain = _method("pfedme", setup, lamda=lamda, personal_lr=plr, K=k_inner, local_steps=steps, weight_decay=0.0)
    undecayed, _ = jax.jit(plain.client_update)(server, tree_ops.gather(clients, 0), data, key,
                                                ClientRound(0, jnp.int32(steps)))
    assert np.abs(_linear64(undecayed["variables"]["params"])[0] - theta[0]).max() > 1e-3


def test_pfedme_theta_can_start_from_the_clients_previous_theta():
    """theta_start=previous (the pFedKD authors' copy): the K inner steps start from the client's stored
    theta_i, not from w; the local model w_loc still starts from w. Against float64 on a linear model."""
    lamda, plr, k_inner, eta, steps = 2.0, 0.05, 3, 0.1, 2
    setup = _setup("mlr", epochs=steps, lr=eta)
    options = dict(lamda=lamda, personal_lr=plr, K=k_inner, local_steps=steps, weight_decay=0.0)
    method = _method("pfedme", setup, theta_start="previous", **options)
    server, clients = method.init(jax.random.key(0), 1)
    client = jax.tree.map(lambda a: a + 0.3, tree_ops.gather(clients, 0))  # a theta_i away from w
    data, key = _client_data(2), jax.random.key(5)
    out, upload = jax.jit(method.client_update)(server, client, data, key, ClientRound(0, jnp.int32(steps)))
    keys = [jax.random.split(k, 2)[1] for k in jax.random.split(key, steps)]
    theta, local = list(_linear64(client["variables"]["params"])), list(_linear64(server["variables"]["params"]))
    for x, y in _batches64(data, keys):
        for _ in range(k_inner):
            grads = _softmax_ce_grad64(*theta, x, y)
            theta = [t - plr * (g + lamda * (t - w)) for t, g, w in zip(theta, grads, local)]
        local = [w - eta * lamda * (w - t) for w, t in zip(local, theta)]
    for got, want in ((out["variables"]["params"], theta), (upload["variables"]["params"], local)):
        for a, b in zip(_linear64(got), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    from_global, _ = jax.jit(_method("pfedme", setup, **options).client_update)(
        server, client, data, key, ClientRound(0, jnp.int32(steps)))
    assert np.abs(_linear64(from_global["variables"]["params"])[0] - theta[0]).max() > 1e-3


def test_pfedme_server_can_average_uniformly():
    """aggregate=uniform (the pFedKD authors' copy): weight 1/S per arrived upload, whatever n_i."""
    server, clients = _method("pfedme").init(jax.random.key(0), 3)
    ups = {"variables": jax.tree.map(lambda a: jnp.stack([a + 1.0, a + 4.0, a + 9.0]), server["variables"])}
    info = ServerRound(0, jnp.arange(3), jnp.asarray([3.0, 1.0, 5.0]), jnp.asarray([True, True, False]))
    for aggregate, shift in (("uniform", 2.5), ("samples", (3 * 1.0 + 1 * 4.0) / 4)):
        new, _ = _method("pfedme", aggregate=aggregate).server_update(server, clients, ups, info)
        for a, b in zip(jax.tree.leaves(new["variables"]), jax.tree.leaves(server["variables"])):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b) + shift, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------ FedRep


def _fedrep_steps(epochs=2, client_epochs=None, **options):
    method = _method("fedrep", _setup(epochs=epochs), **options)
    server, clients = method.init(jax.random.key(0), 1)
    client = tree_ops.gather(clients, 0)
    variables = method.receive(server, client)
    info = ClientRound(jnp.int32(0), jnp.int32(client_epochs or epochs))
    (trained, _, _), heard = _steps_heard(method.local_phase, server, client, variables, _client_data(2),
                                          jax.random.key(1), info)
    for part in ("body", "head"):  # both phases trained
        assert not np.allclose(*(np.concatenate([np.ravel(a) for a in jax.tree.leaves(v["params"][part])])
                                 for v in (trained, variables)))
    return [total for _, total in heard]


def test_fedrep_trains_the_head_then_the_body_with_both_splits():
    """13 samples, B = 5: 3 steps an epoch. The step totals of the two phases, in order."""
    assert _fedrep_steps(epochs=2) == [3] * 3 + [6] * 6  # PFLlib: head 1 epoch, then body E = 2
    # the authors' split (local_ep 11, local_rep_ep 1 in their scripts): head 10 epochs, then body 1
    assert _fedrep_steps(epochs=11, head_epochs=10, body_epochs=1) == [30] * 30 + [3] * 3
    # a straggler training 2 of E = 4 epochs takes body_epochs * 2 // 4 = 1 of its 2 body epochs
    assert _fedrep_steps(epochs=4, client_epochs=2, body_epochs=2) == [3] * 3 + [3] * 3


# -------------------------------------------------------------------------------- Per-FedAvg


def test_perfedavg_adapts_with_an_alpha_then_a_beta_step_on_train_batches():
    """Both authors' codes: from the global model, one step of size alpha on a batch, then one of size beta on
    another; here both batches are random train batches (the i-th from the i-th of split(key, 2))."""
    alpha, beta = 0.2, 0.3
    method = _method("perfedavg", _setup("mlr"), alpha=alpha, beta=beta)
    assert (method.hparams.eval_steps, method.hparams.eval_beta_steps) == (1, 1)
    server, _ = method.init(jax.random.key(0), 1)
    data = _client_data(2)
    key = jax.random.key(9)
    got = jax.jit(method.eval_variables)(server, {}, data, key)
    params = list(_linear64(server["variables"]["params"]))
    for size, (x, y) in zip((alpha, beta), _batches64(data, jax.random.split(key, 2))):
        params = [p - size * g for p, g in zip(params, _softmax_ce_grad64(*params, x, y))]
    for a, b in zip(_linear64(got["params"]), params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # PFLlib's single alpha step is the option eval_beta_steps=0, and it differs
    one = jax.jit(_method("perfedavg", _setup("mlr"), alpha=alpha, beta=beta, eval_beta_steps=0).eval_variables)(
        server, {}, data, key)
    assert np.abs(_linear64(one["params"])[0] - params[0]).max() > 1e-3
