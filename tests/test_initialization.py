"""model.init: every layer of every model starts as PyTorch's defaults (torch) or Flax's (flax).

PyTorch's formulas, written out here (torch is not imported): nn.Linear(in, out)
and nn.Conv2d(cin, cout, k) draw weight and bias from U(-1/sqrt(fan_in),
1/sqrt(fan_in)) with fan_in = in, resp. cin * kh * kw; BatchNorm starts at
weight 1, bias 0. A uniform U(-b, b) has variance b^2/3; the checks allow 5
standard errors of the drawn sample.
"""

import math

import jax
import numpy as np
import optax
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.models import initialization
from fedjax_pfl.models.networks import build_model, model_names
from fedjax_pfl.runs import config as config_lib
from settings_records import local_setup


def _input_shape(name):
    return (60,) if name in ("mlr", "mlp") else (16, 16, 3) if name.startswith("resnet") else (32, 32, 3)


def _layers(tree, path=""):
    """(path, layer mapping) of every mapping whose values are arrays."""
    if all(not isinstance(v, dict) for v in tree.values()):
        return [(path, tree)] if tree else []
    return [pair for name, child in tree.items() for pair in _layers(child, f"{path}/{name}")]


def _torch_fan_in(kernel_shape):
    """PyTorch's fan_in, from the layer's own sizes (Dense [in, out]; conv [kh, kw, cin, cout])."""
    if len(kernel_shape) == 2:
        return kernel_shape[0]
    kh, kw, cin, _ = kernel_shape
    return cin * kh * kw


def _assert_uniform(values, bound, where):
    v = np.asarray(values, np.float64).ravel()
    n = v.size
    assert np.abs(v).max() <= bound * (1 + 1e-6), f"{where}: beyond 1/sqrt(fan_in)"
    if n >= 50:  # the largest of n uniform draws reaches within 20/n of the bound but with prob. e^-20
        assert np.abs(v).max() >= bound * (1 - 20 / n), f"{where}: draws stay well inside the bound"
    var, sd_var = bound**2 / 3, bound**2 * math.sqrt(4 / 45 / n)  # Var(s^2) of U(-b, b): b^4 (1/5 - 1/9) / n
    assert abs(v.var() - var) <= 5 * sd_var, f"{where}: variance {v.var():.3g}, torch's {var:.3g}"
    assert abs(v.mean()) <= 5 * bound / math.sqrt(3 * n), f"{where}: mean {v.mean():.3g}"


@pytest.mark.parametrize("name", model_names())
def test_torch_init_matches_torch_formulas_on_every_layer(name):
    model = build_model(name, _input_shape(name), 10, init="torch")
    variables = jax.jit(model.init)(jax.random.key(0))  # as the engine calls it: under jit
    layers = _layers(variables["params"])
    assert any("kernel" in layer for _, layer in layers)
    for path, layer in layers:
        if "kernel" in layer:
            bound = 1 / math.sqrt(_torch_fan_in(layer["kernel"].shape))
            for part in layer:
                _assert_uniform(layer[part], bound, f"{name}{path}/{part}")
        else:  # BatchNorm: weight 1, bias 0 as torch
            assert set(layer) == {"scale", "bias"}, path
            assert (np.asarray(layer["scale"]) == 1).all() and (np.asarray(layer["bias"]) == 0).all(), path
    for _, stats in _layers(variables.get("batch_stats", {})):
        assert (np.asarray(stats["mean"]) == 0).all() and (np.asarray(stats["var"]) == 1).all()


def test_fan_in_of_fedavgcnn_is_torchs():
    """PyTorch's FedAvgCNN on 3x32x32: conv fan_in 3*5*5 and 32*5*5, Linear 1600 and 512."""
    model = build_model("fedavgcnn", (32, 32, 3), 10, init="torch")
    params = jax.eval_shape(model.init, jax.random.key(1))["params"]
    kernels = {path: layer["kernel"].shape for path, layer in _layers(params)}
    assert [initialization.torch_bound(kernels[p]) ** -2 for p in sorted(kernels)] == pytest.approx(
        [75, 800, 1600, 512])


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_flax_init_is_flaxs_default_and_differs_from_torch(name):
    shape = _input_shape(name)
    flax, again, torch = (jax.jit(build_model(name, shape, 10, **kw).init)(jax.random.key(0))["params"]
                          for kw in ({}, {"init": "flax"}, {"init": "torch"}))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), flax, again))
    assert jax.tree.structure(flax) == jax.tree.structure(torch)
    for path, layer in _layers(flax):
        if "kernel" in layer:  # LeCun normal: variance 1/fan_in (torch's: 1/(3 fan_in)); biases 0 (torch's: not)
            k = np.asarray(layer["kernel"])
            assert k.var() * _torch_fan_in(k.shape) == pytest.approx(1.0, rel=0.3), path
            assert "bias" not in layer or (np.asarray(layer["bias"]) == 0).all(), path
    torch_kernel = np.asarray(_layers(torch)[-1][1]["kernel"])
    assert torch_kernel.var() * _torch_fan_in(torch_kernel.shape) == pytest.approx(1 / 3, rel=0.3)


def test_torch_init_is_seeded():
    init = jax.jit(build_model("mlp", (60,), 10, init="torch").init)
    a, b, c = (init(jax.random.key(k))["params"] for k in (3, 3, 4))
    assert jax.tree.all(jax.tree.map(lambda x, y: bool((x == y).all()), a, b))
    assert not any(jax.tree.leaves(jax.tree.map(lambda x, y: bool((x == y).all()), a, c)))


def test_gpfl_valve_starts_as_torch_with_torch_init():
    d = 8
    model = build_model("mlp", (6, 6, 1), 4, hidden=(d,), init="torch")
    setup = local_setup(model=model, optimizer=optax.sgd, lr=0.1, batch_size=5, local_epochs=1, normalize=lambda x: x)
    cls = get_method("gpfl")
    server, _ = jax.jit(cls(setup, cls.hparams_type()).init, static_argnums=1)(jax.random.key(0), 3)
    for path, layer in _layers(server["cov"]):
        if "kernel" in layer:
            bound = 1 / math.sqrt(d)
            assert max(float(np.abs(np.asarray(a)).max()) for a in layer.values()) <= bound, path
            assert float(np.abs(np.asarray(layer["bias"])).max()) > 0, f"{path}: torch biases are not 0"
        else:  # LayerNorm
            assert (np.asarray(layer["scale"]) == 1).all() and (np.asarray(layer["bias"]) == 0).all()


def test_model_init_is_a_config_key_recorded_and_checked():
    cfg = config_lib.build(overrides=["model.init=torch"])
    assert config_lib.to_dict(cfg)["model"]["init"] == "torch"
    assert config_lib.to_dict(config_lib.build())["model"]["init"] == "flax"
    with pytest.raises(UserError, match="model.init must be one of: flax, torch"):
        config_lib.validate_values(config_lib.build(overrides=["model.init=kaiming"]))
    with pytest.raises(UserError, match="Unknown model init 'kaiming'"):
        build_model("mlr", (60,), 10, init="kaiming")


def test_unknown_layer_kind_is_refused():
    with pytest.raises(UserError, match="no torch initialisation for the layer params/odd"):
        initialization.torch_defaults({"odd": {"w": np.zeros(3)}}, jax.random.key(0))
