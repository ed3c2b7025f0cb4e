"""Many federations of one method as rows of ONE compiled program.

F federations train at once: each has its own clients (a data partition of
its own, or one it shares with others), its own number of clients sampled a
round (the participation P), its own seed (initial state, sampling, batch
order), its own grid values (`Hyperparams`: a leading federation axis on
``values``, each federation's method `engine.method_at` them) and its own
server state, aggregation and metrics; they share the method and the round
settings (epochs, batch size, lr schedule, stragglers, rounds, evaluation).
A sweep's seeds and grid points and a paper table's cells are federations
(runs/sweep.py). A round of the program:

1. each federation draws its round exactly as a lone run (`engine.round_plan`
   on its own round key: selection, stragglers, client keys), vmapped over
   the federations of one (clients, clients per round) shape;
2. the (federation, client) pairs that train are the ROWS of one mapped
   call (engine/client_mapping.py): each row trains one client from its
   federation's server state and values, reading its own data rows where
   they lie. A client that does not train this round is no row: it takes no
   lane time. Under ``packed`` the rows of all federations share the lanes,
   so the program runs about max(largest client, all rows' steps / W) steps
   of W lanes where one federation alone runs its largest client's;
3. each federation's `prepare` and `server_update` run on its own rows
   (vmapped over the federations of one shape), then the rows scatter back;
   a method whose server steps after each client (pFedHN) visits each
   federation's selected clients in turn instead
   (`sequential_clients.scan_clients`), the federations of one shape side
   by side;
4. evaluation and `update_every_client` map over every federation's
   clients, each with its federation's server state, values and keys.

The federations' client state is one [M, ...] array (federation f's clients
at rows offset_f .. offset_f + N_f - 1); their data are the distinct
partitions, padded to one largest client, each stored once. Each federation's
numbers equal its lone `Engine` run with the same keys: exactly for integer
state, to float tolerance otherwise (tests/test_federations.py). Where that
cannot hold the pool refuses in one line (`refusal`): server states whose
shapes differ between the federations, augmentation when the federations' largest clients differ (a
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
from fedjax_pfl.engine import client_mapping, round_progress, sequential_clients
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


FEDERATION_AXIS = ServerRound(None, 0, 0, 0)  # a `ServerRound` vmapped over federations (the round shared)


def _pick(tree, f):
    """Federation ``f``'s part (an index, traced or not) of a tree of leaves [F, ...]."""
    return jax.tree.map(lambda a: a[f], tree)


class CannotPool(UserError):
    """These federations cannot be rows of one program with exactly their lone runs' numbers (`refusal`)."""


def refusal(method: Method, federations: list[Federation], config: engine_lib.EngineConfig) -> str | None:
    """Why these federations cannot be rows of one program with exactly their lone runs' numbers; None: they can."""
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


