"""FedBABU: the head never trains in the federation, and evaluation fine-tunes without
changing the state; by default it fine-tunes the whole model for PFLlib's 10 epochs.

The federations: tests/split_model_federation.py, tests/plain_sgd_federation.py. The engine
against a per-client loop: tests/test_engine_equals_loop_split_models.py; learning on real
Fashion-MNIST: tests/test_learning_fmnist_four_clients.py.
"""

import dataclasses

import jax
import numpy as np

import plain_sgd_federation as plain_fed
import split_model_federation as fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.methods import get_method


def test_fedbabu_head_never_trains_and_evaluation_leaves_state_unchanged():
    eng = fed.engine("fedbabu")
    key = jax.random.key(0)
    head0 = fed.host(eng.init(jax.random.split(key)[0])[1]["variables"]["params"]["head"])
    server, clients = fed.run(eng, 2, key)
    fed.close(clients["variables"]["params"]["head"], head0, tol=0)  # every client, after federated training
    before = fed.host((server, clients))
    tuned = eng.evaluate(server, clients, jax.random.key(3))
    fed.close((server, clients), before, tol=0)
    again = eng.evaluate(server, clients, jax.random.key(3))
    np.testing.assert_array_equal(tuned["correct"], again["correct"])
    # fine-tuning at evaluation acts: the head-tuned model differs from the untuned one
    untuned = get_method("fedbabu")(eng.method.setup, dataclasses.replace(eng.method.hparams, finetune_epochs=0))
    data = ClientData(*tree_ops.gather(tuple(eng.train), 1))
    client = tree_ops.gather(clients, 1)
    plain = untuned.eval_variables(server, client, data, jax.random.key(4))
    head_only = get_method("fedbabu")(eng.method.setup, dataclasses.replace(eng.method.hparams, finetune_part="head"))
    fine = jax.jit(head_only.eval_variables)(server, client, data, jax.random.key(4))
    fed.close(plain["params"]["body"], server["body"]["params"], tol=0)
    fed.close(fine["params"]["body"], server["body"]["params"], tol=0)  # part: head (the default, all: below)
    assert not np.allclose(fine["params"]["head"]["logits"]["kernel"], plain["params"]["head"]["logits"]["kernel"])


def test_fedbabu_fine_tunes_the_whole_model_for_pfllibs_ten_epochs_by_default():
    method = plain_fed.method("fedbabu")
    assert (method.hparams.finetune_epochs, method.hparams.finetune_part) == (10, "all")
    server, clients = method.init(jax.random.key(0), 1)
    client = tree_ops.gather(clients, 0)
    server = {"body": jax.tree.map(lambda a: a + 0.01, server["body"])}  # a "trained" global body
    data = plain_fed.client_data(2)  # 13 samples, B = 5: 3 steps an epoch
    tuned, heard = plain_fed.steps_heard(method, "eval_variables", server, client, data, jax.random.key(1))
    assert heard == [(i + 1, 30) for i in range(30)]  # 10 epochs
    body, head = tuned["params"]["body"], tuned["params"]["head"]
    assert not np.allclose(body["mlp"]["dense0"]["kernel"], server["body"]["params"]["mlp"]["dense0"]["kernel"])
    assert not np.allclose(head["logits"]["kernel"], client["variables"]["params"]["head"]["logits"]["kernel"])
    head_only = plain_fed.method("fedbabu", finetune_part="head")
    kept = jax.jit(head_only.eval_variables)(server, client, data, jax.random.key(1))
    jax.tree.map(np.testing.assert_array_equal, kept["params"]["body"], server["body"]["params"])
