"""The federated round as one jit-compiled call, and evaluation of all clients.

A round: (1) select round(N * join_ratio) clients from the round key; (2)
gather their state and data; (3) let the method prepare them (batched server
-> client step); (4) map the method's single-client update over them (vmap,
lax.map, chunked vmap or packed lanes: client_mapping.py); (5) the method's server step on
the stacked uploads; (6) scatter client state back; (7) for a method that
asks (``Schedule.updates_every_client``: FedALA), a per-client step on ALL N
clients with the new server state, mapped like evaluation; (8) the method's
`round_diagnostics` (scalars, e.g. how much clients learn from each other)
join the round metrics. Under ``chunked`` (and
``stream_chunks``), for a method without ``needs_selected_state``, steps 2, 4
and 6 run chunk by chunk instead (`client_mapping.scan_chunks`): the round
holds the [N, ...] state, one chunk's work and the [S, ...] uploads, not
copies of all S selected clients' state. A method whose server steps after
each client (``server_steps_per_client``, pFedHN) runs steps 2-6 client by
client instead (`sequential_clients.scan_clients`). Stragglers (fewer local
epochs, dropped uploads) are drawn from the same key. There is no Python loop
over clients. Evaluation maps every client's personalized model over its test
data in one call; the host reads metrics only when it asks for them.

K rounds can be one call (`run_rounds`: `scan_rounds`, the one scan over
rounds, which engine/rows.py's federations share); many runs train together as
federations, rows of one program (engine/rows.py), not here. With the chunked
mapping, the selected clients are gathered, trained and written back one chunk
at a time, so memory beyond the client state is bounded by the chunk plus the
stacked uploads.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.engine import client_mapping, round_progress, sequential_clients, sharding
from fedjax_pfl.kernels import local_training
from fedjax_pfl.kernels.counted_loop import Loops
from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.engine.lr_schedule import LrSchedule
from fedjax_pfl.methods.base import LR, ClientRound, Hyperparams, Method, ServerRound


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Round mechanics that are not a method's business: a plain record, built by runs/ from the run's train
    settings (runs/config.py declares each one's default and allowed values and checks them; tests that build
    it by hand pass the values)."""

    clients_per_round: int
    client_mapping: str  # client_mapping.ALLOWED; 'auto': this backend's default
    chunk_size: int  # clients vmapped at once under the chunked mapping
    straggler_fraction: float  # selected clients that train 1..E//2 epochs
    drop_fraction: float  # selected clients whose upload is lost
    all_clients_train: bool  # every client trains; only the round's sampled clients upload
    lr_schedule: LrSchedule  # train.lr by round index
    # The engine's own knobs, no run settings:
    largest_eval_batch: int = 256  # evaluation batches: sized to the test sets, at most this
    shard: bool = True  # split the client axis over all devices when there are several
    # chunked: gather, train and scatter the selected clients chunk by chunk where the method allows it
    # (Schedule.needs_selected_state); False: gather all S first (the same numbers; more memory)
    stream_chunks: bool = True
    # single-round calls report local steps and finished clients to the host (round_progress.py; on several
    # devices each reports its own clients)
    progress: bool = False


def clients_per_round(num_clients: int, join_ratio: float) -> int:
    """round(N * join_ratio), at least 1 (docs/methods/conventions.md: client sampling)."""
    return max(1, min(num_clients, int(round(num_clients * join_ratio))))


def select_clients(key, num_clients: int, count: int):
    """``count`` distinct client indices, uniformly at random from the key."""
    if count == num_clients:
        return jax.random.permutation(key, num_clients)
    return jax.random.choice(key, num_clients, (count,), replace=False)


