"""Tests for fedjax_pfl.models.networks and fedjax_pfl.models.conv."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fedjax_pfl.models.conv import Conv2D, avg_pool, conv2d, max_pool, resolve_conv_impl
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.models.networks import Model, ModelOutput, build_model, model_names

KEY = jax.random.PRNGKey(0)
C = 10

CASES = [  # (name, input shape, feature dim)
    ("mlr", (60,), 60), ("mlp", (28, 28, 1), 200), ("fedavgcnn", (28, 28, 1), 512),
    ("fedavgcnn", (32, 32, 3), 512), ("lenet", (32, 32, 3), 84), ("pfakd_cnn", (32, 32, 3), 256),
    ("fedpac_cnn", (32, 32, 3), 128), ("fedpac_cnn", (28, 28, 1), 128), ("pfakd_cnn_fmnist", (28, 28, 1), 128),
    ("resnet8", (32, 32, 3), 64), ("pfl_cnn", (32, 32, 3), 128),
]
BN_MODELS = {"resnet8", "resnet18"}


# XLA's backend optimisations make up most of the compile time of these small
# test programs (init: ~6x), so most tests skip them; the model-level
# im2col-vs-native comparisons compile with the defaults.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@functools.lru_cache(maxsize=None)
def _init_fn(name, shape):
    """A jitted ``Model.init``, compiled once per model."""
    return jax.jit(build_model(name, shape, C).init, compiler_options=FAST_COMPILE)


@functools.lru_cache(maxsize=None)
def _variables(name, shape):
    """Initial variables from KEY, shared by the tests."""
    return _init_fn(name, shape)(KEY)


@functools.lru_cache(maxsize=None)
def _apply_fn(name, shape, train):
    """A jitted ``Model.apply`` (tests share it: use batch size B)."""
    model = build_model(name, shape, C)
    return jax.jit(functools.partial(model.apply, train=train), compiler_options=FAST_COMPILE)


B = 4


def _close(a, b, rtol=1e-4):
    """Elementwise closeness, scaled by each array's largest magnitude."""
    a, b = np.asarray(a), np.asarray(b)
    scale = max(np.abs(a).max(), np.abs(b).max(), 1e-12)
    np.testing.assert_allclose(a / scale, b / scale, rtol=0, atol=rtol)


def test_model_names_cover_registry():
    assert set(model_names()) == {"mlr", "mlp", "fedavgcnn", "lenet", "pfakd_cnn", "pfakd_cnn_fmnist", "pfl_cnn",
                                  "fedpac_cnn", "resnet8", "resnet18"}


@pytest.mark.parametrize("name,shape,feature_dim", CASES)
def test_shapes_and_body_head_split(name, shape, feature_dim):
    model = build_model(name, shape, C)
    assert isinstance(model, Model) and model.feature_dim == feature_dim
    variables = _variables(name, shape)
    assert set(variables["params"]) == {"body", "head"}
    assert ("batch_stats" in variables) == (name in BN_MODELS)
    if name in BN_MODELS:
        assert set(variables["batch_stats"]) == {"body"}
    x = jax.random.normal(KEY, (B,) + shape)
    out = _apply_fn(name, shape, False)(variables, x)
    assert isinstance(out, ModelOutput)
    assert out.logits.shape == (B, C) and out.features.shape == (B, feature_dim)
    is_cnn = name not in ("mlr", "mlp")
    assert (len(out.maps) > 0) == is_cnn
    for m in out.maps:
        assert m.ndim == 4 and m.shape[0] == B
    np.testing.assert_allclose(jax.jit(model.apply_head)(variables, out.features), out.logits,
                               rtol=1e-5, atol=1e-5)
    if name == "mlr":
        np.testing.assert_array_equal(out.features, x)


