"""Each method's evaluation protocols name what they evaluate (`eval_models`, recorded as `eval_model`).

Records and tables print the protocol's name, so a wrong one misleads
whoever reads them: Ditto and APFL evaluate each client's personal model
(``local``, not FedAvg's ``global``), FedBABU the fine-tuned global model
(``global``). After one
trained round: a ``global`` protocol evaluates the server's current state,
so moving the server's parameters moves the clients' test losses; a
``local`` one evaluates each client's own model, so it does not; the
protocols of one method give different evaluations.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import method_sample
from fedjax_pfl.methods import get_method, method_names
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import build_experiment, validate

SYNTHETIC = ["data.name=synthetic", "model.name=mlp", "model.hidden=[16]", "partition.scheme=natural",
             "partition.num_clients=4", "train.local_epochs=1", "train.batch_size=8"]
EXTRA = {"pfakd_at": ["data.name=fmnist", "model.name=pfakd_cnn", "model.hidden=", "partition.scheme=iid",
                      "partition.train_per_client=8", "partition.test_per_client=4"]}
# 'local' models the server stores for its clients: moving the server moves them.
SERVER_HELD = {"fedcac": "the server computes and keeps every client's personalized model (row i)",
               "pfedhn": "the server's hypernetwork generates each client's model from its embedding"}
EVERY_PROTOCOL = [(m, p) for m in method_names() for p in get_method(m).eval_models]
# each protocol kind: plain global (FedAvg), personal models kept by the client (Ditto, APFL) or by the
# server (FedCAC, pFedHN), fine-tuned global (FedBABU), both protocols of a shared-body method (FedPer,
# LG-FedAvg, FedAS), and the special ones (FedALA's ALA start, kNN-Per's memory, Per-FedAvg's step)
PROTOCOLS = method_sample.sample(EVERY_PROTOCOL, ("apfl", "ditto", "fedala", "fedas", "fedavg", "fedbabu", "fedcac",
                                                  "fedper", "knnper", "lgfedavg", "perfedavg", "pfedhn"))


@functools.lru_cache(maxsize=None)  # both tests use each (method, protocol): build and train it once
def _trained(method, protocol):
    cfg = config_lib.build(overrides=[f"method_name={method}", *SYNTHETIC, *EXTRA.get(method, []),
                                      f"eval.model={protocol}"])
    engine, key = build_experiment(validate(cfg), progress=False).engine, jax.random.key(0)
    server, clients = engine.init(key)
    server, clients, _, _ = engine.run_rounds(server, clients, key, 0, 1, 2, 2)
    return engine, server, clients, key


def _moved(tree):
    """Every floating leaf plus N(0, 0.5^2) noise (a uniform shift could leave softmax unchanged)."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(1), max(len(leaves), 1))
    return treedef.unflatten([a + 0.5 * jax.random.normal(k, a.shape, a.dtype)
                              if jnp.issubdtype(a.dtype, jnp.floating) else a for a, k in zip(leaves, keys)])


def test_every_protocol_is_global_or_local():
    assert all(p.split("_")[0] in ("global", "local") for _, p in EVERY_PROTOCOL), EVERY_PROTOCOL


@pytest.mark.parametrize("method,protocol", PROTOCOLS)
def test_protocol_name_says_whether_the_server_state_is_evaluated(method, protocol):
    engine, server, clients, key = _trained(method, protocol)
    before = engine.evaluate(server, clients, key)["loss_sum"]
    after = engine.evaluate(_moved(server), clients, key)["loss_sum"]
    moves = not np.allclose(before, after, rtol=1e-5, atol=1e-5)
    assert moves == (protocol.startswith("global") or method in SERVER_HELD), (method, protocol, before, after)


@pytest.mark.parametrize("method", sorted({m for m, _ in PROTOCOLS if len(get_method(m).eval_models) > 1}))
def test_a_methods_protocols_evaluate_different_models(method):
    losses = []
    for protocol in get_method(method).eval_models:
        engine, server, clients, key = _trained(method, protocol)
        losses.append(engine.evaluate(server, clients, key)["loss_sum"])
    assert not any(np.allclose(a, b) for i, a in enumerate(losses) for b in losses[i + 1:]), (method, losses)
