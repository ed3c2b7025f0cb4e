"""Many federations of one method as rows of ONE compiled program.

F federations train at once: each has its own clients (a data partition of
its own, or one it shares with others), its own number of clients sampled a
round (the participation P), its own seed (initial state, sampling, batch
order) and its own server state, aggregation and metrics; they share the
method, its options and the round settings (epochs, batch size, lr and its
schedule, stragglers, rounds, evaluation). A round of the program:

1. each federation draws its round exactly as a lone run (`engine.round_plan`
   on its own round key: selection, stragglers, client keys), vmapped over
   the federations of one (clients, clients per round) shape;
2. the (federation, client) pairs that train are the ROWS of one mapped
   call (engine/client_mapping.py): each row trains one client from its
   federation's server state, reading its own data rows where they lie. A
   client that does not train this round is no row: it takes no lane time.
   Under ``packed`` the rows of all federations share the lanes, so the
   program runs about max(largest client, all rows' steps / W) steps of W
   lanes where one federation alone runs its largest client's;
3. each federation's `prepare` and `server_update` run on its own rows
   (vmapped over the federations of one shape), then the rows scatter back;
4. evaluation and `update_every_client` map over every federation's
   clients, each with its federation's server state and keys.

The federations' client state is one [M, ...] array (federation f's clients
at rows offset_f .. offset_f + N_f - 1); their data are the distinct
partitions, padded to one largest client, each stored once. Each federation's
numbers equal its lone `Engine` run with the same keys: exactly for integer
state, to float tolerance otherwise (tests/test_federations.py). Where that
cannot hold the pool refuses in one line (`refusal`): a method whose server
steps after each client, server states whose shapes differ between the
federations, augmentation when the federations' largest clients differ (a
step's augmentation key follows the padded length). One device: no mesh.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.engine import client_mapping, round_progress
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods.base import Method, ServerRound


@dataclasses.dataclass(frozen=True, eq=False)
class Federation:
    """One federation of a pool: its clients' padded data and how many of them are sampled a round.
    Federations that pass the same ``train`` object share its rows (one partition, stored once)."""

    train: ClientData
    test: ClientData
    val: ClientData | None
    clients_per_round: int

    @property
    def num_clients(self) -> int:
        return int(self.train.n.shape[0])


class CannotPool(UserError):
    """These federations cannot be rows of one program with exactly their lone runs' numbers (`refusal`)."""


def refusal(method: Method, federations: list[Federation], config: engine_lib.EngineConfig) -> str | None:
    """Why these federations cannot be rows of one program with exactly their lone runs' numbers; None: they can."""
    if method.schedule.server_steps_per_client:
        return (f"method {method.name!r} steps its server after each client, so its federations cannot be rows of "
                "one program; run them one by one")
    if len({f.val is None for f in federations}) > 1:
        return "some federations hold validation data and others not; give all or none partition.val_fraction"
    shapes = {f.num_clients: jax.eval_shape(lambda k, n=f.num_clients: method.init(k, n)[0], jax.random.key(0))
              for f in federations}
    if len({jax.tree.structure(s) for s in shapes.values()}) > 1 or len(
            {tuple(a.shape for a in jax.tree.leaves(s)) for s in shapes.values()}) > 1:
        return (f"method {method.name!r} keeps server state sized by the number of clients; federations of "
                f"{', '.join(map(str, sorted(shapes)))} clients cannot be rows of one program: run them one by one")
    s = method.setup
    if s.augment is not None and len({local_training.steps_per_epoch(int(f.train.y.shape[1]), s.batch_size)
                                      for f in federations}) > 1:
        return ("train.augment draws each step's key by the padded client length, which differs between these "
                "federations' largest clients; run them one by one (or without augmentation)")
    if any(f.clients_per_round > f.num_clients or f.clients_per_round < 1 for f in federations):
        return "a federation samples more clients a round than it has"
    return None


def _padded(data: ClientData, n_max: int) -> ClientData:
    """``data`` with its rows padded to ``n_max`` samples a client (zeros; ``n`` unchanged)."""
    more = n_max - data.y.shape[1]
    pad = lambda a: jnp.pad(a, [(0, 0), (0, more)] + [(0, 0)] * (a.ndim - 2))  # noqa: E731
    return ClientData(pad(jnp.asarray(data.x)), pad(jnp.asarray(data.y)), jnp.asarray(data.n))


def _stacked(parts: list[ClientData]) -> ClientData:
    """The clients of ``parts`` as one ClientData, padded to the largest client."""
    n_max = max(int(p.y.shape[1]) for p in parts)
    padded = [_padded(p, n_max) for p in parts]
    return ClientData(*(jnp.concatenate(a) for a in zip(*padded)))


