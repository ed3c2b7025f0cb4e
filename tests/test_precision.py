"""train.precision (models/precision.py): bf16 layers with float32 parameters, gradients, statistics and
outputs; fp32 programs unchanged; the run records which ran; bf16 runs learn as fp32 ones do."""

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core

import majority_baseline
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import build_experiment, resolved_settings, validate

SHAPES = {"fedavgcnn": (16, 16, 1), "resnet8": (8, 8, 3)}  # convolutions and Dense layers; BatchNorm


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax_core.jaxprs_in_params(eqn.params):
            yield from _equations(sub)


def _gradient(name, precision):
    """(the gradient of a model's loss with its output as aux, its abstract arguments): traced, never compiled."""
    model = build_model(name, SHAPES[name], 10, precision=precision)
    variables = jax.eval_shape(model.init, jax.random.key(0))
    stats = {k: v for k, v in variables.items() if k != "params"}
    x = jax.ShapeDtypeStruct((4, *SHAPES[name]), jnp.float32)

    def loss(params, stats, x):
        out = model.apply({**stats, "params": params}, x, train=True, mask=jnp.ones(4, bool))
        return jnp.sum(jax.nn.log_softmax(out.logits)[:, 0]), out

    return jax.grad(loss, has_aux=True), (variables["params"], stats, x)


def test_bf16_multiplies_in_bfloat16_and_keeps_everything_it_hands_out_float32():
    for name in SHAPES:
        grad, args = _gradient(name, "bf16")
        jaxpr, (grads, out) = jax.make_jaxpr(grad)(*args), jax.eval_shape(grad, *args)
        products = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name in ("dot_general", "conv_general_dilated")]
        assert products and all(v.aval.dtype == jnp.bfloat16 for e in products for v in e.invars), name
        assert {a.dtype for a in jax.tree.leaves((grads, out.logits, out.features, out.maps, out.batch_stats))} == {
            jnp.dtype(jnp.float32)}, name


def test_fp32_programs_hold_no_bfloat16_and_no_casts():
    """fp32 adds nothing to the program: no bfloat16 and no float conversion anywhere in a training step."""
    for name in SHAPES:
        grad, args = _gradient(name, "fp32")
        jaxpr = jax.make_jaxpr(grad)(*args)
        assert "bf16" not in str(jaxpr), name
        casts = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "convert_element_type"
                 and jnp.issubdtype(e.invars[0].aval.dtype, jnp.floating)]
        assert not casts, (name, casts)


def _fmnist(data_dir, precision):
    """20 clients of Fashion-MNIST (Dirichlet 0.5, 30 train / 100 test samples each), an MLP (64 hidden), B=10,
    one epoch a round, every client every round. Its Dense layers multiply in bfloat16 under 'bf16' while
    the float32 parameters take the small updates that bfloat16 weights would round away."""
    overrides = ["data.name=fmnist", f"data.data_dir={data_dir}", "partition.scheme=dirichlet", "partition.alpha=0.5",
                 "partition.num_clients=20", "partition.train_per_client=30", "partition.test_per_client=100",
                 "partition.test_from=split", "model.name=mlp", "model.hidden=[64]", "train.batch_size=10",
                 "train.local_epochs=1", "train.lr=0.05", "train.join_ratio=1.0", "train.client_mapping=map",
                 f"train.precision={precision}", "method_name=fedavg"]
    cfg = config_lib.build(None, overrides)
    return cfg, build_experiment(validate(cfg)).engine


def test_bf16_learns_as_fp32_does_on_fmnist_and_the_run_records_it(data_dir):
    """FedAvg, 10 rounds from the same seed: bf16's accuracy within 0.5 points of fp32's, both above the
    partition's majority-class baseline; config.json's resolved settings name the precision."""
    import pfl_reference as ref

    accuracy = {}
    for precision in ("fp32", "bf16"):
        cfg, engine = _fmnist(data_dir, precision)
        assert resolved_settings(cfg, {})["train.precision"] == precision
        accuracy[precision] = ref.run_engine(engine, 10)[1]["accuracy"]
    majority = majority_baseline.from_engine(engine)
    assert min(accuracy.values()) > majority + 0.2, (accuracy, majority)
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.005, accuracy