def test_resnet18_shapes_only():
    model = build_model("resnet18", (32, 32, 3), 100)
    assert model.feature_dim == 512
    variables = jax.eval_shape(model.init, KEY)
    n = sum(np.prod(a.shape) for a in jax.tree.leaves(variables["params"]))
    assert 11.1e6 < n < 11.3e6  # the CIFAR ResNet-18
    out = jax.eval_shape(lambda v, x: model.apply(v, x, train=True), variables,
                         jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32))
    assert out.logits.shape == (2, 100) and len(out.maps) == 4
    assert jax.tree.structure(out.batch_stats) == jax.tree.structure(variables["batch_stats"])


def test_pfakd_head_is_two_layer_mlp():
    head = jax.eval_shape(build_model("pfakd_cnn", (32, 32, 3), 10).init, KEY)["params"]["head"]
    shapes = sorted(a.shape for a in jax.tree.leaves(head) if len(a.shape) == 2)
    assert shapes == [(64, 10), (256, 64)]


def test_init_deterministic_in_key():
    init = _init_fn("lenet", (32, 32, 3))
    a, b, c = _variables("lenet", (32, 32, 3)), init(KEY), init(jax.random.PRNGKey(1))
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.allclose(a["params"]["body"]["conv0"]["kernel"],
                           c["params"]["body"]["conv0"]["kernel"])


@pytest.mark.parametrize("name,train", [("fedavgcnn", False), ("resnet8", True)])
def test_im2col_equals_native_outputs_and_grads(name, train):
    m_i = build_model(name, (32, 32, 3), C, conv_impl="im2col")
    m_n = build_model(name, (32, 32, 3), C, conv_impl="native")
    assert jax.eval_shape(m_i.init, KEY) == jax.eval_shape(m_n.init, KEY)
    variables = _variables(name, (32, 32, 3))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 32, 32, 3))
    y = jnp.arange(4) % C

    def loss(params, model):
        out = model.apply({**variables, "params": params}, x, train=train)
        ce = -jnp.take_along_axis(jax.nn.log_softmax(out.logits), y[:, None], 1).mean()
        return ce + 0.1 * jnp.mean(out.features ** 2), out

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (l_i, o_i), g_i = grad(variables["params"], m_i)
    (l_n, o_n), g_n = grad(variables["params"], m_n)
    _close(l_i, l_n)
    for a, b in zip(jax.tree.leaves((o_i.logits, o_i.features, o_i.maps, o_i.batch_stats)),
                    jax.tree.leaves((o_n.logits, o_n.features, o_n.maps, o_n.batch_stats))):
        _close(a, b)
    jax.tree.map(_close, g_i, g_n)


@pytest.mark.parametrize("kernel,strides,padding,hw", [
    (5, 1, "VALID", (12, 13)), (3, 2, "SAME", (9, 8)), (1, 2, "VALID", (8, 8)),
    (5, 1, 1, (10, 10)), (4, 1, "VALID", (9, 9)), (3, (2, 1), ((1, 0), (2, 1)), (7, 8)),
])
def test_conv2d_matches_native_and_flax(kernel, strides, padding, hw):
    x = jax.random.normal(KEY, (2,) + hw + (3,))
    mods = {"im2col": Conv2D(4, kernel, strides, padding, impl="im2col"),
            "native": Conv2D(4, kernel, strides, padding, impl="native"),
            "flax": nn.Conv(4, (kernel, kernel), strides, padding)}

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(x):
        init = {k: m.init(KEY, x) for k, m in mods.items()}
        v = init["im2col"]
        out = {k: m.apply(v, x) for k, m in mods.items()}
        loss = lambda v, x, m: jnp.sum(jnp.sin(m.apply(v, x)))
        grads = {k: jax.grad(loss, (0, 1))(v, x, mods[k]) for k in ("im2col", "native")}
        return init, out, grads

    init, out, grads = run(x)
    for k in ("native", "flax"):  # same tree, same values
        jax.tree.map(np.testing.assert_array_equal, init["im2col"], init[k])
    for k in ("im2col", "native"):
        np.testing.assert_allclose(out[k], out["flax"], rtol=1e-5, atol=1e-5)
    jax.tree.map(_close, grads["im2col"], grads["native"])


