"""Client state and data kept in host memory: only the round's cohort [S, ...] goes to the device.

`HostClients` wraps an `Engine` built on host (NumPy) client data. It keeps every client's state as NumPy
arrays [N, ...] (or `numpy.memmap` files in a folder, for more than host RAM). A round's selection is a
pure function of its key (`Engine.plan_round`, computed on the host's CPU backend), so the cohort of round
t+1 is gathered from the store and sent to the device while round t computes; the rows of clients that
round t trained too are then taken from round t's output on the device, and round t's cohort is written
back to the store (a device_get of [S, ...] only). The round itself is `Engine.round_on_rows` on the
cohort: the same plan, keys, stragglers, mapping and server step as the device-kept round, so the numbers
are the same (tests/test_host_clients.py). Evaluation streams all N clients through the device in chunks
and equals `Engine.evaluate`.

Refused (`unsupported`), as they need all N clients at once on the device: methods that update every client
each round (``Schedule.updates_every_client``: FedALA), whose server steps after each client
(``server_steps_per_client``: pFedHN), or whose server state is sized by N (e.g. APPLE, DiversiFed; found
from the method's init shapes, not a list); also ``all_clients_train`` and a
client axis split over several devices.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.engine import client_mapping
from fedjax_pfl.engine.engine import Engine, client_evaluation, is_eval_round, round_keys

HOST_MODES = ("auto", "device", "host")


def server_sized_by_clients(method, num_clients: int) -> list[str]:
    """Paths of the server state's leaves whose shape grows with the number of clients (init's shapes at N
    and N + 1)."""
    key = jax.random.PRNGKey(0)
    a = jax.eval_shape(lambda: method.init(key, num_clients)[0])
    b = jax.eval_shape(lambda: method.init(key, num_clients + 1)[0])
    paths = jax.tree_util.tree_flatten_with_path(a)[0]
    return [jax.tree_util.keystr(p) for (p, x), y in zip(paths, jax.tree.leaves(b)) if x.shape != y.shape]


def unsupported(engine: Engine) -> str | None:
    """Why ``engine``'s run cannot keep client state on the host, in a few words, or None when it can."""
    return why_not_on_host(engine.method, engine.config.all_clients_train, engine.mesh is not None,
                           engine.num_clients)


def why_not_on_host(method, all_clients_train: bool, split: bool, num_clients: int) -> str | None:
    """`unsupported` before an engine is built: ``method``, train.all_clients_train, whether the client axis is
    ``split`` over several devices, and the client count."""
    schedule = method.schedule
    if schedule.updates_every_client:
        return f"method {method.name!r} updates every client each round"
    if schedule.server_steps_per_client:
        return f"method {method.name!r} steps its server after each client"
    if all_clients_train:
        return "train.all_clients_train trains every client each round"
    if split:
        return "the client axis is split over several devices"
    sized = server_sized_by_clients(method, num_clients)
    if sized:
        return f"method {method.name!r} keeps server state sized by the number of clients ({sized[0]})"
    return None


def state_bytes(method, num_clients: int) -> int:
    """Bytes of ``method``'s server and client state at ``num_clients`` clients (from its init's shapes)."""
    shapes = jax.eval_shape(lambda: method.init(jax.random.PRNGKey(0), num_clients))
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(shapes))


def data_bytes(*data) -> int:
    """Bytes of the client data arrays (None entries skipped)."""
    return sum(int(a.nbytes) for d in data if d is not None for a in d)  # no copy of device arrays


def device_bytes() -> int | None:
    """Bytes the first device can hold (memory_stats' limit), else what host memory has free, else None."""
    stats = jax.local_devices()[0].memory_stats() or {}  # this process's (another's is not addressable)
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    from fedjax_pfl.data.client_limits import available_bytes
    return available_bytes()


def choose(mode: str, needed: int, available: int | None, headroom: float = 0.5) -> tuple[bool, str]:
    """(keep client state on the host?, the rule and the estimate in one line) for train.client_state
    ``mode``: 'host' or 'device' as asked; 'auto': host when the [N, ...] state and data (``needed`` bytes)
    exceed ``headroom`` of the device's ``available`` bytes (None: unknown, device)."""
    from fedjax_pfl.data.client_limits import shown
    if mode not in HOST_MODES:
        raise UserError(f"train.client_state must be one of {', '.join(HOST_MODES)}, not {mode!r}")
    if mode != "auto":
        return mode == "host", f"client state on the {mode} (asked)"
    if available is None:
        return False, f"client state on the device: [N, ...] needs {shown(needed)}, device memory unknown"
    host = needed > headroom * available
    where = "host (streamed to the device by cohort)" if host else "device"
    return host, (f"client state on the {where}: [N, ...] state and data need {shown(needed)}, "
                  f"{headroom:.0%} of the device's {shown(available)} is {shown(headroom * available)}")


