"""FedProto: the engine against a per-client Python loop, the server prototypes are the weighted
mean of the arrived uploads, nearest-prototype logits against float64; option errors.

The federation and its reference loop: tests/personal_model_federation.py.
Learning on real Fashion-MNIST (the prototypes classify too): tests/test_learning_fmnist_two_class.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import float32_bounds as f32

import personal_model_federation as fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.kernels import prototypes
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.base import ServerRound
from fedjax_pfl.methods.fedproto import FedProtoConfig
from fedjax_pfl.runs import config as config_lib


def _proto_loss(p, xb, yb, global_protos, present, lam):
    f = fed.features(p, xb)
    target = jnp.where(present[yb][:, None], global_protos[yb], jax.lax.stop_gradient(f))
    return fed.ce(p, xb, yb) + lam * jnp.mean((f - target) ** 2)


def _np_prototypes(params, x, y):
    f = np.asarray(fed.features(params, x), np.float64)
    protos, counts = np.zeros((fed.C, f.shape[1])), np.zeros(fed.C)
    for k in range(fed.C):
        if np.any(y == k):
            protos[k], counts[k] = f[y == k].mean(axis=0), np.sum(y == k)
    return protos, counts


def _np_aggregate(protos, counts, mode):
    out, present = np.zeros_like(protos[0]), np.zeros(fed.C, bool)
    for k in range(fed.C):
        w = [(n[k] if mode == "counts" else 1.0) for n in counts if n[k] > 0]
        p = [pr[k] for pr, n in zip(protos, counts) if n[k] > 0]
        if p:
            out[k] = sum(wi * pi for wi, pi in zip(w, p)) / sum(w)
            present[k] = True
    return out, present


def _ref_fedproto(rounds, key, lam):
    x, y, idx = fed.raw_data()
    init_key, key = jax.random.split(key)
    w0 = fed.model().init(init_key)["params"]
    personal = [w0] * fed.N
    global_protos, present = np.zeros((fed.C, 8)), np.zeros(fed.C, bool)
    for t in range(rounds):
        selected, keys = fed.round_plan(key, t)
        protos, counts = [], []
        for j, c in enumerate(selected):
            xc, yc = x[idx[c]], y[idx[c]]
            gp, pr = jnp.asarray(global_protos, jnp.float32), jnp.asarray(present)
            personal[c] = fed.ref_sgd(_proto_loss, personal[c], xc, yc, keys[j], gp, pr, lam)
            p, n = _np_prototypes(personal[c], xc, yc)
            protos.append(p)
            counts.append(n)
        global_protos, present = _np_aggregate(protos, counts, "clients")
    return personal, global_protos, present


def test_fedproto_engine_equals_per_client_loop():
    key = jax.random.key(6)
    ref_personal, ref_protos, ref_present = _ref_fedproto(2, key, lam=0.5)
    _, server, clients = fed.run_engine(get_method("fedproto")(fed.setup(), FedProtoConfig(lam=0.5)), "vmap", 2, key)
    np.testing.assert_array_equal(np.asarray(server["present"]), ref_present)
    np.testing.assert_allclose(np.asarray(server["prototypes"]), ref_protos, rtol=1e-5, atol=1e-5)
    for c in range(fed.N):
        fed.assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c])


@pytest.mark.parametrize("mode", ["counts", "clients"])
def test_fedproto_server_prototypes_are_the_weighted_mean(mode):
    rng = np.random.default_rng(1)
    protos = rng.normal(size=(fed.S, fed.C, 8)).astype(np.float32)
    counts = np.array([[3, 0, 5, 0], [1, 2, 0, 0], [4, 4, 4, 0]], np.float32)
    uploaded = np.array([True, True, False])
    method = get_method("fedproto")(fed.setup(), FedProtoConfig(proto_weights=mode))
    server, _ = method.init(jax.random.key(0), fed.N)
    info = ServerRound(jnp.int32(0), jnp.arange(fed.S), jnp.ones(fed.S), jnp.asarray(uploaded))
    uploads = {"prototypes": jnp.asarray(protos), "counts": jnp.asarray(counts), "loss": jnp.zeros(fed.S)}
    out, _ = method.server_update(server, {}, uploads, info)
    exact = protos.astype(np.float64)
    ref, present = _np_aggregate(list(exact[:2]), list(counts[:2]), mode)  # the dropped upload is excluded
    np.testing.assert_array_equal(np.asarray(out["present"]), present)
    # a weighted mean of at most S terms: float32 is within gamma_{S+2} of the mean of their magnitudes
    bound = f32.gamma(fed.S + 2) * _np_aggregate(list(np.abs(exact[:2])), list(counts[:2]), mode)[0]
    f32.assert_within(out["prototypes"], ref, bound, "prototypes")


def test_nearest_prototype_logits_match_float64():
    rng = np.random.default_rng(2)
    f, protos = rng.normal(size=(7, 5)), rng.normal(size=(fed.C, 5))
    present = np.array([True, False, True, True])
    logits = np.asarray(prototypes.nearest_prototype_logits(jnp.asarray(f), jnp.asarray(protos),
                                                            jnp.asarray(present)))
    ref = -np.array([[np.sum((fi - p) ** 2) for p in protos] for fi in f])
    np.testing.assert_allclose(logits[:, present], ref[:, present], rtol=1e-5, atol=1e-5)
    assert np.all(logits[:, 1] < -1e29)
    ref[:, ~present] = -np.inf
    np.testing.assert_array_equal(logits.argmax(axis=1), ref.argmax(axis=1))


@pytest.mark.parametrize("config_type,options", [
    (FedProtoConfig, {"lam": -1.0}), (FedProtoConfig, {"proto_weights": "size"}),
    (FedProtoConfig, {"eval_by": "knn"}),
])
def test_bad_options_raise_user_error(config_type, options):
    with pytest.raises(UserError):
        config_lib.method_options(config_type, options)