def _grad_in_scan_hlo(impl):
    kernels = jnp.ones((3, 3, 3, 8)), jnp.ones((3, 3, 8, 8))

    def loss(ks, x):
        h = max_pool(nn.relu(conv2d(x, ks[0], 1, "SAME", impl)))
        return jnp.sum(conv2d(h, ks[1], 2, "VALID", impl) ** 2)

    def train(ks, xs):
        step = lambda ks, x: (jax.tree.map(lambda k, g: k - g, ks, jax.grad(loss)(ks, x)), None)
        return lax.scan(step, ks, xs)[0]

    xs = jnp.ones((2, 4, 8, 8, 3))
    return jax.jit(jax.vmap(train, (None, 0))).lower(kernels, jnp.stack([xs, xs])).as_text()


def test_im2col_has_no_convolution_in_scan_grad():
    assert "convolution" not in _grad_in_scan_hlo("im2col")
    assert "convolution" in _grad_in_scan_hlo("native")


def test_pooling_matches_reduce_window():
    x = jax.random.normal(KEY, (2, 9, 8, 3))
    np.testing.assert_array_equal(max_pool(x), nn.max_pool(x, (2, 2), (2, 2)))
    np.testing.assert_allclose(avg_pool(x), nn.avg_pool(x, (2, 2), (2, 2)), rtol=1e-6)
    np.testing.assert_array_equal(max_pool(x, 3, 1), nn.max_pool(x, (3, 3), (1, 1)))
    g = jax.grad(lambda x: max_pool(x).sum())(x)
    g_ref = jax.grad(lambda x: nn.max_pool(x, (2, 2), (2, 2)).sum())(x)
    np.testing.assert_array_equal(g, g_ref)  # no ties in random data


def test_resolve_conv_impl():
    assert resolve_conv_impl("auto", "cpu") == "direct"
    assert resolve_conv_impl("auto", "gpu") == "direct"  # measured faster than native on an H200
    assert resolve_conv_impl("auto", "tpu") == "native"
    assert resolve_conv_impl("native") == "native"
    if jax.default_backend() == "cpu":
        assert resolve_conv_impl("auto") == "direct"
    with pytest.raises(UserError, match="im2col"):
        resolve_conv_impl("winograd")


def test_batch_stats_update_only_when_training():
    variables = _variables("resnet8", (32, 32, 3))
    x = 3.0 + jax.random.normal(KEY, (B, 32, 32, 3))
    out = _apply_fn("resnet8", (32, 32, 3), True)(variables, x)
    assert jax.tree.structure(out.batch_stats) == jax.tree.structure(variables["batch_stats"])
    changed = jax.tree.map(lambda a, b: not np.allclose(a, b),
                           out.batch_stats, variables["batch_stats"])
    assert all(jax.tree.leaves(changed))
    frozen = _apply_fn("resnet8", (32, 32, 3), False)(variables, x)
    jax.tree.map(np.testing.assert_array_equal, frozen.batch_stats, variables["batch_stats"])
    assert not np.allclose(frozen.logits, out.logits)  # running averages, not batch stats
    mlp = _apply_fn("mlp", (28, 28, 1), True)(_variables("mlp", (28, 28, 1)), x[..., :28, :28, :1])
    assert mlp.batch_stats == {}


@pytest.mark.parametrize("name,shape", [("fedavgcnn", (28, 28, 1)), ("resnet8", (32, 32, 3))])
def test_jit_vmap_over_stacked_clients(name, shape):
    model = build_model(name, shape, C)
    stacked = jax.tree.map(lambda a: jnp.stack([a, 1.1 * a, 0.9 * a + 0.01]),
                           _variables(name, shape))
    x = jax.random.normal(KEY, (3, B) + shape)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(stacked, x):
        out = jax.vmap(lambda v, x: model.apply(v, x, train=True))(stacked, x)
        return out, jax.vmap(model.apply_head)(stacked, out.features)

    out, heads = run(stacked, x)
    assert out.logits.shape == (3, B, C) and out.features.shape == (3, B, model.feature_dim)
    np.testing.assert_allclose(heads, out.logits, rtol=1e-5, atol=1e-5)
    one = _apply_fn(name, shape, True)(jax.tree.map(lambda a: a[1], stacked), x[1])
    np.testing.assert_allclose(out.logits[1], one.logits, rtol=1e-4, atol=1e-5)
    assert not np.allclose(out.logits[0], out.logits[1])  # each client its own params