def keep_on_host(mode: str, engine: Engine) -> tuple[bool, str]:
    """(keep ``engine``'s client state on the host?, why, in one line) for train.client_state ``mode``:
    `choose` on the [N, ...] state and data against the device's memory; under 'auto' a method that needs
    every client on the device (`unsupported`: also a client axis split over several devices, so processes
    never choose apart) stays there and the line says why."""
    why_not = unsupported(engine) if mode == "auto" else None
    if why_not:
        return False, f"client state on the device: {why_not}"
    train, test, val = engine.client_data
    needed = state_bytes(engine.method, engine.num_clients) + data_bytes(train, test, val)
    return choose(mode, needed, device_bytes())


def host_store(a, folder: str | None, name) -> np.ndarray:
    """``a`` (a host array, or a device array on the host's CPU) as a writable store: a NumPy copy, or with
    ``folder`` a memory-mapped .npy file there, written through the file (its pages stay in the page cache,
    not in this process's resident memory, until a cohort reads them)."""
    if folder is None:
        return np.array(a)
    path = os.path.join(folder, f"{name}.npy")
    np.save(path, np.asarray(a))
    return np.load(path, mmap_mode="r+")


class HostClients:
    """Rounds and evaluation of ``engine`` with client state in host memory (``folder``: numpy.memmap files
    there instead). The engine must hold host (NumPy) client data; its [N, ...] data are never sent whole."""

    def __init__(self, engine: Engine, folder: str | None = None, eval_chunk: int = 1024):
        why = unsupported(engine)
        if why:
            raise UserError(f"{why}: client state cannot stay on the host; use train.client_state=device")
        self.engine, self.folder, self.eval_chunk = engine, folder, eval_chunk
        self.progress = engine.progress
        train, test, val = engine.client_data
        self.train, self.test = ClientData(*map(np.asarray, train)), ClientData(*map(np.asarray, test))
        self.val = None if val is None else ClientData(*map(np.asarray, val))
        self.host = jax.devices("cpu")[0]
        self._n = jax.device_put(self.train.n, self.host)
        self._plan = jax.jit(engine.plan_round)
        self._round = jax.jit(self._cohort_round, donate_argnums=(0, 1))
        self._evaluate = jax.jit(self._evaluate_chunk)
        self.clients = None

    # ---------------------------------------------------------------- state
    def init(self, key):
        """Server state on the device; every client's state into the host store (computed on the host CPU, as
        one program, so its numbers are the device-kept engine's), moved there a leaf at a time, each freed once
        stored: at most one leaf [N, ...] more than the state itself."""
        if self.folder is not None:
            os.makedirs(self.folder, exist_ok=True)
        with jax.default_device(self.host):
            server, clients = jax.jit(self.engine.method.init, static_argnums=1)(
                jax.device_put(key, self.host), self.engine.num_clients)
        leaves, tree = jax.tree.flatten(clients)
        del clients
        stored = []
        for i in range(len(leaves)):
            stored.append(host_store(leaves[i], self.folder, i))
            leaves[i].delete()
        self.clients = jax.tree.unflatten(tree, stored)
        return jax.device_put(jax.device_get(server), jax.devices()[0])

    def plan(self, key):
        """The round plan of round key ``key`` (`Engine.plan_round`), computed on the host CPU, as NumPy."""
        with jax.default_device(self.host):
            plan = self._plan(self._n, jax.device_put(key, self.host))
        return jax.device_get(plan)

    def _cohort(self, selected):
        """The selected clients' state and train data, gathered from the host and sent to the device (async)."""
        rows = lambda tree: jax.tree.map(lambda a: a[selected], tree)  # noqa: E731
        return jax.device_put((rows(self.clients), tuple(rows(tuple(self.train)))), jax.devices()[0])

    def _write_back(self, selected, cohort):
        new = jax.device_get(cohort)
        jax.tree.map(lambda store, a: store.__setitem__(selected, a), self.clients, new)

    # ---------------------------------------------------------------- rounds
    def _cohort_round(self, server, cohort, cohort_train, key, plan, round_index, values):
        rows = jnp.arange(plan[0].shape[0])
        return self.engine.round_on_rows(server, cohort, ClientData(*cohort_train), key, plan, rows, round_index,
                                         values)

    def run(self, server, key, rounds: int, first: int = 0, values: dict | None = None):
        """Rounds ``first .. rounds-1`` (round keys from `round_keys`, as `Engine.run`), the next round's cohort
        prefetched while one computes. Returns (server, [metrics of each round as NumPy]); the store holds
        every client's new state."""
        values = values or {}
        if first >= rounds:
            return server, []
        plan = self.plan(round_keys(key, first)[0])
        cohort, data = self._cohort(plan[0])
        done, history = None, []
        for t in range(first, rounds):
            round_key = round_keys(key, t)[0]
            server, new, metrics = self._round(server, cohort, data, round_key, plan, jnp.int32(t), values)
            history.append(metrics)
            if done is not None:  # the previous round's cohort, finished by now, into the store
                self._write_back(*done)
            done = (plan[0], new)
            if t + 1 < rounds:
                following = self.plan(round_keys(key, t + 1)[0])
                cohort, data = self._cohort(following[0])
                cohort = self._fresh_rows(cohort, plan[0], following[0], new)
                plan = following
        self._write_back(*done)
        return server, [jax.device_get(m) for m in history]

    def run_rounds(self, server, clients, key, first: int, count: int, total_rounds: int, eval_every: int,
                   stop: int | None = None, values: dict | None = None):
        """`Engine.run_rounds`'s call on this store (``clients``: the store, returned as it is): rounds
        ``first .. min(first+count, stop, total_rounds)-1``, each round's cohort streamed, the clients evaluated
        after the rounds `is_eval_round` names (with that round's evaluation key, as the engine). Returns
        (server, store, metrics stacked [rounds run, ...] with ``round`` and ``active``, evaluations)."""
        last = min(first + count, total_rounds if stop is None else min(stop, total_rounds))
        history, evaluations, t = [], {}, first
        while t < last:  # up to and including the next evaluated round, then its evaluation
            end = next(u for u in range(t, last) if is_eval_round(u, total_rounds, eval_every) or u == last - 1) + 1
            server, part = self.run(server, key, end, t, values)
            history += part
            if is_eval_round(end - 1, total_rounds, eval_every):
                evaluations[end - 1] = self.evaluate(server, clients, round_keys(key, end - 1)[1], values, end - 1)
            t = end
        metrics = jax.tree.map(lambda *a: np.stack(a), *history) if history else {}
        return server, clients, {**metrics, "round": np.arange(first, last), "active": np.ones(last - first, bool)}, \
            evaluations

    def round(self, server, key, round_index: int, values: dict | None = None):
        """One round with round key ``key`` (`Engine.round`'s contract): (server, metrics as NumPy)."""
        plan = self.plan(key)
        cohort, data = self._cohort(plan[0])
        server, new, metrics = self._round(server, cohort, data, key, plan, jnp.int32(round_index), values or {})
        self._write_back(plan[0], new)
        return server, jax.device_get(metrics)

    @staticmethod
    def _fresh_rows(cohort, previous, following, new):
        """``cohort`` (rows ``following``, gathered from the store) with the rows of clients also in ``previous``
        taken from that round's output ``new``, on the device."""
        where = {int(c): j for j, c in enumerate(previous)}
        source = np.array([where.get(int(c), 0) for c in following])
        again = np.array([int(c) in where for c in following])
        if not again.any():
            return cohort
        return _take_fresh(cohort, new, jnp.asarray(source), jnp.asarray(again))

    # ------------------------------------------------------------ evaluation
    def _evaluate_chunk(self, server, clients, train, test, keys, values, round_index):
        method = self.engine.method_at(values, round_index)
        one = client_evaluation(method, self.engine.eval_batch_size)
        return client_mapping.map_clients(lambda loops, *row: one(loops, server, *row), client_mapping.VMAP)(
            clients, train, test, keys)

    def evaluate(self, server, clients, key, values: dict | None = None, round_index: int = 0):
        """`Engine.evaluate`'s call on this store (``clients``: `clients`, the store itself): per-client test
        metrics of every client (host NumPy), the clients streamed through the device ``eval_chunk`` at a
        time."""
        if clients is not self.clients:
            raise ValueError("HostClients.evaluate reads its own store: pass its .clients")
        n = self.engine.num_clients
        chunk = min(self.eval_chunk, n)
        with jax.default_device(self.host):
            keys = jax.random.split(jax.device_put(key, self.host), n)  # typed or raw keys, on the host
        parts = {}
        for name, held in (("", self.test), ("val_", self.val)):
            if held is None:
                continue
            for start in range(0, n, chunk):
                rows = np.arange(start, start + chunk) % n  # the last chunk padded with repeated rows
                pick = lambda tree: jax.tree.map(lambda a: a[rows], tree)  # noqa: E731
                out = jax.device_get(self._evaluate(server, pick(self.clients), tuple(pick(tuple(self.train))),
                                                    tuple(pick(tuple(held))), keys[rows], values or {},
                                                    jnp.int32(round_index)))
                for k, v in out.items():
                    parts.setdefault(name + k, []).append(np.asarray(v)[:min(chunk, n - start)])
        return {k: np.concatenate(v) for k, v in parts.items()}


@jax.jit
def _take_fresh(cohort, new, source, again):
    return jax.tree.map(lambda c, f: jnp.where(again.reshape((-1,) + (1,) * (c.ndim - 1)), f[source], c),
                        cohort, new)
