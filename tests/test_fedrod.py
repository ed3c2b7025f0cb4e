"""FedRoD: the balanced softmax against a float64 reference, the two-head loss and where its
gradients stop, prediction as generic plus personal logits, the linear-head check, and
BatchNorm statistics that padding rows do not reach.

The federations: tests/split_model_federation.py, tests/batchnorm_padding.py. The engine against a
per-client loop: tests/test_engine_equals_loop_split_models.py; learning on
real Fashion-MNIST: tests/test_learning_fmnist_four_clients.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchnorm_padding as padding
import plain_sgd_federation as plain_fed
import split_model_federation as fed
from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods import fedrod, get_method
from fedjax_pfl.methods.fedrod import PERSONAL
from fedjax_pfl.models.networks import build_model
from settings_records import run_facts


def test_balanced_softmax_matches_float64_reference_with_padding_and_absent_classes():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 5)).astype(np.float32) * 3
    labels = np.array([0, 2, 2, 4, 1, 0])
    mask = np.array([1, 1, 1, 1, 0, 1], bool)  # class 1 only in a padded row, and absent below
    counts = np.array([30.0, 0.0, 7.0, 0.0, 2.0])
    shifted = logits.astype(np.float64) + np.where(counts > 0, np.log(np.maximum(counts, 1)), -np.inf)
    logp = shifted - np.log(np.exp(shifted - shifted.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - shifted.max(1, keepdims=True)
    expect = -np.mean(logp[mask, labels[mask]])
    got = losses.balanced_softmax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(counts), mask)
    np.testing.assert_allclose(float(got), expect, rtol=1e-6)
    grad = jax.grad(losses.balanced_softmax_cross_entropy)(jnp.asarray(logits), labels, counts, mask)
    assert np.all(np.isfinite(np.asarray(grad)))
    # uniform counts: plain cross-entropy
    np.testing.assert_allclose(float(losses.balanced_softmax_cross_entropy(logits, labels, np.full(5, 3.0), mask)),
                               float(losses.cross_entropy(logits, labels, mask)), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(losses.class_counts(jnp.asarray(labels), 5, mask)), [2, 0, 2, 0, 1])


def test_fedrod_loss_matches_float64_reference_and_personal_loss_stops_at_features():
    model = fed.mlp()
    method = get_method("fedrod")(fed.setup(model))
    server, clients = method.init(jax.random.key(0), 2)
    personal = jax.tree.map(lambda a: a[0] + 0.3, clients["head"])
    rng = np.random.default_rng(1)
    x = fed.normalize(jnp.asarray(rng.integers(0, 256, (8, *fed.SHAPE)), jnp.uint8))
    y = jnp.asarray([0, 1, 1, 3, 3, 3, 0, 1])
    mask = jnp.asarray([1, 1, 1, 1, 1, 1, 0, 0], bool)
    counts = jnp.asarray([5.0, 9.0, 0.0, 2.0])
    batch = local_training.Batch(x, y, mask)
    v = {"params": {**server["variables"]["params"], "personal": personal}}
    loss, _ = fedrod.objective(method, counts)(v, batch, None)

    out = model.apply(server["variables"], x)
    g = np.asarray(out.logits, np.float64)
    p = np.asarray(model.apply_head({"params": {"head": personal}}, out.features), np.float64)
    m = np.asarray(mask)

    def ce(z):
        z = z - z.max(1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(1, keepdims=True))
        return -np.mean(logp[m, np.asarray(y)[m]])

    with np.errstate(divide="ignore"):
        expect = ce(g + np.log(np.asarray(counts, np.float64))) + ce(g + p)
    np.testing.assert_allclose(float(loss), expect, rtol=1e-5)
    # gradients: body and generic head only from the balanced softmax
    grads = jax.grad(lambda q: fedrod.objective(method, counts)({"params": q}, batch, None)[0])(v["params"])
    generic = jax.grad(lambda q: losses.balanced_softmax_cross_entropy(
        model.apply({"params": q}, x).logits, y, counts, mask))(server["variables"]["params"])
    fed.close({k: grads[k] for k in ("body", "head")}, generic, tol=1e-6)
    assert float(jnp.abs(grads["personal"]["logits"]["kernel"]).max()) > 0
    # prediction = generic logits + personal logits
    evaluated = method.eval_variables(server, {"head": personal}, None, None)
    np.testing.assert_allclose(np.asarray(model.apply(evaluated, x).logits), g + p, rtol=1e-5, atol=1e-5)


def test_fedrod_refuses_a_nonlinear_head():
    with pytest.raises(UserError, match="one Dense layer"):
        get_method("fedrod").check_run(None, run_facts(fed.setup(build_model("pfakd_cnn", (28, 28, 1), fed.C))))


def test_fedrod_batchnorm_statistics_ignore_padding_rows():
    method = plain_fed.method("fedrod", padding.bn_setup())
    server, clients = method.init(jax.random.key(0), 1)
    generic = server["variables"]
    variables = {**generic, "params": {**generic["params"], PERSONAL: tree_ops.gather(clients["head"], 0)}}
    padding.assert_same_over_padding(fedrod.objective(method, jnp.asarray([3.0, 1.0, 2.0])), variables)  # loss and batch_stats