def default_mapping(backend: str | None = None) -> str:
    """'auto' for a pool: ``map`` on a CPU (as a lone run), else ``packed`` (the rows share the lanes)."""
    return "map" if (backend or jax.default_backend()) == "cpu" else client_mapping.PACKED


class FederationRows:
    """F federations of ``method`` as rows of one program (module docstring). Build once; call `init`, then
    `run_rounds`. ``config``: the shared round settings (its ``clients_per_round`` is each federation's own)."""

    mesh = None  # one device: the rows are not split over a mesh

    def __init__(self, method: Method, federations: list[Federation], config: engine_lib.EngineConfig):
        if not federations:
            raise ValueError("a pool needs at least one federation")
        why = refusal(method, federations, config)
        if why:
            raise CannotPool(why)
        self.method, self.config, self.federations = method, config, list(federations)
        self.progress = round_progress.Progress()  # (its rounds report none)
        self.sizes = [f.num_clients for f in federations]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int32)
        self.num_rows = int(sum(self.sizes))
        blocks = list({id(f.train): f for f in federations}.values())  # distinct partitions, in first-use order
        block_of = [next(i for i, b in enumerate(blocks) if b.train is f.train) for f in federations]
        block_start = np.concatenate([[0], np.cumsum([b.num_clients for b in blocks])[:-1]])
        self.train = _stacked([b.train for b in blocks])
        self.eval_data = (_stacked([b.test for b in blocks]),
                          None if blocks[0].val is None else _stacked([b.val for b in blocks]))
        # every client of every federation, by its state row: its federation and its data row
        self.row_federation = np.repeat(np.arange(len(federations)), self.sizes).astype(np.int32)
        self.row_data = np.concatenate([block_start[block_of[f]] + np.arange(n) for f, n in enumerate(self.sizes)]
                                       ).astype(np.int32)
        # federations of one (clients, sampled, training) shape: vmapped together
        shapes: dict[tuple, list[int]] = {}
        for f, fed in enumerate(federations):
            training = fed.num_clients if config.all_clients_train else fed.clients_per_round
            shapes.setdefault((fed.num_clients, fed.clients_per_round, training), []).append(f)
        self.groups = [(shape, np.asarray(feds, np.int32)) for shape, feds in shapes.items()]
        auto = config.client_mapping == client_mapping.AUTO
        self.mapping = self._mapping(client_mapping.resolve(default_mapping() if auto else config.client_mapping))
        s = method.setup
        test_sizes = np.asarray(self.eval_data[0].n)[self.row_data]
        self.eval_batch_size = client_mapping.pass_batch_size(test_sizes, self.mapping, config.chunk_size,
                                                              config.largest_eval_batch)
        self.eval_mapping = self._lanes(test_sizes, self.eval_batch_size, 1, self.num_rows, False)
        self.every_client_mapping = self._lanes(np.asarray(self.train.n)[self.row_data], s.batch_size,
                                                s.local_epochs, self.num_rows, s.drop_last)
        self._init = jax.jit(self._init_impl)
        self._rounds = jax.jit(self._rounds_impl, donate_argnums=(0, 1), static_argnums=(5, 6, 7))

    # ------------------------------------------------------------ mappings
    def training_rows(self) -> int:
        """Rows that train a round, all federations together."""
        return sum(len(feds) * shape[2] for shape, feds in self.groups)

    def _mapping(self, mapping: str) -> str:
        """``mapping`` with 'packed' given its width from all federations' clients (`client_mapping.packed_width`);
        a method that cannot pack runs 'chunked'."""
        if not client_mapping.is_packed(mapping):
            return mapping
        if self.method.schedule.cannot_pack:
            return "chunked"
        if mapping != client_mapping.PACKED:
            return mapping
        s = self.method.setup
        steps = local_training.real_steps(np.asarray(self.train.n)[self.row_data], s.batch_size, s.local_epochs,
                                          s.drop_last)
        return f"{mapping}:{client_mapping.packed_width(np.asarray(steps), self.training_rows())}"

    def _lanes(self, n, batch_size: int, epochs: int, rows: int, drop_last: bool) -> str:
        """The mapping of a pass over every client (sizes ``n``): the training one, lanes from these sizes."""
        if not client_mapping.is_packed(self.mapping):
            return self.mapping
        counts = np.asarray(local_training.real_steps(n, batch_size, epochs, drop_last))
        return f"{client_mapping.PACKED}:{client_mapping.packed_width(counts, rows)}"

    # ------------------------------------------------------------ state
    def init(self, keys):
        """Every federation's `Method.init` from its key (``keys`` [F], as a lone run's init key): (servers
        [F, ...], clients [M, ...]: federation f's at rows ``offsets[f]`` onwards)."""
        return self._init(keys)

    def _init_impl(self, keys):
        servers, clients = [None] * len(self.federations), [None] * len(self.federations)
        for (num_clients, _, _), feds in self.groups:
            s, c = jax.vmap(lambda k, n=num_clients: self.method.init(k, n))(keys[feds])
            for j, f in enumerate(feds):
                servers[f], clients[f] = jax.tree.map(lambda a, j=j: a[j], (s, c))
        return (jax.tree.map(lambda *a: jnp.stack(a), *servers),
                jax.tree.map(lambda *a: jnp.concatenate(a), *clients))

    def state(self, servers, clients, f: int):
        """(server, clients) of federation ``f``, as its lone run holds them."""
        rows = slice(int(self.offsets[f]), int(self.offsets[f]) + self.sizes[f])
        return jax.tree.map(lambda a: a[f], servers), jax.tree.map(lambda a: a[rows], clients)

    # ------------------------------------------------------------ one round
    def _per_group(self, fn, per_federation):
        """``fn(group shape, federations [k], values [k, ...])`` for each group, the values gathered from
        ``per_federation`` (leaves [F, ...]); returns [(federations, output [k, ...])]."""
        return [(feds, fn(shape, feds, jax.tree.map(lambda a: a[feds], per_federation))) for shape, feds in self.groups]

    def _by_federation(self, grouped, count: int):
        """Group outputs [(federations, leaves [k, ...])] as one tree of leaves [F, ...] (``count`` = F)."""
        out = None
        for feds, tree in grouped:
            if out is None:
                out = jax.tree.map(lambda a: jnp.zeros((count,) + a.shape[1:], a.dtype), tree)
            out = jax.tree.map(lambda o, a, feds=feds: o.at[feds].set(a), out, tree)
        return out

    def _round_impl(self, servers, clients, round_keys, round_index):
        """One round of every federation (``round_keys`` [F]: each one's round key) -> (servers, clients,
        metrics: per group of federations their round metrics, leaves [k, ...]; the pool's executed and
        sequential steps)."""
        cfg, method = self.config, engine_lib.method_at(self.method, self.config.lr_schedule, {}, round_index)
        n = jnp.asarray(self.train.n)

        def plan(shape, feds, keys):
            num_clients, per_round, _ = shape
            sizes = n[jnp.asarray(self.row_data)[self.offsets[feds][:, None] + np.arange(num_clients)]]
            return jax.vmap(lambda k, nf: engine_lib.round_plan(k, nf, num_clients, per_round, cfg, method.setup))(
                keys, sizes)

        plans = self._per_group(plan, round_keys)  # per group: selected, epochs, uploaded, keys, steps [k, T]
        flat = lambda a: a.reshape((-1,) + a.shape[2:])  # noqa: E731  ([k, T, ...] -> [k * T, ...])
        feds_of_rows = np.concatenate([np.repeat(feds, shape[2]) for shape, feds in self.groups]).astype(np.int32)
        selected = jnp.concatenate([flat(p[0]) for _, p in plans])
        state_rows = selected + jnp.asarray(self.offsets)[feds_of_rows]
        data_rows = jnp.asarray(self.row_data)[state_rows]
        epochs, keys, steps = (jnp.concatenate([flat(p[i]) for _, p in plans]) for i in (1, 3, 4))
        chosen = tree_ops.gather(clients, state_rows)
        if method.schedule.needs_selected_state:
            chosen = self._rows_of_groups(lambda shape, feds, c, p: jax.vmap(method.prepare)(
                jax.tree.map(lambda a: a[feds], servers), c, p[0]), chosen, plans)
        order = jnp.argsort(-steps, stable=True) if client_mapping.sorts_clients(self.mapping) else None
        rows = (chosen, data_rows, jnp.asarray(feds_of_rows), keys, epochs)
        if order is not None:  # each chunk runs to its own largest client
            rows = tree_ops.gather(rows, order)
        client_step = engine_lib.client_step_of(method, round_index)

        def row_step(loops, client, data_row, fed, key_i, epochs_i):
            return client_step(loops, jax.tree.map(lambda a: a[fed], servers), client,
                               tuple(a[data_row] for a in self.train), key_i, epochs_i)

        trained = client_mapping.map_clients(row_step, self.mapping, cfg.chunk_size)(*rows)
        if order is not None:
            trained = tree_ops.gather(trained, jnp.argsort(order))
        chosen, uploads = trained
        started_from = servers

        def server_step(shape, feds, server, chosen_f, uploads_f, plan_f):
            selected_f, _, uploaded_f, _, _ = plan_f
            sizes = n[jnp.asarray(self.row_data)[self.offsets[feds][:, None] + selected_f]].astype(jnp.float32)
            info = ServerRound(round_index, selected_f, sizes, uploaded_f)
            new, chosen_f = jax.vmap(method.server_update, in_axes=(0, 0, 0, ServerRound(None, 0, 0, 0)))(
                server, chosen_f, uploads_f, info)
            diagnostics = jax.vmap(lambda s0, s1, u, i: engine_lib.round_diagnostics(method, s0, s1, u, i),
                                   in_axes=(0, 0, 0, ServerRound(None, 0, 0, 0)))(server, new, uploads_f, info)
            return new, chosen_f, diagnostics

        outputs, start = [], 0
        for (shape, feds), (_, p) in zip(self.groups, plans):
            size = len(feds) * shape[2]
            grouped = lambda a, start=start, size=size, k=len(feds): a[start:start + size].reshape(  # noqa: E731
                (k, -1) + a.shape[1:])
            server = jax.tree.map(lambda a, feds=feds: a[feds], servers)
            outputs.append((feds, server_step(shape, feds, server, jax.tree.map(grouped, chosen),
                                              jax.tree.map(grouped, uploads), p)))
            start += size
        servers = self._by_federation([(feds, out[0]) for feds, out in outputs], len(self.federations))
        chosen = jax.tree.map(lambda *a: jnp.concatenate([flat(x) for x in a]), *[out[1] for _, out in outputs])
        clients = tree_ops.scatter(clients, state_rows, chosen)
        if method.schedule.updates_every_client:
            clients = self._update_every_client(method, servers, clients, round_keys, round_index)
        metrics = []  # per group: each federation's round metrics, leaves [k, ...]
        for (shape, feds), (_, p), (_, out), start in zip(self.groups, plans, outputs, self._group_starts()):
            uploads_g = jax.tree.map(lambda a, s=start, k=len(feds), t=shape[2]: a[s:s + k * t].reshape(
                (k, t) + a.shape[1:]), uploads)
            per_client = jax.vmap(engine_lib.per_client_metrics)(p[0], p[1], p[2], uploads_g)
            diagnostics, client_diagnostics = out[2]
            metrics.append({**per_client, "client_diagnostics": client_diagnostics,
                            "train_loss": jnp.mean(per_client["client_loss"], axis=1),
                            "real_steps": p[4].sum(axis=1), "diagnostics": diagnostics})
        sequential, executed = client_mapping.step_counts(steps if order is None else steps[order], self.mapping,
                                                          cfg.chunk_size)
        return servers, clients, {"groups": metrics, "sequential_steps": sequential, "executed_steps": executed}

    def _group_starts(self) -> list[int]:
        """Where each group's rows start among a round's training rows."""
        sizes = [len(feds) * shape[2] for shape, feds in self.groups]
        return list(np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int))

    def _rows_of_groups(self, fn, rows, plans):
        """``fn(shape, feds, rows [k, T, ...], plan)`` per group over a round's training rows, concatenated."""
        out = []
        for (shape, feds), (_, p), start in zip(self.groups, plans, self._group_starts()):
            size = len(feds) * shape[2]
            part = jax.tree.map(lambda a: a[start:start + size].reshape((len(feds), -1) + a.shape[1:]), rows)
            out.append(jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), fn(shape, feds, part, p)))
        return jax.tree.map(lambda *a: jnp.concatenate(a), *out)

    def _every_row_keys(self, keys_of, per_federation_keys):
        """Keys [M] of every client, ``keys_of(key, N)`` of its federation's key, in state-row order."""
        out = [None] * len(self.federations)
        for (num_clients, _, _), feds in self.groups:
            split = jax.vmap(lambda k, n=num_clients: keys_of(k, n))(per_federation_keys[feds])
            for j, f in enumerate(feds):
                out[f] = split[j]
        return jnp.concatenate(out)

    def _update_every_client(self, method, servers, clients, round_keys, round_index):
        """`Method.update_every_client` on every client with its federation's new server state and the keys of
        `engine.every_client_keys`."""
        keys = self._every_row_keys(engine_lib.every_client_keys, round_keys)

        def one_client(loops, client, fed, data_row, key_i):
            return method.with_loops(loops).update_every_client(
                jax.tree.map(lambda a: a[fed], servers), client, ClientData(*(a[data_row] for a in self.train)),
                key_i, round_index)

        mapped = client_mapping.map_clients(one_client, self.every_client_mapping, self.config.chunk_size)
        return mapped(clients, jnp.asarray(self.row_federation), jnp.asarray(self.row_data), keys)

    # ------------------------------------------------------------ evaluation
    def _evaluate_impl(self, servers, clients, eval_keys, round_index):
        """Per-client metrics [M] of every federation's clients (their test data, and validation data as
        'val_*' when the federations have it), each federation's clients keyed as its lone run's."""
        method = engine_lib.method_at(self.method, self.config.lr_schedule, {}, round_index)
        keys = self._every_row_keys(lambda k, n: jax.random.split(k, n), eval_keys)
        one_client = engine_lib.client_evaluation(method, self.eval_batch_size)

        def row(loops, test, client, fed, data_row, key_i):
            return one_client(loops, jax.tree.map(lambda a: a[fed], servers), client,
                              tuple(a[data_row] for a in self.train), tuple(a[data_row] for a in test), key_i)

        test, val = self.eval_data
        out = {}
        for prefix, data in (("", test), ("val_", val)):
            if data is None:
                continue
            mapped = client_mapping.map_clients(lambda loops, *a, data=data: row(loops, data, *a), self.eval_mapping,
                                                self.config.chunk_size)
            found = mapped(clients, jnp.asarray(self.row_federation), jnp.asarray(self.row_data), keys)
            out.update({prefix + k: v for k, v in found.items()})
        return out

    # ------------------------------------------------------------ fused rounds
    def run_rounds(self, servers, clients, keys, first: int, count: int, total_rounds: int, eval_every: int,
                   stop: int | None = None):
        """Rounds ``first .. min(first+count, stop, total_rounds)-1`` of every federation in ONE compiled call
        (``keys`` [F]: each one's run key, as a lone run's). Returns (servers, clients, [metrics per federation],
        [evaluations per federation]), each federation's as `Engine.run_rounds` gives a lone run's; the
        metrics' ``executed_steps`` and ``sequential_steps`` count the whole pool's rows. Donates ``servers``
        and ``clients``."""
        stop = total_rounds if stop is None else min(stop, total_rounds)
        servers, clients, metrics, evals = self._rounds(servers, clients, keys, jnp.int32(first), jnp.int32(stop),
                                                        count, total_rounds, eval_every)
        metrics, evals = jax.device_get((metrics, evals))
        pool = {k: v for k, v in metrics.items() if k != "groups"}
        per_metrics = [None] * len(self.federations)
        for (_, feds), group in zip(self.groups, metrics["groups"]):
            for j, f in enumerate(feds):
                per_metrics[f] = {**jax.tree.map(lambda a, j=j: a[:, j], group), **pool}
        per_evals = []
        for f, m in enumerate(per_metrics):
            rows = slice(int(self.offsets[f]), int(self.offsets[f]) + self.sizes[f])
            e = {"per_client": {k: v[:, rows] for k, v in evals["per_client"].items()}, "done": evals["done"]}
            per_evals.append(engine_lib.evaluations_of(m, e))
        return servers, clients, per_metrics, per_evals

    def _rounds_impl(self, servers, clients, keys, first, stop, count, total_rounds, eval_every):
        both = jax.vmap(engine_lib.round_keys, in_axes=(0, None))
        state_shape = jax.eval_shape(lambda s, c: self._round_impl(s, c, both(keys, first)[0], first), servers,
                                     clients)
        eval_shape = jax.eval_shape(lambda s, c: self._evaluate_impl(s, c, both(keys, first)[1], first), servers,
                                    clients)
        zeros = lambda shapes: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)  # noqa: E731

        def one_round(carry, slot):
            servers, clients = carry
            t = first + slot
            round_keys, eval_keys = both(keys, t)

            def run():
                s, c, m = self._round_impl(servers, clients, round_keys, t)
                done = engine_lib.is_eval_round(t, total_rounds, eval_every)
                per_client = jax.lax.cond(done, lambda: self._evaluate_impl(s, c, eval_keys, t),
                                          lambda: zeros(eval_shape))
                return s, c, m, per_client, done

            def skip():
                return servers, clients, zeros(state_shape[2]), zeros(eval_shape), False

            s, c, m, per_client, done = jax.lax.cond(t < stop, run, skip)
            return (s, c), ({**m, "round": t, "active": t < stop}, {"per_client": per_client,
                                                                     "done": jnp.asarray(done)})

        (servers, clients), (metrics, evals) = jax.lax.scan(one_round, (servers, clients), jnp.arange(count))
        return servers, clients, metrics, evals
