"""Sharding of the client axis over devices, for any client count on any device count.

Client state and client data carry the client axis first; on several devices
that axis is split over a one-dimensional `jax.sharding.Mesh` named
'clients' (NamedSharding). Each device maps its own clients under
`jax.shard_map` (`split_over_devices`); under jit XLA turns server
reductions into collectives. One device: nothing changes. On a CPU the
training command makes one host device per core (runs/host_devices.py).

Any client count: the client axis is padded with empty clients (zero state,
``n = 0`` data) up to a multiple of the device count (`padded_count`,
`pad_clients`). The engine selects only real clients and slices evaluation
back to them, so padding never reaches a metric or a server step.

The selected clients of a round: gathering rows ``selected`` [S] of a
client-sharded array compiles (XLA SPMD, checked on jax 0.10.2 CPU with 4
devices) to a local masked gather on each device plus an all-reduce of the
[S, ...] rows: never an all-gather of the whole client state. The per-client
work is then split over devices by `split_over_devices` (`jax.shard_map`:
each device maps its own S/devices rows, dealt by `balanced_slots` of cost), and
the scatter back all-gathers only the [S, ...] updated rows before each device
writes its own. Client data are split like client state, except on host
devices of one machine, which each hold all of them (`place_client_data`):
there the gather of a round's data is local.

Multi-host (distributed.py): every process holds the whole (small) pool on
the host; `shard_clients` builds each global array from the rows of the
process's own devices (`jax.make_array_from_callback`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_pfl.engine.dealing import balanced_slots

AXIS = "clients"


def client_mesh(devices=None) -> Mesh:
    """A 1-D mesh over ``devices`` (default: all devices of all processes) with axis 'clients'."""
    return Mesh(np.asarray(devices if devices is not None else jax.devices()), (AXIS,))


def mesh_size(mesh: Mesh | None) -> int:
    return 1 if mesh is None else int(mesh.devices.size)


def padded_count(num_clients: int, mesh: Mesh | None) -> int:
    """``num_clients`` rounded up to a multiple of the device count."""
    size = mesh_size(mesh)
    return -(-num_clients // size) * size


def pad_clients(tree, count: int):
    """Zero rows appended to every leaf's leading (client) axis up to ``count``.

    Zero client data has ``n = 0`` (an empty client); zero client state is
    never trained or read by a server step, since empty clients are never
    selected. Leaves already ``count`` long are returned unchanged.
    """
    def pad(a):
        extra = count - np.shape(a)[0]
        if extra == 0:
            return a
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):  # typed keys: pad their key data
            return jax.random.wrap_key_data(pad(jax.random.key_data(a)), impl=jax.random.key_impl(a))
        return jnp.concatenate([jnp.asarray(a), jnp.zeros((extra,) + np.shape(a)[1:], a.dtype)])

    return jax.tree.map(pad, tree)


def _place(a, sharding: NamedSharding):
    """``a`` (one host value, the same in every process) as a global array with ``sharding``."""
    if jax.process_count() == 1:
        return jax.device_put(a, sharding)
    host = np.asarray(a)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_clients(tree, mesh: Mesh):
    """Place every leaf with its leading (client) axis split over the mesh.

    Leaves whose leading axis does not divide evenly (e.g. scalars) are
    replicated; pad with `pad_clients` first so that client leaves divide.
    """
    size = mesh.devices.size

    def place(a):
        spec = PartitionSpec(AXIS) if np.ndim(a) >= 1 and np.shape(a)[0] % size == 0 else PartitionSpec()
        return _place(a, NamedSharding(mesh, spec))

    return jax.tree.map(place, tree)


def shares_host_memory(mesh: Mesh) -> bool:
    """Whether every device of ``mesh`` is a CPU host device of this one process (runs/host_devices.py):
    they share the machine's memory, so client data are best replicated on each (`place_client_data`)."""
    return jax.process_count() == 1 and all(d.platform == "cpu" for d in mesh.devices.flat)


def place_client_data(tree, mesh: Mesh):
    """Client data (padded to a multiple of the device count) on the mesh.

    Split over the devices like client state (`shard_clients`), except on host
    devices that share one machine's memory (`shares_host_memory`): there each
    device holds all of it, so that gathering a round's clients, dealt to
    devices in another order than the blocks they hold, moves no data between
    devices. Split, that gather is a masked gather plus an all-reduce of the
    selected rows, slower than reading them where they lie (benchmarks/RESULTS.md,
    "Client data held whole by each host device"). The cost is one copy of
    the padded data per device.
    """
    return replicate(tree, mesh) if shares_host_memory(mesh) else shard_clients(tree, mesh)


def replicate(tree, mesh: Mesh):
    return jax.tree.map(lambda a: _place(a, NamedSharding(mesh, PartitionSpec())), tree)


def split_over_devices(mapped, mesh: Mesh):
    """``mapped(shared, *rows)`` (a mapping over the rows' leading client axis) with that axis split over the mesh.

    ``run(shared, *rows, costs=None)``: each device runs ``mapped`` on its own
    rows under `jax.shard_map`, as one device would on all of them (a
    per-client convolution stays per-client; a vmap over the devices would
    batch it). With ``costs`` [S] (the clients' step counts) the rows are dealt
    by `balanced_slots`, so every device has about the same work; without, device
    d takes a contiguous block (matching `shard_clients`: no data move for the
    whole client axis), the S rows padded by repeating the last to a multiple of
    the device count. Padded rows' results are dropped. ``shared`` (the server
    state, the round index, client data held whole: any pytree) reaches every
    device whole, as an input replicated over the mesh. Pass such values there,
    never by closure: a closed-over argument of the outer jit keeps the outer
    mesh in its type, and ``jnp.zeros_like`` of it inside the devices' map
    fails (an optimizer's init on the server's parameters does that).
    """
    size = mesh.devices.size
    spec = PartitionSpec(AXIS)

    def run(shared, *rows, costs=None):
        count = jax.tree.leaves(rows)[0].shape[0]
        per = -(-count // size)
        if costs is not None:
            slots, slot_of = balanced_slots(costs, size)
        else:
            slots, slot_of = jnp.minimum(jnp.arange(size * per), count - 1), jnp.arange(count)
        # check_vma=False: the clients' loops carry values that start from the (same on every device) server
        # state and become per-device; the varying-type check would reject such carries
        local = jax.shard_map(mapped, mesh=mesh, in_specs=(PartitionSpec(),) + (spec,) * len(rows),
                              out_specs=spec, check_vma=False)
        out = local(shared, *jax.tree.map(lambda a: a[slots], rows))
        return jax.tree.map(lambda a: a[slot_of], out)

    return run


def on_every_device(tree, mesh: Mesh | None):
    """Inside jit: ``tree`` replicated over the mesh, so that every process can read it on the host
    (metrics, evaluations; small arrays). No mesh: unchanged."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec()))
