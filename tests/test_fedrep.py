"""FedRep: the head trains first, then the body, with PFLlib's split of the epochs and with the
authors' (head 10 epochs, body 1), stragglers included.

The federation: tests/plain_sgd_federation.py.
"""

import jax
import jax.numpy as jnp
import numpy as np

import plain_sgd_federation as plain_fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.methods import shared_body
from fedjax_pfl.methods.base import ClientRound


def _fedrep_steps(epochs=2, client_epochs=None, **options):
    method = plain_fed.method("fedrep", plain_fed.setup(epochs=epochs), **options)
    server, clients = method.init(jax.random.key(0), 1)
    client = tree_ops.gather(clients, 0)
    variables = shared_body.receive(method, server, client)
    info = ClientRound(jnp.int32(0), jnp.int32(client_epochs or epochs))
    (new_client, _), heard = plain_fed.steps_heard(method, "client_update", server, client, plain_fed.client_data(2),
                                                   jax.random.key(1), info)
    trained = new_client["variables"]
    for part in ("body", "head"):  # both phases trained
        assert not np.allclose(*(np.concatenate([np.ravel(a) for a in jax.tree.leaves(v["params"][part])])
                                 for v in (trained, variables)))
    return [total for _, total in heard]


def test_fedrep_trains_the_head_then_the_body_with_both_splits():
    """13 samples, B = 5: 3 steps an epoch. The step totals of the two phases, in order."""
    assert _fedrep_steps(epochs=2) == [3] * 3 + [6] * 6  # PFLlib: head 1 epoch, then body E = 2
    # the authors' split (local_ep 11, local_rep_ep 1 in their scripts): head 10 epochs, then body 1
    assert _fedrep_steps(epochs=11, head_epochs=10, body_epochs=1) == [30] * 30 + [3] * 3
    # a straggler training 2 of E = 4 epochs takes body_epochs * 2 // 4 = 1 of its 2 body epochs
    assert _fedrep_steps(epochs=4, client_epochs=2, body_epochs=2) == [3] * 3 + [3] * 3
