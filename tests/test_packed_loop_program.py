"""What a packed loop compiles to (engine/packed_loops.py): straight-line steps, no copy of any lane's state.

A conditional per step (taken when a lane finished its client) used to copy
every lane's parameters in its pass-through branch at every step; the lanes
now write out and start clients with masked scatters, in an order that lets
XLA update the lanes' state in place. Read from the optimised HLO on the CPU
(XLA's copy insertion is the same pass on every backend).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

import hlo_text
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.engine import packed_loops
from fedjax_pfl.kernels.counted_loop import PLAIN
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

LANES, CLIENTS = 3, 7


def _lane_state_copies(text: str, leaf_shapes, lanes: int):
    """Copies of a [lanes, *leaf] array, and conditionals, in the loop bodies of ``text`` and what they call."""
    comps = hlo_text.computations(text)
    names = set().union(*(hlo_text.reachable(comps, b) for b in hlo_text.while_bodies(comps)))
    stacked = {(lanes, *shape) for shape in leaf_shapes}
    return [c for c in hlo_text.copies(comps, names) if c[1] in stacked], hlo_text.conditionals(comps, names)


def test_a_packed_sgd_loop_copies_no_lanes_parameters_and_branches_nowhere():
    """Plain SGD of a linear map, each client its own steps: the packed loop's body neither copies a lane's
    parameters nor holds a conditional, and the numbers are the unpacked loop's. (One weight matrix: XLA:CPU
    copies a leaf that another leaf's update also reads, e.g. a bias, in any training loop, packed or not.)"""
    def client(loops, n, x, y):
        def body(i, params):
            grad = jax.grad(lambda p: jnp.sum((x[i % 4] @ p["w"] - y[i % 4]) ** 2))(params)
            return jax.tree.map(lambda p, g: p - 0.01 * g, params, grad)
        return packed_loops.counted_loop(body, n, {"w": jnp.zeros((5, 3))}, loops)

    counts = jnp.array([9, 1, 5, 0, 4, 3, 12])
    x = jax.random.normal(jax.random.key(0), (CLIENTS, 4, 5))
    y = jax.random.normal(jax.random.key(1), (CLIENTS, 4, 3))

    def packed(counts, x, y):
        return packed_loops.in_lanes(client, LANES)(counts, x, y)

    got = jax.jit(packed)(counts, x, y)
    want = jax.vmap(functools.partial(client, PLAIN))(counts, x, y)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    text = jax.jit(packed).lower(counts, x, y).compile().as_text()
    found, branches = _lane_state_copies(text, [(5, 3)], LANES)
    assert found == [] and branches == 0, (found, branches)


def test_a_packed_round_adds_no_copy_of_parameters_to_what_a_per_client_loop_has():
    """FedAvg's round (an MLP, momentum SGD): the packed round's loops hold no conditional, and copy no more
    parameter leaves a step (XLA:CPU keeps a copy where a value is read beside the update, e.g. for the loss)
    than the same round with one client at a time (``map``)."""
    sizes = [23, 3, 0, 11, 16, 7]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (sum(sizes), 4, 4, 1), dtype=np.uint8)
    y = rng.integers(0, 3, sum(sizes)).astype(np.int32)
    data = stack_clients(x, y, np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1]))
    setup = local_setup(model=build_model("mlp", (4, 4, 1), 3, hidden=(37,)),
                        optimizer=functools.partial(optax.sgd, momentum=0.5), lr=0.1, batch_size=5, local_epochs=2,
                        normalize=lambda a: a.astype(jnp.float32) / 255.0)
    found = {}
    for mapping, lanes in (("packed:3", 3), ("map", None)):
        eng = engine_lib.Engine(get_method("fedavg")(setup), data, data, engine_config(4,
                                                                                                client_mapping=mapping))
        server, clients = eng.init(jax.random.key(0))
        text = jax.jit(eng._round_impl).lower(server, clients, eng.train, jax.random.key(1), jnp.int32(0),
                                              {}).compile().as_text()
        leaves = [a.shape for a in jax.tree.leaves(server["variables"])]
        comps = hlo_text.computations(text)
        names = set().union(*(hlo_text.reachable(comps, b) for b in hlo_text.while_bodies(comps)))
        shapes = {tuple(s) if lanes is None else (lanes, *s) for s in leaves}
        found[mapping] = ([c for c in hlo_text.copies(comps, names) if c[1] in shapes],
                          hlo_text.conditionals(comps, names))
    assert found["packed:3"][1] == 0, found
    assert len(found["packed:3"][0]) <= len(found["map"][0]), found
