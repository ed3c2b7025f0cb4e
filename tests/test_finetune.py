"""Evaluation fine-tuning (methods/finetune.py): option errors, and FedAvg's fine-tuned model is
the global model trained on the client's data.

The federation: tests/split_model_federation.py.
"""

import jax
import numpy as np
import pytest

import split_model_federation as fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods import training
from fedjax_pfl.methods.fedavg import FedAvgConfig
from fedjax_pfl.runs import config as config_lib


@pytest.mark.parametrize("options, match", [({"finetune_epochs": -1}, "finetune_epochs"),
                                            ({"finetune_part": "neck"}, "finetune_part")])
def test_bad_finetune_option_is_a_user_error(options, match):
    for name in ("fedavg", "fedprox", "fedbabu"):
        with pytest.raises(UserError, match=match):
            config_lib.method_options(get_method(name).hparams_type, options)


def test_fedavg_finetune_is_the_global_model_trained_on_the_clients_data():
    """finetune_epochs=0: the global model; k: k epochs of CE on part P from it; state unchanged."""
    eng = fed.engine("fedavg", FedAvgConfig(finetune_epochs=0))
    server, clients = fed.run(eng, 1, jax.random.key(0))
    data = ClientData(*tree_ops.gather(tuple(eng.train), 1))
    key = jax.random.key(7)
    plain = eng.method.eval_variables(server, clients, data, key)
    fed.close(plain, server["variables"], tol=0)
    method = get_method("fedavg")(eng.method.setup, FedAvgConfig(finetune_epochs=3, finetune_part="head"))

    @jax.jit
    def tuned_and_expected(server, data, key):
        expect, _ = training.train(method.local, training.supervised_objective(method), server["variables"], data,
                                   key, 3, part="head", max_epochs=3)
        return method.eval_variables(server, None, data, key), expect

    tuned, expect = tuned_and_expected(server, data, key)
    fed.close(tuned, expect, tol=0)
    fed.close(tuned["params"]["body"], server["variables"]["params"]["body"], tol=0)
    assert not np.allclose(tuned["params"]["head"]["logits"]["kernel"],
                           server["variables"]["params"]["head"]["logits"]["kernel"])
