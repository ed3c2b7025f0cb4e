"""train.precision (models/precision.py): bf16 layers with float32 parameters, gradients, statistics and
outputs; fp32 programs unchanged; the run records which ran; bf16 runs learn as fp32 ones do."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

import majority_baseline
from fedjax_pfl.runs import cli as train
from fedjax_pfl.models.networks import build_model
from test_bad_input import TINY

SHAPES = {"fedavgcnn": (28, 28, 1), "resnet8": (8, 8, 3), "mlp": (12,)}


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                if isinstance(sub, jax_core.ClosedJaxpr):
                    yield from _equations(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    yield from _equations(sub)


def _training_step(name, precision):
    """(jaxpr of one gradient of the model's loss, its output, its gradient) for ``precision``."""
    model = build_model(name, SHAPES[name], 10, precision=precision)
    variables = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, *SHAPES[name]))

    def loss(params):
        out = model.apply({**variables, "params": params}, x, train=True, mask=jnp.ones(4, bool))
        return jnp.sum(jax.nn.log_softmax(out.logits)[:, 0]), out

    grad = jax.grad(loss, has_aux=True)
    return jax.make_jaxpr(grad)(variables["params"]), *grad(variables["params"])


@pytest.mark.parametrize("name", list(SHAPES))
def test_bf16_multiplies_in_bfloat16_and_keeps_everything_it_hands_out_float32(name):
    jaxpr, grads, out = _training_step(name, "bf16")
    products = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name in ("dot_general", "conv_general_dilated")]
    assert products and all(v.aval.dtype == jnp.bfloat16 for e in products for v in e.invars)
    assert {a.dtype for a in jax.tree.leaves((grads, out.logits, out.features, out.maps, out.batch_stats))} == {
        jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("name", list(SHAPES))
def test_fp32_programs_hold_no_bfloat16_and_no_casts(name):
    """fp32 adds nothing to the program: no bfloat16 and no float conversion anywhere in a training step."""
    jaxpr, *_ = _training_step(name, "fp32")
    assert "bf16" not in str(jaxpr)
    casts = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "convert_element_type"
             and jnp.issubdtype(e.invars[0].aval.dtype, jnp.floating)]
    assert not casts, casts


def test_bf16_logits_are_close_to_fp32():
    fp32, bf16 = (build_model("resnet8", (8, 8, 3), 10, precision=p) for p in ("fp32", "bf16"))
    variables = fp32.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 8, 8, 3))
    a, b = (m.apply(variables, x).logits for m in (fp32, bf16))
    assert float(jnp.abs(a - b).max()) < 0.05 * float(jnp.abs(a).max()) and not np.array_equal(a, b)


def test_the_run_records_which_precision_ran(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--method", "fedavg", *TINY, "train.precision=bf16", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["train"]["precision"] == "bf16" and config["resolved"]["train.precision"] == "bf16"