def straggler_plan(key, count: int, local_epochs: int, straggler_fraction: float, drop_fraction: float):
    """(epochs [S] int32, uploaded [S] bool) for the selected clients.

    A fraction of clients (rounded) trains a random count in [1, E // 2] of
    epochs; another independent fraction drops its upload.
    """
    k_slow, k_epochs, k_drop = jax.random.split(key, 3)
    n_slow = int(round(count * straggler_fraction))
    n_drop = int(round(count * drop_fraction))
    slow = jnp.zeros(count, bool).at[jax.random.permutation(k_slow, count)[:n_slow]].set(True)
    few = jax.random.randint(k_epochs, (count,), 1, max(1, local_epochs // 2) + 1)
    epochs = jnp.where(slow, few, local_epochs).astype(jnp.int32)
    dropped = jnp.zeros(count, bool).at[jax.random.permutation(k_drop, count)[:n_drop]].set(True)
    return epochs, ~dropped


def round_keys(key, round_index):
    """(round key, evaluation key) of round ``t``: ``split(fold_in(key, t))``.

    The one key schedule of a run: the CLI, `Engine.run` and fused calls all use it.
    """
    k = jax.random.split(jax.random.fold_in(key, round_index))
    return k[0], k[1]


def every_client_keys(round_key, num_clients: int):
    """Per-client keys of `Method.update_every_client` in a round: ``split(fold_in(round_key, 3), N)``,
    a stream apart from the round key's three (selection, stragglers, client updates)."""
    return jax.random.split(jax.random.fold_in(round_key, 3), num_clients)


def round_diagnostics(method: Method, server, new_server, uploads, info: ServerRound) -> tuple[dict, dict]:
    """`Method.round_diagnostics` split into (scalars, per-client values), as float32: a value is one number
    (the round metrics' ``diagnostics``) or one number per selected client, [S] in the order of
    ``info.selected`` (``client_diagnostics``); ValueError for any other shape."""
    scalars, per_client = {}, {}
    selected = info.selected.shape[0]
    for name, value in method.round_diagnostics(server, new_server, uploads, info).items():
        value = jnp.asarray(value, jnp.float32)
        if value.shape == ():
            scalars[name] = value
        elif value.shape == (selected,):
            per_client[name] = value
        else:
            raise ValueError(f"{method.name}.round_diagnostics: {name!r} has shape {value.shape}; give a scalar "
                             f"or one value per selected client ({selected},)")
    return scalars, per_client


def is_eval_round(round_index, total_rounds: int, eval_every: int):
    """Evaluate after round t when (t + 1) % eval_every == 0 and after the last round."""
    return ((round_index + 1) % eval_every == 0) | (round_index == total_rounds - 1)


def round_plan(key, n, num_clients: int, per_round: int, config: EngineConfig, setup):
    """(selected, epochs, uploaded, client keys, real steps) of the round with key ``key`` of a federation of
    ``num_clients`` clients of train sizes ``n``, ``per_round`` of them sampled: the engine's key contract
    (``split(key, 3)``: selection, stragglers, client keys), each array over the clients that train, in the
    order they were selected. With ``all_clients_train`` every client trains, the sampled ones first, and only
    those count as uploaded."""
    k_sel, k_strag, k_clients = jax.random.split(key, 3)
    selected = select_clients(k_sel, num_clients, per_round)
    training = num_clients if config.all_clients_train else per_round
    if config.all_clients_train:  # the sampled clients, then the others in index order
        sampled = jnp.zeros(num_clients, bool).at[selected].set(True)
        others = jnp.argsort(sampled, stable=True)[: num_clients - per_round]
        selected = jnp.concatenate([selected, others])
    epochs, uploaded = straggler_plan(k_strag, training, setup.local_epochs, config.straggler_fraction,
                                      config.drop_fraction)
    uploaded &= jnp.arange(training) < per_round
    keys = jax.random.split(k_clients, training)
    steps = local_training.real_steps(n[selected], setup.batch_size, epochs, setup.drop_last)
    return selected, epochs, uploaded, keys, steps


def method_at(method: Method, schedule: LrSchedule, values: dict, round_index) -> Method:
    """``method`` reading round ``round_index``'s `Hyperparams`: ``values`` (name -> scalar, traced or not:
    ``lr``, train.lr, and float options; missing ones are the method's bound values) with the lr
    ``schedule``'s factor of the round applied to the lr.

    With no values and a constant schedule this is the method itself, so the
    compiled round is exactly the one of a plain run.
    """
    if not values and schedule.constant:
        return method
    base = values.get(LR, method.setup.lr)
    lr = base if schedule.constant else base * schedule.factor(round_index)
    return method.with_hyperparams(Hyperparams(lr, base, {k: v for k, v in values.items() if k != LR}))


def client_step_of(method: Method, round_index, progress: round_progress.Progress | None = None):
    """``step(loops, server, client, data, key, epochs) -> (client, upload)``: the method's client update of round
    ``round_index`` (``data``: the client's (x, y, n); ``loops``: how its counted loops run); ``progress``: the
    in-round progress it reports to (round_progress.py), None: none."""
    def client_step(loops, server, client, data_i, key_i, epochs_i):
        info = ClientRound(round_index, epochs_i)
        loops = Loops(loops.run, None if progress is None else progress.report_step)
        out = method.with_loops(loops).client_update(server, client, ClientData(*data_i), key_i, info)
        return out if progress is None else progress.report_client(out)

    return client_step


def client_evaluation(method: Method, eval_batch_size: int):
    """``evaluate(loops, server, client, train, test, key) -> {'correct', 'count', 'loss_sum'}``: one client's
    personalized model (`Method.eval_variables`) on its test data (``train``, ``test``: (x, y, n); ``loops``: how
    its counted loops run)."""
    normalize = method.setup.normalize

    def one_client(loops, server, client, train_i, test_i, key_i):
        method_ = method.with_loops(loops)
        variables = method_.eval_variables(server, client, ClientData(*train_i), key_i)

        def batch_metrics(batch):
            logits = method_.eval_logits(variables, batch.x)
            correct, count = losses.accuracy_counts(logits, batch.y, batch.mask)
            nll = losses.cross_entropy(logits, batch.y, batch.mask) * count
            return correct, count, nll

        correct, count, nll = local_training.sum_batches(batch_metrics, ClientData(*test_i), eval_batch_size, normalize,
                                                         loops)
        return {"correct": correct, "count": count, "loss_sum": nll}

    return one_client


def per_client_metrics(selected, epochs, uploaded, uploads) -> dict:
    """The round metrics of each client that trained, in the order given: its index, epochs, whether its
    upload counts and its loss (``uploads['loss']``, else 0)."""
    has_loss = isinstance(uploads, dict) and "loss" in uploads
    client_loss = (jnp.broadcast_to(uploads["loss"], selected.shape) if has_loss
                   else jnp.zeros(selected.shape)).astype(jnp.float32)
    return {"selected": selected, "epochs": epochs, "uploaded": uploaded, "client_loss": client_loss}


def training_steps(setup, n):
    """The local steps each client of ``n`` samples takes in a round of ``setup``'s epochs and batches."""
    return local_training.real_steps(n, setup.batch_size, setup.local_epochs, setup.drop_last)


def compile_round(round_impl, server, clients, train, key, round_index: int, values: dict | None):
    """``round_impl(server, clients, train, key, round_index, values)`` compiled for these arguments, which it
    neither donates nor changes: returns ``run(other=None)``, which executes it on client data ``other`` of
    ``train``'s shapes and placement (``train`` itself when None) (for timing: mapping_choice.py)."""
    args = (server, clients, train, key, jnp.int32(round_index), values or {})
    program = jax.jit(round_impl).lower(*args).compile()
    return lambda other=None: program(*args[:2], train if other is None else other, *args[3:])


def padding_record(steps, mapping: client_mapping.ClientMapping, devices: int, round_index: int) -> dict:
    """Round ``round_index`` of trip counts ``steps`` (in the order the mapping sees them) in client-steps: real,
    executed and sequential steps under ``mapping`` and the padding efficiency (real / executed)."""
    real = int(steps.sum())
    sequential, executed = (int(c) for c in client_mapping.step_counts(steps, mapping, devices))
    return {"round": int(round_index) + 1, "real_client_steps": real, "executed_client_steps": executed,
            "sequential_steps": sequential, "padding_efficiency": round(real / max(executed, 1), 4)}


def scan_rounds(round_fn, evaluate_fn, keys_of, server, clients, key, first, stop, count: int, total_rounds: int,
                eval_every: int):
    """Rounds ``first .. first+count-1`` as ONE `lax.scan` over round slots, slots at or past ``stop`` skipped by a
    branch (``first`` and ``stop`` traced: every call of a run reuses one program); the rounds of a lone run
    (`Engine.run_rounds`) and of federations (engine/rows.py) alike. ``round_fn(server, clients, round_key, t)
    -> (server, clients, metrics)``; ``evaluate_fn(server, clients, eval_key, t) -> per-client arrays``, run at
    evaluation rounds (`is_eval_round`); ``keys_of(key, t) -> (round key, evaluation key)`` (`round_keys`).
    Returns (server, clients, metrics stacked [count, ...] with ``round`` and ``active``, evaluations)."""
    keys = keys_of(key, first)
    state_shape = jax.eval_shape(lambda s, c: round_fn(s, c, keys[0], first), server, clients)
    eval_shape = jax.eval_shape(lambda s, c: evaluate_fn(s, c, keys[1], first), server, clients)
    zeros = lambda shapes: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)  # noqa: E731

    def one_round(carry, slot):
        server, clients = carry
        t = first + slot
        round_key, eval_key = keys_of(key, t)

        def run():
            s, c, m = round_fn(server, clients, round_key, t)
            done = is_eval_round(t, total_rounds, eval_every)
            per_client = jax.lax.cond(done, lambda: evaluate_fn(s, c, eval_key, t), lambda: zeros(eval_shape))
            return s, c, m, per_client, done

        def skip():
            return server, clients, zeros(state_shape[2]), zeros(eval_shape), False

        s, c, m, per_client, done = jax.lax.cond(t < stop, run, skip)
        return (s, c), ({**m, "round": t, "active": t < stop}, {"per_client": per_client, "done": jnp.asarray(done)})

    (server, clients), (metrics, evals) = jax.lax.scan(one_round, (server, clients), jnp.arange(count))
    return server, clients, metrics, evals


class Engine:
    """Runs a method over stacked client data. Build once; call `round` or `run_rounds`."""

    def __init__(self, method: Method, train: ClientData, test: ClientData, config: EngineConfig,
                 val: ClientData | None = None):
        self.method = method
        self.config = config
        self.client_data = (train, test, val)  # as given: `with_mapping` builds its engines from them
        self.num_clients = int(train.n.shape[0])  # real clients; only these are selected and evaluated
        self.progress = round_progress.Progress()  # where this engine's in-round events go (round_progress.py)
        self.mesh = sharding.client_mesh() if config.shard and jax.device_count() > 1 else None
        self.mapping = client_mapping.of(config.client_mapping, config.chunk_size).settled(
            training_steps(method.setup, np.asarray(train.n)), self.training_rows(), sharding.mesh_size(self.mesh))
        # passes over every client (evaluation, `update_every_client`) map like training, lanes from their sizes
        self.every_client_mapping = self._pass_mapping(training_steps(method.setup, np.asarray(train.n)))
        self.streams = self.mapping.kind == "chunked" and config.stream_chunks and not method.schedule.needs_selected_state
        self.padded_clients = sharding.padded_count(self.num_clients, self.mesh)  # array rows (empty ones appended)
        # Evaluation visits clients largest test set first so that chunks are even (host-known sizes);
        # on a mesh each device keeps its own block of clients instead (no reordering across devices).
        self.eval_order = np.argsort(-np.asarray(test.n), kind="stable") if (
            self.mapping.sorts_clients and self.mesh is None) else None
        # evaluation batches sized to the clients' test sets (as few padded rows as the mapping allows)
        test_sizes = np.asarray(test.n) if self.eval_order is None else np.asarray(test.n)[self.eval_order]
        self.eval_batch_size = client_mapping.pass_batch_size(test_sizes, self.mapping, config.largest_eval_batch)
        self.eval_mapping = self._pass_mapping(local_training.real_steps(np.asarray(test.n), self.eval_batch_size, 1,
                                                                         False))
        # every device holds all client data (one device, or host devices sharing the machine's memory)
        self.data_in_place = self.mesh is None or sharding.shares_host_memory(self.mesh)
        if self.mesh is not None:
            train, test, val = sharding.pad_clients((train, test, val), self.padded_clients)
            train, test, val = sharding.place_client_data((train, test, val), self.mesh)
        self.train = train
        self.test = test
        self.val = val  # evaluated beside the test data when given (metrics 'val_*')
        self.eval_data = (test, val)
        if config.clients_per_round > self.num_clients:
            raise ValueError("clients_per_round exceeds the number of clients")
        if config.all_clients_train and not method.schedule.aggregates_uploaded_only:
            raise UserError(f"method {method.name!r} does not support train.all_clients_train; leave it false")
        self._round = jax.jit(self._round_impl, donate_argnums=(0, 1))
        self._evaluate = jax.jit(self._evaluate_with_val)
        self._rounds = jax.jit(self._rounds_impl, donate_argnums=(0, 1), static_argnums=(8, 9, 10))
        self._init = jax.jit(self._padded_init)  # one compile, not one dispatch per op of the method's init

    def training_rows(self) -> int:
        """Clients that train each round (all of them with ``train.all_clients_train``)."""
        return self.num_clients if self.config.all_clients_train else self.config.clients_per_round

    def packed_width(self) -> int:
        """W* of this engine's training: about the expected real client-steps of a round on each device over the
        largest client's (`client_mapping.packed_width`)."""
        steps = training_steps(self.method.setup, np.asarray(self.client_data[0].n))
        return client_mapping.packed_width(steps, self.training_rows(), sharding.mesh_size(self.mesh))

    def _pass_mapping(self, counts) -> client_mapping.ClientMapping:
        """The mapping of a pass over all N clients of trip ``counts`` (`ClientMapping.for_pass`)."""
        return self.mapping.for_pass(counts, len(counts), sharding.mesh_size(self.mesh))

    def with_mapping(self, mapping: str, chunk_size: int | None = None, train: ClientData | None = None) -> "Engine":
        """An engine like this one (method, client data, settings) whose clients are mapped by ``mapping``
        (chunks of ``chunk_size``, default this engine's): the same numbers, other speed and memory; on
        training data ``train`` instead of its own, when given."""
        config = dataclasses.replace(self.config, client_mapping=mapping,
                                     chunk_size=chunk_size or self.config.chunk_size)
        own, test, val = self.client_data
        return Engine(self.method, own if train is None else train, test, config, val=val)

    def compiled_round(self, server, clients, key, round_index: int = 0, values: dict | None = None):
        """This engine's round (round key ``key``) as `compile_round` compiles it; ``run()`` returns (server,
        clients, metrics)."""
        return compile_round(self._round_impl, server, clients, self.train, key, round_index, values)

    # ------------------------------------------------------- traced values
    def method_at(self, values: dict, round_index):
        """This engine's method of round ``round_index`` with ``values`` (module `method_at`)."""
        return method_at(self.method, self.config.lr_schedule, values, round_index)

    # ------------------------------------------------------------------ round
    def _padded_init(self, key):
        server, clients = self.method.init(key, self.num_clients)
        return server, sharding.pad_clients(clients, self.padded_clients)

    def init(self, key):
        server, clients = self._init(key)
        if self.mesh is not None:
            server, clients = sharding.replicate(server, self.mesh), sharding.shard_clients(clients, self.mesh)
        return server, clients

    def run(self, server, clients, key, rounds: int, first: int = 0):
        """Rounds ``first .. rounds-1`` one call each, round keys from `round_keys` (as the CLI)."""
        metrics = None
        for t in range(first, rounds):
            server, clients, metrics = self.round(server, clients, round_keys(key, t)[0], t)
        return server, clients, metrics

    def round(self, server, clients, key, round_index: int, values: dict | None = None):
        """One federated round. Donates ``server`` and ``clients``."""
        return self._round(server, clients, self.train, key, jnp.int32(round_index), values or {})

    def plan_round(self, n, key):
        """(selected, epochs, uploaded, client keys, real steps, order) of the round with key ``key`` over clients
        of train sizes ``n``: the first five in the order the clients train (sorted by steps where the mapping
        wants it; ``order``, else None, is that sort)."""
        selected, epochs, uploaded, keys, steps = round_plan(key, n, self.num_clients, self.config.clients_per_round,
                                                             self.config, self.method.setup)
        if not self.mapping.sorts_clients or self.method.schedule.server_steps_per_client:
            return selected, epochs, uploaded, keys, steps, None
        order = jnp.argsort(-steps, stable=True)  # each chunk runs to its own largest client
        return (*(a[order] for a in (selected, epochs, uploaded, keys, steps)), order)

    def round_padding(self, key, round_index: int = 0) -> dict:
        """The round ``round_index`` with round key ``key`` in client-steps, as its metrics will count them, without
        training: real, executed and sequential steps under this engine's mapping and the padding efficiency
        (real / executed). Under ``map`` (or one client after another) only the efficiency, 1 by construction."""
        if self.method.schedule.server_steps_per_client or self.mapping.kind == "map":  # each client its own steps
            return {"round": int(round_index) + 1, "padding_efficiency": 1.0}  # (no compile for the record)
        steps = jax.jit(lambda n, k: self.plan_round(n, k)[4])(jnp.asarray(self.client_data[0].n), key)
        return padding_record(steps, self.mapping, sharding.mesh_size(self.mesh), round_index)

    def _round_impl(self, server, clients, train, key, round_index, values, report=False):
        """One round. With ``all_clients_train`` (train.all_clients_train, as the
        pFedMe authors' serverpFedMe.py: every user trains, then the sampled
        ones are aggregated) all N clients train, the sampled ones first, and
        only the sampled ones count as uploaded (server steps weight uploads by
        ``info.uploaded``); the metrics' ``selected`` then lists all N. With
        join_ratio 1 it is the default round. ``values``: the hyperparameters the round takes as an argument (`method_at`). ``report``: in-round
        progress callbacks (round_progress.py)."""
        plan = self.plan_round(train.n, key)
        return self.round_on_rows(server, clients, train, key, plan, plan[0], round_index, values, report)

    def round_on_rows(self, server, clients, train, key, plan, rows, round_index, values, report=False):
        """The round with key ``key`` and ``plan`` (`plan_round`'s six arrays) on client state and data whose selected
        clients lie at ``rows`` [S] (the plan's global indices when ``clients`` and ``train`` hold all N; positions in
        a cohort's arrays when they hold only those: engine/host_clients.py). Returns (server, clients, metrics)."""
        cfg, method = self.config, self.method_at(values, round_index)
        selected, epochs, uploaded, keys, steps, order = plan
        training = selected.shape[0]
        sequential = method.schedule.server_steps_per_client  # sequential_clients.py: no mapping, the selection order

        client_step = client_step_of(method, round_index, self.progress if report else None)
        info = ServerRound(round_index, selected, train.n[rows].astype(jnp.float32), uploaded)
        started_from = server  # the round's server state, for the method's diagnostics
        if sequential:  # the server steps after each client
            server, clients, uploads = sequential_clients.scan_clients(method, client_step, server, clients, train,
                                                                       info, keys, epochs)
        elif self.streams:  # each chunk: gather its rows, train them (vmap), write them back
            def train_chunk(clients, positions):
                chunk = rows[positions]
                new, uploads = self._train_clients(client_step, server, tree_ops.gather(clients, chunk), train, chunk,
                                                   keys[positions], epochs[positions], steps[positions],
                                                   mapping=client_mapping.VMAP)
                return tree_ops.scatter(clients, chunk, new), uploads

            clients, uploads = client_mapping.scan_chunks(train_chunk, clients, training, cfg.chunk_size)
            chosen = None
        else:
            chosen = method.prepare(server, tree_ops.gather(clients, rows), selected)
            chosen, uploads = self._train_clients(client_step, server, chosen, train, rows, keys, epochs, steps)
        if not sequential:
            server, chosen = method.server_update(server, chosen, uploads, info)
            if not self.streams:
                clients = tree_ops.scatter(clients, rows, chosen)
        if method.schedule.updates_every_client:
            clients = self._update_every_client(method, server, clients, train, key, round_index)
        how = (client_mapping.MAP if sequential else self.mapping, sharding.mesh_size(self.mesh))  # as round_padding
        diagnostics, client_diagnostics = round_diagnostics(method, started_from, server, uploads, info)
        per_client = {**per_client_metrics(selected, epochs, uploaded, uploads), "client_diagnostics": client_diagnostics}
        train_loss = jnp.mean(per_client["client_loss"])
        if order is not None:  # the metrics list the clients as selected, whatever order they trained in
            per_client = jax.tree.map(lambda a: a[jnp.argsort(order)], per_client)
        metrics = {
            **per_client,
            "train_loss": train_loss,
            "real_steps": steps.sum(),
            **dict(zip(("sequential_steps", "executed_steps"), client_mapping.step_counts(steps, *how))),
            "diagnostics": diagnostics,
        }
        return server, clients, metrics

    def _update_every_client(self, method, server, clients, train, key, round_index):
        """`Method.update_every_client` on all N clients after the server step, mapped like evaluation;
        client keys from `every_client_keys`. Padding rows (sharding) stay as they were."""
        keys = sharding.pad_clients(every_client_keys(key, self.num_clients), self.padded_clients)
        real = jnp.arange(self.padded_clients) < self.num_clients

        def one_client(loops, shared, client, data_i, key_i, real_i):
            server, round_index = shared
            new = method.with_loops(loops).update_every_client(server, client, ClientData(*data_i), key_i, round_index)
            return tree_ops.select(real_i, new, client)

        return self._map_clients(one_client, self.every_client_mapping)((server, round_index), clients, tuple(train),
                                                                        keys, real)

    # ------------------------------------------------------------ fused rounds
    def run_rounds(self, server, clients, key, first: int, count: int, total_rounds: int, eval_every: int,
                   stop: int | None = None, values: dict | None = None):
        """Rounds ``first .. min(first+count, stop, total_rounds)-1`` in ONE compiled call.

        A `lax.scan` over ``count`` round slots; slots at or past ``stop``
        (default ``total_rounds``) are skipped by a branch, so every call of a
        run reuses one program (``first`` and ``stop`` are traced). Each
        round uses `round_keys` and, at evaluation rounds (`is_eval_round`), the
        clients are evaluated inside the call. Returns (server, clients,
        metrics, evaluations) as host NumPy: ``metrics`` holds the round
        metrics stacked [count, ...] plus ``round`` and ``active``;
        ``evaluations`` maps each evaluated round to its per-client arrays.
        Equal to ``count`` calls of `round` (tests/test_engine.py). Donates
        ``server`` and ``clients``. ``values``: the hyperparameters the round takes as an argument (`method_at`).
        """
        server, clients, metrics, evals = self._rounds(
            server, clients, self.train, self.eval_data, key, jnp.int32(first),
            jnp.int32(total_rounds if stop is None else min(stop, total_rounds)), values or {}, count, total_rounds,
            eval_every)
        metrics, evals = jax.device_get((metrics, evals))
        return server, clients, metrics, evaluations_of(metrics, evals)

    def _rounds_impl(self, server, clients, train, eval_data, key, first, stop, values, count, total_rounds, eval_every):
        report = self.config.progress and count == 1  # fused calls are short anyway
        out = scan_rounds(lambda s, c, k, t: self._round_impl(s, c, train, k, t, values, report),
                          lambda s, c, k, t: self._evaluate_with_val(s, c, train, eval_data, k, values, t),
                          round_keys, server, clients, key, first, stop, count, total_rounds, eval_every)
        return *out[:2], *sharding.on_every_device(out[2:], self.mesh)  # read by every process

    # ------------------------------------------------------------- evaluation
    def evaluate(self, server, clients, key, values: dict | None = None, round_index: int = 0):
        """Per-client test metrics of every client's personalized model (host numpy), after round ``round_index``."""
        out = self._evaluate(server, clients, self.train, self.eval_data, key, values or {}, jnp.int32(round_index))
        return {k: np.asarray(v) for k, v in jax.device_get(out).items()}

    def _evaluate_with_val(self, server, clients, train, eval_data, key, values, round_index):
        """Metrics on ``eval_data = (test, val)``: the test data's, plus the validation data's as
        'val_correct', 'val_count', 'val_loss_sum' when ``val`` is not None."""
        test, val = eval_data
        out = self._evaluate_impl(server, clients, train, test, key, values, round_index)
        if val is None:
            return out
        val = self._evaluate_impl(server, clients, train, val, key, values, round_index)
        return {**out, **{f"val_{k}": v for k, v in val.items()}}

    def evaluate_summary(self, server, clients, key) -> dict:
        """`summarize_evaluation` of `evaluate`: mean / weighted / std accuracy and loss."""
        return summarize_evaluation(self.evaluate(server, clients, key))

    def _evaluate_impl(self, server, clients, train, test, key, values, round_index):
        method = self.method_at(values, round_index)
        keys = sharding.pad_clients(jax.random.split(key, self.num_clients), self.padded_clients)
        mapped = self._map_clients(client_evaluation(method, self.eval_batch_size), self.eval_mapping)
        args = (clients, tuple(train), tuple(test), keys)
        if self.eval_order is None:
            out = jax.tree.map(lambda a: a[:self.num_clients], mapped(server, *args))  # empty clients dropped
            return sharding.on_every_device(out, self.mesh)
        order = jnp.asarray(self.eval_order)
        out = mapped(server, *tree_ops.gather(args, order))
        return tree_ops.gather(out, jnp.argsort(order))

    def _train_clients(self, client_step, server, chosen, train, rows, keys, epochs, steps,
                       mapping: client_mapping.ClientMapping | None = None):
        """``client_step(server, client, data, key, epochs)`` over the clients ``rows`` (their state ``chosen``,
        keys, epochs and real step counts ``steps`` stacked in that order), mapped and dealt to the devices
        (evenly by ``steps``). Where every device holds
        all client data (`data_in_place`) each client reads its own rows where they lie; else the rows are
        gathered first (a copy of every selected client's padded data: 12% of an MLP round on one device,
        21% on two host devices, when it was done everywhere)."""
        costs = {} if self.mesh is None else {"costs": steps}
        if not self.data_in_place:
            mapped = self._map_clients(client_step, mapping=mapping)
            return mapped(server, chosen, tuple(tree_ops.gather(train, rows)), keys, epochs, **costs)

        def step_in_place(loops, shared, client, row, key_i, epochs_i):
            server, train = shared
            return client_step(loops, server, client, tuple(a[row] for a in train), key_i, epochs_i)

        return self._map_clients(step_in_place, mapping=mapping)((server, train), chosen, rows, keys, epochs, **costs)

    def _map_clients(self, fn, mapping: client_mapping.ClientMapping | None = None):
        """``fn(loops, shared, *row)`` as ``mapped(shared, *rows)``: `client_mapping.map_clients` over the rows (the
        engine's mapping unless ``mapping``), split over the mesh's devices when there is one; ``shared``
        (server state, round index) reaches every client whole (`sharding.split_over_devices`)."""
        how = mapping or self.mapping

        def mapped(shared, *rows):
            return client_mapping.map_clients(lambda loops, *row: fn(loops, shared, *row), how)(*rows)

        return mapped if self.mesh is None else sharding.split_over_devices(mapped, self.mesh)


def evaluations_of(metrics, evals) -> dict:
    """{evaluated round: per-client arrays} from a fused call's host outputs."""
    return {
        int(t): {k: np.asarray(v[j]) for k, v in evals["per_client"].items()}
        for j, t in enumerate(metrics["round"]) if evals["done"][j]
    }


def summarize_evaluation(per_client) -> dict:
    """Unweighted mean, sample-weighted accuracy, std over clients, mean loss."""
    correct, count = per_client["correct"], per_client["count"]
    has = count > 0
    acc = np.where(has, correct / np.maximum(count, 1), 0.0)[has]
    out = {
        "accuracy": float(acc.mean()) if acc.size else float("nan"),
        "accuracy_weighted": float(correct.sum() / max(count.sum(), 1)),
        "accuracy_std": float(acc.std()) if acc.size else float("nan"),
        "loss": float(per_client["loss_sum"].sum() / max(count.sum(), 1)),
    }
    if "val_count" in per_client:  # validation data (partition.val_fraction): same summary, 'val_' names
        val = summarize_evaluation({k[4:]: v for k, v in per_client.items() if k.startswith("val_")})
        out.update({f"val_{k}": v for k, v in val.items()})
    return out
