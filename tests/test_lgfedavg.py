"""LG-FedAvg: the server averages the heads, each client keeps its body.

The federation: tests/split_model_federation.py. The engine against a
per-client loop: tests/test_engine_equals_loop_split_models.py; learning on
real Fashion-MNIST: tests/test_learning_fmnist_four_clients.py.
"""

import jax
import numpy as np

import split_model_federation as fed
from fedjax_pfl.core import tree_ops


def test_lgfedavg_shares_heads_and_keeps_bodies():
    eng = fed.engine("lgfedavg")
    server0, clients0 = eng.init(jax.random.key(0))
    server0, clients0 = fed.host(server0), fed.host(clients0)
    server, clients, metrics = eng.round(*eng.init(jax.random.key(0)), jax.random.key(1), 0)
    selected = np.asarray(metrics["selected"])
    others = np.setdiff1d(np.arange(len(fed.SIZES)), selected)
    # the server head is the n_i-weighted mean of the selected clients' trained heads
    heads = tree_ops.part_of(tree_ops.gather(clients["variables"], selected), "head")
    w = np.asarray(fed.SIZES, np.float64)[selected]
    expect = jax.tree.map(lambda a: np.tensordot(w / w.sum(), np.asarray(a, np.float64), 1), heads)
    fed.close(server["head"], expect)
    assert not np.allclose(server["head"]["params"]["logits"]["kernel"], server0["head"]["params"]["logits"]["kernel"])
    # evaluated models: one head for all, bodies of trained clients differ from each other and from init
    evaluated = [eng.method.eval_variables(server, tree_ops.gather(clients, c), None, None)
                 for c in range(len(fed.SIZES))]
    for v in evaluated:
        fed.close(v["params"]["head"], server["head"]["params"], tol=0)
    body = [np.asarray(v["params"]["body"]["mlp"]["dense0"]["kernel"]) for v in evaluated]
    init_body = clients0["variables"]["params"]["body"]["mlp"]["dense0"]["kernel"][0]
    for i, a in enumerate(selected):
        assert not np.allclose(body[a], init_body)
        for b in selected[i + 1:]:
            assert not np.allclose(body[a], body[b])
    for c in others:
        np.testing.assert_array_equal(body[c], init_body)
