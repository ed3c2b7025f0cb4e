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
        for sub in jax_core.jaxprs_in_params(eqn.params):
            yield from _equations(sub)


def _gradient(name, precision):
    """(the gradient of a model's loss with its output as aux, the initial parameters)."""
    model = build_model(name, SHAPES[name], 10, precision=precision)
    variables = jax.jit(model.init)(jax.random.key(0))  # one compile, not one per eager op
    x = jax.random.normal(jax.random.key(1), (4, *SHAPES[name]))

    def loss(params):
        out = model.apply({**variables, "params": params}, x, train=True, mask=jnp.ones(4, bool))
        return jnp.sum(jax.nn.log_softmax(out.logits)[:, 0]), out

    return jax.grad(loss, has_aux=True), variables["params"]


@pytest.mark.parametrize("name", list(SHAPES))
def test_bf16_multiplies_in_bfloat16_and_keeps_everything_it_hands_out_float32(name):
    grad, params = _gradient(name, "bf16")
    jaxpr, (grads, out) = jax.make_jaxpr(grad)(params), jax.eval_shape(grad, params)
    products = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name in ("dot_general", "conv_general_dilated")]
    assert products and all(v.aval.dtype == jnp.bfloat16 for e in products for v in e.invars)
    assert {a.dtype for a in jax.tree.leaves((grads, out.logits, out.features, out.maps, out.batch_stats))} == {
        jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("name", list(SHAPES))
def test_fp32_programs_hold_no_bfloat16_and_no_casts(name):
    """fp32 adds nothing to the program: no bfloat16 and no float conversion anywhere in a training step."""
    grad, params = _gradient(name, "fp32")
    jaxpr = jax.make_jaxpr(grad)(params)
    assert "bf16" not in str(jaxpr)
    casts = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "convert_element_type"
             and jnp.issubdtype(e.invars[0].aval.dtype, jnp.floating)]
    assert not casts, casts


def test_bf16_logits_are_close_to_fp32():
    fp32, bf16 = (build_model("resnet8", (8, 8, 3), 10, precision=p) for p in ("fp32", "bf16"))
    variables = jax.jit(fp32.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 8, 8, 3))
    a, b = (jax.jit(lambda v, x, m=m: m.apply(v, x).logits)(variables, x) for m in (fp32, bf16))
    assert float(jnp.abs(a - b).max()) < 0.05 * float(jnp.abs(a).max()) and not np.array_equal(a, b)


def test_the_run_records_which_precision_ran(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--method", "fedavg", *TINY, "train.precision=bf16", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["train"]["precision"] == "bf16" and config["resolved"]["train.precision"] == "bf16"


def _fmnist_engine(data_dir, method, precision):
    """20 clients of Fashion-MNIST (Dirichlet 0.5, 30 train / 200 test samples each), FedAvgCNN, B=10, one epoch
    a round, every client every round: enough training that the accuracy after 10 rounds is stable to a
    perturbation of the arithmetic (with fewer samples a client the models are still moving fast, and two
    arithmetics' accuracies drift apart by more than the half point compared)."""
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment

    overrides = ["data.name=fmnist", f"data.data_dir={data_dir}", "partition.scheme=dirichlet", "partition.alpha=0.5",
                 "partition.num_clients=20", "partition.train_per_client=30", "partition.test_per_client=200",
                 "partition.test_from=split", "model.name=fedavgcnn", "train.batch_size=10", "train.local_epochs=1",
                 "train.lr=0.05", "train.join_ratio=1.0", f"train.precision={precision}", f"method_name={method}"]
    return build_experiment(config_lib.build(None, overrides)).engine


@pytest.mark.parametrize("method", ["fedavg", "fedas"])
def test_bf16_learns_as_fp32_does_on_fmnist(data_dir, method):
    """10 rounds from the same seed: bf16's accuracy within 0.5 points of fp32's, both above the partition's
    majority-class baseline."""
    import pfl_reference as ref

    accuracy = {}
    for precision in ("fp32", "bf16"):
        engine = _fmnist_engine(data_dir, method, precision)
        accuracy[precision] = ref.run_engine(engine, 10)[1]["accuracy"]
    majority = majority_baseline.from_engine(engine)
    assert min(accuracy.values()) > majority + 0.2, (accuracy, majority)
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.005, accuracy