def test_mlp_hidden_option_and_fedpac_variant():
    m = build_model("mlp", (784,), 10, hidden=(128,))
    assert m.feature_dim == 128
    kernels = [a.shape for a in jax.tree.leaves(jax.eval_shape(m.init, KEY)["params"])
               if len(a.shape) == 2]
    assert sorted(kernels) == [(128, 10), (784, 128)]
    assert len(build_model("fedpac_cnn", (28, 28, 3), 10, variant="fmnist").module.body.convs) == 2


@pytest.mark.parametrize("args,kwargs,match", [
    (("resnet50", (32, 32, 3), 10), {}, "fedavgcnn"),
    (("fedavgcnn", (60,), 10), {}, "image"),
    (("lenet", (8, 8, 1), 10), {}, "cannot take"),
    (("lenet", (8, 8, 1), 10), {"conv_impl": "native"}, "cannot take"),
    (("mlp", (60,), 10), {"hiden": (3,)}, "hidden"),
    (("mlp", (60,), 10), {"hidden": 5}, "Bad option"),
    (("fedpac_cnn", (32, 32, 3), 10), {"variant": "svhn"}, "cifar"),
    (("mlp", (60,), 10), {"conv_impl": "fast"}, "im2col"),
])
def test_user_errors(args, kwargs, match):
    with pytest.raises(UserError, match=match):
        build_model(*args, **kwargs)


def test_batchnorm_mask_makes_a_padded_batch_equal_the_unpadded_one():
    """resnet8, 3 real rows + 3 zero rows with a mask == the 3 real rows alone:
    features, loss, gradients and running statistics."""
    model = build_model("resnet8", (16, 16, 3), C)
    variables = _init_fn("resnet8", (16, 16, 3))(KEY)
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 16, 16, 3))
    y = jnp.array([1, 4, 7])
    x_pad = jnp.concatenate([x, jnp.zeros_like(x)])
    y_pad = jnp.concatenate([y, jnp.zeros_like(y)])
    mask = jnp.arange(6) < 3

    def loss(params, x, y, mask):
        out = model.apply({**variables, "params": params}, x, train=True, mask=mask)
        logp = jax.nn.log_softmax(out.logits)
        weights = mask.astype(jnp.float32) if mask is not None else jnp.ones(y.shape)
        nll = -jnp.take_along_axis(logp, y[:, None], 1)[:, 0]
        return jnp.sum(nll * weights) / jnp.sum(weights), out

    run = jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=FAST_COMPILE)
    (l_ref, out_ref), g_ref = run(variables["params"], x, y, None)
    (l_pad, out_pad), g_pad = run(variables["params"], x_pad, y_pad, mask)
    (l_nomask, out_nomask), _ = run(variables["params"], x_pad, y_pad, jnp.ones(6, bool))
    close = functools.partial(np.testing.assert_allclose, rtol=2e-4, atol=2e-5)
    close(out_pad.features[:3], out_ref.features)
    close(l_pad, l_ref)
    jax.tree.map(close, g_pad, g_ref)
    jax.tree.map(close, out_pad.batch_stats, out_ref.batch_stats)
    # Without the mask the zero rows do enter the statistics (what the mask fixes).
    assert np.abs(np.asarray(out_nomask.features[:3] - out_ref.features)).max() > 1e-2
    # An all-padding batch (a skipped step) stays finite.
    (l_empty, out_empty), _ = run(variables["params"], x_pad, y_pad, jnp.zeros(6, bool))
    assert all(np.isfinite(v).all() for v in jax.tree.leaves(out_empty.batch_stats))