class FederationRows:
    """F federations of ``method`` as rows of one program (module docstring). Build once; call `init`, then
    `run_rounds`. ``config``: the shared round settings (its ``clients_per_round`` is each federation's own);
    ``stacked``: the federations' (train, test, val) as this class stacks them, to reuse (`with_mapping`)."""

    mesh = None  # one device: the rows are not split over a mesh

    def __init__(self, method: Method, federations: list[Federation], config: engine_lib.EngineConfig,
                 stacked: tuple | None = None):
        if not federations:
            raise ValueError("a pool needs at least one federation")
        why = refusal(method, federations, config)
        if why:
            raise CannotPool(why)
        self.method, self.config, self.federations = method, config, list(federations)
        self.progress = round_progress.Progress()  # where its in-round events go (round_progress.py)
        self.sizes = [f.num_clients for f in federations]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int32)
        self.num_rows = int(sum(self.sizes))
        blocks = list({id(f.train): f for f in federations}.values())  # distinct partitions, in first-use order
        block_of = [next(i for i, b in enumerate(blocks) if b.train is f.train) for f in federations]
        block_start = np.concatenate([[0], np.cumsum([b.num_clients for b in blocks])[:-1]])
        self.client_data = stacked or (_stacked([b.train for b in blocks]), _stacked([b.test for b in blocks]),
                                       None if blocks[0].val is None else _stacked([b.val for b in blocks]))
        self.train, self.eval_data = self.client_data[0], self.client_data[1:]
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
        self.mapping = client_mapping.of(config.client_mapping, config.chunk_size, len(federations)).settled(
            self._row_steps(), self.training_rows())
        test_sizes = np.asarray(self.eval_data[0].n)[self.row_data]
        self.eval_batch_size = client_mapping.pass_batch_size(test_sizes, self.mapping, config.largest_eval_batch)
        self.eval_mapping = self.mapping.for_pass(local_training.real_steps(test_sizes, self.eval_batch_size, 1, False),
                                                  self.num_rows)
        self.every_client_mapping = self.mapping.for_pass(self._row_steps(), self.num_rows)
        self._init = jax.jit(self._init_impl)
        self._rounds = jax.jit(self._scanned, donate_argnums=(0, 1), static_argnums=(8, 9, 10))

    # ------------------------------------------------------------ mappings
    def training_rows(self) -> int:
        """Rows that train a round, all federations together."""
        return sum(len(feds) * shape[2] for shape, feds in self.groups)

    def _row_steps(self):
        """Every row's local steps a round (host numbers)."""
        return np.asarray(engine_lib.training_steps(self.method.setup, np.asarray(self.train.n)[self.row_data]))

    def packed_width(self) -> int:
        """W* of these rows (`client_mapping.packed_width`)."""
        return client_mapping.packed_width(self._row_steps(), self.training_rows())

    def with_mapping(self, mapping: str, chunk_size: int | None = None, train: ClientData | None = None):
        """These federations with their rows mapped by ``mapping`` (chunks of ``chunk_size``, default this
        pool's): the same numbers, other speed and memory; on stacked training data ``train`` (this pool's
        shapes) instead of its own, when given."""
        config = dataclasses.replace(self.config, client_mapping=mapping,
                                     chunk_size=chunk_size or self.config.chunk_size)
        stacked = (self.train if train is None else train, *self.eval_data)
        return FederationRows(self.method, self.federations, config, stacked)

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
        return _pick(servers, f), jax.tree.map(lambda a: a[rows], clients)

    # ------------------------------------------------------------ one round
    def _method_of(self, values, round_index):
        """``method_of(f)``: the method of federation ``f`` (an index, traced or not) in round ``round_index``,
        reading its ``values`` (name -> [F]) (`engine.method_at`)."""
        return lambda f: engine_lib.method_at(self.method, self.config.lr_schedule, _pick(values, f), round_index)

    def _plans(self, n, round_keys):
        """Per group of federations, their round plans (`engine.round_plan` on each one's round key over its
        clients' train sizes, ``n`` by data row): (selected, epochs, uploaded, keys, steps), each [k, T]."""
        def plan(shape, feds):
            num_clients, per_round, _ = shape
            sizes = n[self.row_data[self.offsets[feds][:, None] + np.arange(num_clients)]]
            return jax.vmap(lambda k, nf: engine_lib.round_plan(k, nf, num_clients, per_round, self.config,
                                                                self.method.setup))(round_keys[feds], sizes)

        return [plan(shape, feds) for shape, feds in self.groups]

    def _by_group(self, rows):
        """A round's training rows (leaves [R, ...], groups one after another) as [per group: leaves [k, T, ...]]."""
        parts, start = [], 0
        for shape, feds in self.groups:
            size = len(feds) * shape[2]
            parts.append(jax.tree.map(lambda a, s=start, n=size, k=len(feds): a[s:s + n].reshape((k, -1) + a.shape[1:]),
                                      rows))
            start += size
        return parts

    def _by_federation(self, grouped):
        """Per-group outputs (leaves [k, ...], in `groups` order) as one tree of leaves [F, ...]."""
        out = None
        for (_, feds), tree in zip(self.groups, grouped):
            if out is None:
                out = jax.tree.map(lambda a: jnp.zeros((len(self.federations),) + a.shape[1:], a.dtype), tree)
            out = jax.tree.map(lambda o, a, feds=feds: o.at[feds].set(a), out, tree)
        return out

    def _round_impl(self, servers, clients, train, round_keys, round_index, values, report=False):
        """One round of every federation (``round_keys`` [F]: each one's round key; ``values``: name -> [F]) on
        stacked client data ``train`` -> (servers, clients, metrics: per group of federations their round
        metrics, leaves [k, ...]; the pool's executed and sequential steps). ``report``: in-round progress."""
        method_of = self._method_of(values, round_index)
        progress = self.progress if report else None
        plans = self._plans(train.n, round_keys)
        sizes = [jnp.asarray(train.n)[jnp.asarray(self.row_data)[self.offsets[feds][:, None] + p[0]]]
                 for (_, feds), p in zip(self.groups, plans)]
        infos = [ServerRound(round_index, p[0], n.astype(jnp.float32), p[2]) for p, n in zip(plans, sizes)]
        if self.method.schedule.server_steps_per_client:
            new, clients, uploads = self._visit_clients(servers, clients, train, plans, infos, method_of, progress)
            steps, how = jnp.concatenate([p[4].reshape(-1) for p in plans]), client_mapping.MAP
        else:
            new, clients, uploads, steps = self._train_rows(servers, clients, train, plans, infos, method_of,
                                                             progress)
            how = self.mapping
        if self.method.schedule.updates_every_client:
            clients = self._update_every_client(self._by_federation(new), clients, train, round_keys, method_of,
                                                round_index)
        metrics = []  # per group: each federation's round metrics, leaves [k, ...]
        for (_, feds), p, info, new_f, uploads_f in zip(self.groups, plans, infos, new, uploads):
            diagnostics, client_diagnostics = jax.vmap(
                lambda f, s0, s1, u, i: engine_lib.round_diagnostics(method_of(f), s0, s1, u, i),
                in_axes=(0, 0, 0, 0, FEDERATION_AXIS))(jnp.asarray(feds), _pick(servers, feds), new_f, uploads_f, info)
            per_client = jax.vmap(engine_lib.per_client_metrics)(p[0], p[1], p[2], uploads_f)
            metrics.append({**per_client, "client_diagnostics": client_diagnostics,
                            "train_loss": jnp.mean(per_client["client_loss"], axis=1),
                            "real_steps": p[4].sum(axis=1), "diagnostics": diagnostics})
        sequential, executed = client_mapping.step_counts(steps, how)
        return (self._by_federation(new), clients,
                {"groups": metrics, "sequential_steps": sequential, "executed_steps": executed})

    def _train_rows(self, servers, clients, train, plans, infos, method_of, progress):
        """The round's rows trained in one mapped call, then each federation's server step on its own ->
        ([per group: new servers [k, ...]], clients, [per group: uploads [k, T, ...]], the rows' steps in the
        order they trained)."""
        flat = lambda a: a.reshape((-1,) + a.shape[2:])  # noqa: E731  ([k, T, ...] -> [k * T, ...])
        feds_of_rows = np.concatenate([np.repeat(feds, shape[2]) for shape, feds in self.groups]).astype(np.int32)
        state_rows = jnp.concatenate([flat(p[0]) for p in plans]) + jnp.asarray(self.offsets)[feds_of_rows]
        epochs, keys, steps = (jnp.concatenate([flat(p[i]) for p in plans]) for i in (1, 3, 4))
        chosen = tree_ops.gather(clients, state_rows)
        if self.method.schedule.needs_selected_state:
            chosen = jax.tree.map(lambda *a: jnp.concatenate(a), *[jax.tree.map(flat, jax.vmap(
                lambda f, s, c, sel: method_of(f).prepare(s, c, sel))(jnp.asarray(feds), _pick(servers, feds), c, p[0]))
                for (_, feds), c, p in zip(self.groups, self._by_group(chosen), plans)])
        order = jnp.argsort(-steps, stable=True) if self.mapping.sorts_clients else None
        rows = (chosen, jnp.asarray(self.row_data)[state_rows], jnp.asarray(feds_of_rows), keys, epochs)
        if order is not None:  # each chunk runs to its own largest client
            rows = tree_ops.gather(rows, order)

        def row_step(loops, client, data_row, fed, key_i, epochs_i, server=None):
            step = engine_lib.client_step_of(method_of(fed), infos[0].round, progress)
            server = _pick(servers, fed) if server is None else server
            return step(loops, server, client, tuple(a[data_row] for a in train), key_i, epochs_i)

        if self.mapping.kind == "vmap":  # each federation's rows vmapped with its server state, once per federation
            trained = self._vmap_by_federation(row_step, servers, self._by_group(rows))
        else:
            trained = client_mapping.map_clients(row_step, self.mapping)(*rows)
        if order is not None:
            trained = tree_ops.gather(trained, jnp.argsort(order))
        new, chosen, uploads = [], [], self._by_group(trained[1])
        for (_, feds), c, u, info in zip(self.groups, self._by_group(trained[0]), uploads, infos):
            server, c = jax.vmap(lambda f, s, c, u, i: method_of(f).server_update(s, c, u, i),
                                 in_axes=(0, 0, 0, 0, FEDERATION_AXIS))(jnp.asarray(feds), _pick(servers, feds), c, u,
                                                                        info)
            new.append(server)
            chosen.append(jax.tree.map(flat, c))
        clients = tree_ops.scatter(clients, state_rows, jax.tree.map(lambda *a: jnp.concatenate(a), *chosen))
        return new, clients, uploads, steps if order is None else steps[order]

    def _vmap_by_federation(self, row_fn, servers, parts, order=None):
        """``row_fn(loops, *row, server=...)`` under ``vmap`` on rows given per group of federations (``parts``:
        trees of leaves [k, T, ...], in `groups` order): per group a vmap over its federations of a vmap over each
        one's rows, the federation's server state handed in whole -> leaves [R, ...], the groups' rows one after
        another, or put back in the rows' own order when ``order`` (their positions there) is given. The same
        numbers as one vmap over all rows; no row gathers its own copy of the server state (APPLE's holds every
        client's model: a sweep of two seeds took 1.6x as long with a copy per row)."""
        def federation(server, *own):  # own: the federation's rows, leaves [T, ...]
            step = lambda loops, *row: row_fn(loops, *row, server=server)  # noqa: E731
            return client_mapping.map_clients(step, client_mapping.VMAP)(*own)

        out = [jax.vmap(federation)(_pick(servers, jnp.asarray(feds)), *part)
               for (_, feds), part in zip(self.groups, parts)]
        flat = lambda a: a.reshape((-1,) + a.shape[2:])  # noqa: E731
        out = jax.tree.map(lambda *a: jnp.concatenate([flat(x) for x in a]), *out)
        return out if order is None else tree_ops.gather(out, jnp.asarray(np.argsort(order)))

    def _every_row_by_federation(self, row_fn, servers, rows):
        """`_vmap_by_federation` on every client's row (``rows``: leaves [M, ...] in state-row order, as evaluation
        and `update_every_client` visit them) -> leaves [M, ...] in that order."""
        where = [self.offsets[feds][:, None] + np.arange(shape[0]) for shape, feds in self.groups]  # [k, N] each
        return self._vmap_by_federation(row_fn, servers, [tree_ops.gather(rows, jnp.asarray(w)) for w in where],
                                        np.concatenate([w.reshape(-1) for w in where]))

    def _visit_clients(self, servers, clients, train, plans, infos, method_of, progress):
        """The round of a method whose server steps after each client: each federation's selected clients one
        after another (`sequential_clients.scan_clients`), the federations of a group side by side -> ([per
        group: new servers [k, ...]], clients, [per group: uploads [k, T, ...]])."""
        new, uploads = [], []
        for ((num_clients, _, _), feds), p, info in zip(self.groups, plans, infos):
            rows = self.offsets[feds][:, None] + np.arange(num_clients)  # [k, N]: each federation's state rows

            def visit(f, server, own, data_rows, info, keys, epochs):
                method = method_of(f)
                return sequential_clients.scan_clients(method, engine_lib.client_step_of(method, info.round, progress),
                                                       server, own, train, info, keys, epochs, data_rows)

            server, own, up = jax.vmap(visit, in_axes=(0, 0, 0, 0, FEDERATION_AXIS, 0, 0))(
                jnp.asarray(feds), _pick(servers, feds), tree_ops.gather(clients, rows),
                jnp.asarray(self.row_data[rows]), info, p[3], p[1])
            clients = tree_ops.scatter(clients, rows.reshape(-1), jax.tree.map(lambda a: a.reshape(
                (-1,) + a.shape[2:]), own))
            new.append(server)
            uploads.append(up)
        return new, clients, uploads

    def _every_row_keys(self, keys_of, per_federation_keys):
        """Keys [M] of every client, ``keys_of(key, N)`` of its federation's key, in state-row order."""
        out = [None] * len(self.federations)
        for (num_clients, _, _), feds in self.groups:
            split = jax.vmap(lambda k, n=num_clients: keys_of(k, n))(per_federation_keys[feds])
            for j, f in enumerate(feds):
                out[f] = split[j]
        return jnp.concatenate(out)

    def _update_every_client(self, servers, clients, train, round_keys, method_of, round_index):
        """`Method.update_every_client` on every client with its federation's new server state and the keys of
        `engine.every_client_keys`."""
        keys = self._every_row_keys(engine_lib.every_client_keys, round_keys)

        def one_client(loops, client, fed, data_row, key_i, server=None):
            return method_of(fed).with_loops(loops).update_every_client(
                _pick(servers, fed) if server is None else server, client, ClientData(*(a[data_row] for a in train)),
                key_i, round_index)

        rows = (clients, jnp.asarray(self.row_federation), jnp.asarray(self.row_data), keys)
        if self.every_client_mapping.kind == "vmap":  # as training: each federation's server state once
            return self._every_row_by_federation(one_client, servers, rows)
        return client_mapping.map_clients(one_client, self.every_client_mapping)(*rows)

    # ------------------------------------------------------------ evaluation
    def _evaluate_impl(self, servers, clients, train, eval_data, eval_keys, round_index, values):
        """Per-client metrics [M] of every federation's clients (their test data, and validation data as
        'val_*' when the federations have it), each federation's clients keyed as its lone run's."""
        method_of = self._method_of(values, round_index)
        keys = self._every_row_keys(lambda k, n: jax.random.split(k, n), eval_keys)

        def row(loops, test, client, fed, data_row, key_i, server=None):
            one_client = engine_lib.client_evaluation(method_of(fed), self.eval_batch_size)
            return one_client(loops, _pick(servers, fed) if server is None else server, client,
                              tuple(a[data_row] for a in train), tuple(a[data_row] for a in test), key_i)

        rows = (clients, jnp.asarray(self.row_federation), jnp.asarray(self.row_data), keys)
        out = {}
        for prefix, data in zip(("", "val_"), eval_data):
            if data is None:
                continue
            fn = lambda loops, *a, data=data, **k: row(loops, data, *a, **k)  # noqa: E731
            if self.eval_mapping.kind == "vmap":  # as training: each federation's server state once
                found = self._every_row_by_federation(fn, servers, rows)
            else:
                found = client_mapping.map_clients(fn, self.eval_mapping)(*rows)
            out.update({prefix + k: v for k, v in found.items()})
        return out

    # ------------------------------------------------------------ fused rounds
    def run_rounds(self, servers, clients, keys, first: int, count: int, total_rounds: int, eval_every: int,
                   stop: int | None = None, values: dict | None = None):
        """Rounds ``first .. min(first+count, stop, total_rounds)-1`` of every federation in ONE compiled call
        (``keys`` [F]: each one's run key, as a lone run's; ``values``: name -> [F], each federation's grid
        values). Returns (servers, clients, [metrics per federation], [evaluations per federation]), each
        federation's as `Engine.run_rounds` gives a lone run's; the metrics' ``executed_steps`` and
        ``sequential_steps`` count the whole pool's rows. Donates ``servers`` and ``clients``."""
        stop = total_rounds if stop is None else min(stop, total_rounds)
        try:
            servers, clients, metrics, evals = self._rounds(servers, clients, self.train, self.eval_data, keys,
                                                            jnp.int32(first), jnp.int32(stop), values or {}, count,
                                                            total_rounds, eval_every)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError) as e:
            raise UserError(f"method {self.method.name!r} chooses code by {', '.join(values or {})} in Python; "
                            "run those values one by one instead of as a list") from e
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

    def _scanned(self, servers, clients, train, eval_data, keys, first, stop, values, count, total_rounds,
                 eval_every):
        report = self.config.progress and count == 1  # fused calls are short anyway
        return engine_lib.scan_rounds(
            lambda s, c, k, t: self._round_impl(s, c, train, k, t, values, report),
            lambda s, c, k, t: self._evaluate_impl(s, c, train, eval_data, k, t, values),
            jax.vmap(engine_lib.round_keys, in_axes=(0, None)), servers, clients, keys, first, stop, count,
            total_rounds, eval_every)

    def compiled_round(self, servers, clients, round_keys, round_index: int = 0, values: dict | None = None):
        """Every federation's round ``round_index`` (``round_keys`` [F]) as `engine.compile_round` compiles it."""
        return engine_lib.compile_round(self._round_impl, servers, clients, self.train, round_keys, round_index,
                                        values)

    def round_padding(self, round_keys, round_index: int = 0) -> dict:
        """Round ``round_index`` (``round_keys`` [F]) of every row in client-steps, as its metrics will count
        them, without training (`engine.padding_record`; under ``map`` only the efficiency, 1)."""
        if self.method.schedule.server_steps_per_client or self.mapping.kind == "map":
            return {"round": int(round_index) + 1, "padding_efficiency": 1.0}
        steps = jax.jit(lambda n, k: jnp.concatenate([p[4].reshape(-1) for p in self._plans(n, k)]))(
            jnp.asarray(self.train.n), round_keys)
        if self.mapping.sorts_clients:
            steps = steps[jnp.argsort(-steps, stable=True)]
        return engine_lib.padding_record(steps, self.mapping, 1, round_index)