def test_pfl_cnn_dropout_trains_with_a_key_and_evaluates_as_without():
    """pfl_cnn(dropout=True): the same parameters as without; evaluation drops nothing; training draws its masks
    from the step's key (same key, same output) and refuses to run without one."""
    plain = build_model("pfl_cnn", (12, 12, 1), 5)
    dropped = build_model("pfl_cnn", (12, 12, 1), 5, dropout=True)
    assert dropped.dropout and not plain.dropout
    variables = plain.init(jax.random.key(0))
    assert jax.tree.structure(variables) == jax.tree.structure(dropped.init(jax.random.key(0)))
    x = jax.random.normal(jax.random.key(1), (4, 12, 12, 1))
    np.testing.assert_array_equal(dropped.apply(variables, x).logits, plain.apply(variables, x).logits)
    k1, k2 = jax.random.split(jax.random.key(2))
    a = dropped.apply(variables, x, train=True, rng=k1).logits
    np.testing.assert_array_equal(a, dropped.apply(variables, x, train=True, rng=k1).logits)
    assert not np.allclose(a, dropped.apply(variables, x, train=True, rng=k2).logits)
    assert not np.allclose(a, plain.apply(variables, x, train=True).logits)
    with pytest.raises(UserError, match="dropout"):
        dropped.apply(variables, x, train=True)
    with pytest.raises(UserError, match="no option"):
        build_model("mlp", (12, 12, 1), 5, dropout=True)


def test_dropout_zeroes_at_its_rate_and_scales_the_rest():
    """A body with dropout 0.5 after its Dense layer: each feature is 0 or twice its evaluation value, about
    half of them 0."""
    from fedjax_pfl.models.networks import ConvNetBody

    body = ConvNetBody(hidden=(256,), dropout=(0.0, 0.5))
    x = jax.random.normal(jax.random.key(0), (8, 20))
    variables = body.init(jax.random.key(1), x)
    clean, _ = body.apply(variables, x)
    train, _ = body.apply(variables, x, train=True, rngs={"dropout": jax.random.key(2)})
    kept = np.asarray(train) != 0
    np.testing.assert_allclose(np.asarray(train)[kept], 2 * np.asarray(clean)[kept], rtol=1e-6)
    live = np.asarray(clean) != 0
    assert 0.4 < (kept & live).sum() / live.sum() < 0.6


def test_fedavg_with_pfl_cnns_dropout_learns_on_fashion_mnist(data_dir):
    """model.dropout=true through the training command's setup: FedAvg on 4 iid Fashion-MNIST clients (200
    images each), 3 rounds, lifts the accuracy far above the majority class and the untrained model."""
    import dataclasses
    import math

    import majority_baseline
    import pfl_reference as ref
    from fedjax_pfl.data.registry import load_dataset
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment, validate

    ds = load_dataset("fmnist", data_dir=data_dir)
    ds = dataclasses.replace(ds, x_train=ds.x_train[:2000], y_train=ds.y_train[:2000], x_test=ds.x_test[:400],
                             y_test=ds.y_test[:400])
    cfg = config_lib.build(None, [
        "method_name=fedavg", "data.name=fmnist", "partition.scheme=iid", "partition.num_clients=4",
        "partition.train_per_client=200", "partition.test_per_client=50", "partition.test_from=split",
        "model.name=pfl_cnn", "model.dropout=true", "train.optimizer=adam", "train.lr=0.001",
        "train.batch_size=20", "train.local_epochs=1", "train.join_ratio=1.0", "train.rounds=3"])
    engine = build_experiment(validate(cfg), dataset=ds).engine
    assert engine.method.model.dropout
    first, last, metrics, _, _ = ref.run_engine(engine, 3)
    assert math.isfinite(float(metrics["train_loss"]))
    majority = majority_baseline.from_engine(engine)
    assert last["accuracy"] > majority + 0.3 and last["accuracy"] > first + 0.3, (first, last, majority)
