"""The federated round as one jit-compiled call, and evaluation of all clients.

A round: (1) select round(N * join_ratio) clients from the round key; (2)
gather their state and data; (3) let the method prepare them (batched server
-> client step); (4) map the method's single-client update over them (vmap,
lax.map or chunked vmap: client_mapping.py); (5) the method's server step on
the stacked uploads; (6) scatter client state back. Stragglers (fewer local
epochs, dropped uploads) are drawn from the same key. There is no Python loop
over clients. Evaluation maps every client's personalized model over its test
data in one call; the host reads metrics only when it asks for them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl import client_mapping, local_training, losses, sharding, tree_ops
from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.methods.base import ClientRound, Method, ServerRound


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Round mechanics that are not a method's business."""

    clients_per_round: int
    client_mapping: str = "auto"
    chunk_size: int = 8
    straggler_fraction: float = 0.0  # selected clients that train 1..E//2 epochs
    drop_fraction: float = 0.0  # selected clients whose upload is lost
    eval_batch_size: int = 256
    shard: bool = True  # split the client axis over all devices when there are several

    def __post_init__(self):
        client_mapping.resolve(self.client_mapping)
        if self.clients_per_round < 1:
            raise ValueError("clients_per_round must be >= 1")
        for name in ("straggler_fraction", "drop_fraction"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")


def clients_per_round(num_clients: int, join_ratio: float) -> int:
    """round(N * join_ratio), at least 1 (METHODS.md: client sampling)."""
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


def is_eval_round(round_index, total_rounds: int, eval_every: int):
    """Evaluate after round t when (t + 1) % eval_every == 0 and after the last round."""
    return ((round_index + 1) % eval_every == 0) | (round_index == total_rounds - 1)


class Engine:
    """Runs a method over stacked client data. Build once; call `round` or `run_rounds`."""

    def __init__(self, method: Method, train: ClientData, test: ClientData, config: EngineConfig):
        self.method = method
        self.config = config
        self.mapping = client_mapping.resolve(config.client_mapping)
        self.num_clients = int(train.n.shape[0])  # real clients; only these are selected and evaluated
        self.mesh = sharding.client_mesh() if config.shard and jax.device_count() > 1 else None
        self.padded_clients = sharding.padded_count(self.num_clients, self.mesh)  # array rows (empty ones appended)
        # Evaluation visits clients largest test set first so that chunks are even (host-known sizes);
        # on a mesh each device keeps its own block of clients instead (no reordering across devices).
        self.eval_order = np.argsort(-np.asarray(test.n), kind="stable") if client_mapping.sorts_clients(
            self.mapping) and self.mesh is None else None
        if self.mesh is not None:
            train, test = sharding.pad_clients((train, test), self.padded_clients)
            train, test = sharding.shard_clients((train, test), self.mesh)
        self.train = train
        self.test = test
        if config.clients_per_round > self.num_clients:
            raise ValueError("clients_per_round exceeds the number of clients")
        self._round = jax.jit(self._round_impl, donate_argnums=(0, 1))
        self._evaluate = jax.jit(self._evaluate_impl)
        self._rounds = jax.jit(self._rounds_impl, donate_argnums=(0, 1), static_argnums=(7, 8, 9))

    # ------------------------------------------------------------------ round
    def init(self, key):
        server, clients = self.method.init(key, self.num_clients)
        if self.mesh is not None:
            clients = sharding.pad_clients(clients, self.padded_clients)
            server, clients = sharding.replicate(server, self.mesh), sharding.shard_clients(clients, self.mesh)
        return server, clients

    def run(self, server, clients, key, rounds: int, first: int = 0):
        """Rounds ``first .. rounds-1`` one call each, round keys from `round_keys` (as the CLI)."""
        metrics = None
        for t in range(first, rounds):
            server, clients, metrics = self.round(server, clients, round_keys(key, t)[0], t)
        return server, clients, metrics

    def round(self, server, clients, key, round_index: int):
        """One federated round. Donates ``server`` and ``clients``."""
        return self._round(server, clients, self.train, key, jnp.int32(round_index))

    def _round_impl(self, server, clients, train, key, round_index):
        cfg, method = self.config, self.method
        k_sel, k_strag, k_clients = jax.random.split(key, 3)
        selected = select_clients(k_sel, self.num_clients, cfg.clients_per_round)
        epochs, uploaded = straggler_plan(
            k_strag, cfg.clients_per_round, method.setup.local_epochs, cfg.straggler_fraction, cfg.drop_fraction
        )
        keys = jax.random.split(k_clients, cfg.clients_per_round)
        steps = local_training.real_steps(train.n[selected], method.setup.batch_size, epochs)
        if client_mapping.sorts_clients(self.mapping):  # each chunk runs to its own largest client
            order = jnp.argsort(-steps, stable=True)
            selected, epochs, uploaded, keys, steps = (a[order] for a in (selected, epochs, uploaded, keys, steps))
        chosen = tree_ops.gather(clients, selected)
        data = tree_ops.gather(train, selected)
        chosen = method.prepare(server, chosen, selected)

        def one_client(client, data_i, key_i, epochs_i):
            info = ClientRound(round_index, epochs_i)
            return method.client_update(server, client, ClientData(*data_i), key_i, info)

        mapped = self._map_clients(one_client, interleave=True)
        chosen, uploads = mapped(chosen, tuple(data), keys, epochs)
        info = ServerRound(round_index, selected, data.n.astype(jnp.float32), uploaded)
        server, chosen = method.server_update(server, chosen, uploads, info)
        clients = tree_ops.scatter(clients, selected, chosen)
        has_loss = isinstance(uploads, dict) and "loss" in uploads
        client_loss = (jnp.broadcast_to(uploads["loss"], selected.shape) if has_loss
                       else jnp.zeros(selected.shape)).astype(jnp.float32)
        executed = client_mapping.executed_steps(steps, self.mapping, cfg.chunk_size)
        metrics = {
            "selected": selected,
            "epochs": epochs,
            "uploaded": uploaded,
            "train_loss": jnp.mean(client_loss),
            "client_loss": client_loss,
            "real_steps": steps.sum(),
            "executed_steps": executed,
        }
        return server, clients, metrics

    # ------------------------------------------------------------ fused rounds
    def run_rounds(self, server, clients, key, first: int, count: int, total_rounds: int, eval_every: int,
                   stop: int | None = None):
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
        ``server`` and ``clients``.
        """
        server, clients, metrics, evals = self._rounds(
            server, clients, self.train, self.test, key, jnp.int32(first),
            jnp.int32(total_rounds if stop is None else min(stop, total_rounds)), count, total_rounds, eval_every)
        metrics, evals = jax.device_get((metrics, evals))
        evaluations = {
            int(t): {k: np.asarray(v[j]) for k, v in evals["per_client"].items()}
            for j, t in enumerate(metrics["round"]) if evals["done"][j]
        }
        return server, clients, metrics, evaluations

    def _rounds_impl(self, server, clients, train, test, key, first, stop, count, total_rounds, eval_every):
        state_shape = jax.eval_shape(lambda s, c: self._round_impl(s, c, train, key, first), server, clients)
        eval_shape = jax.eval_shape(lambda s, c: self._evaluate_impl(s, c, train, test, key), server, clients)
        zeros = lambda shapes: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)  # noqa: E731

        def evaluate_or_skip(server, clients, t, eval_key):
            return jax.lax.cond(
                is_eval_round(t, total_rounds, eval_every),
                lambda: (self._evaluate_impl(server, clients, train, test, eval_key), True),
                lambda: (zeros(eval_shape), False),
            )

        def one_round(carry, slot):
            server, clients = carry
            t = first + slot
            round_key, eval_key = round_keys(key, t)

            def run():
                s, c, m = self._round_impl(server, clients, train, round_key, t)
                per_client, done = evaluate_or_skip(s, c, t, eval_key)
                return s, c, m, per_client, done

            def skip():
                return server, clients, zeros(state_shape[2]), zeros(eval_shape), False

            s, c, m, per_client, done = jax.lax.cond(t < stop, run, skip)
            out = {**m, "round": t, "active": t < stop}
            return (s, c), (out, {"per_client": per_client, "done": jnp.asarray(done)})

        (server, clients), (metrics, evals) = jax.lax.scan(one_round, (server, clients), jnp.arange(count))
        return server, clients, *sharding.on_every_device((metrics, evals), self.mesh)  # read by every process

    # ------------------------------------------------------------- evaluation
    def evaluate(self, server, clients, key):
        """Per-client test metrics of every client's personalized model (host numpy)."""
        out = self._evaluate(server, clients, self.train, self.test, key)
        return {k: np.asarray(v) for k, v in jax.device_get(out).items()}

    def evaluate_summary(self, server, clients, key) -> dict:
        """`summarize_evaluation` of `evaluate`: mean / weighted / std accuracy and loss."""
        return summarize_evaluation(self.evaluate(server, clients, key))

    def _evaluate_impl(self, server, clients, train, test, key):
        method, cfg = self.method, self.config
        keys = sharding.pad_clients(jax.random.split(key, self.num_clients), self.padded_clients)
        normalize = method.setup.normalize

        def one_client(client, train_i, test_i, key_i):
            variables = method.eval_variables(server, client, ClientData(*train_i), key_i)

            def batch_metrics(batch):
                logits = method.eval_logits(variables, batch.x)
                correct, count = losses.accuracy_counts(logits, batch.y, batch.mask)
                nll = losses.cross_entropy(logits, batch.y, batch.mask) * count
                return correct, count, nll

            correct, count, nll = local_training.sum_batches(
                batch_metrics, ClientData(*test_i), cfg.eval_batch_size, normalize
            )
            return {"correct": correct, "count": count, "loss_sum": nll}

        mapped = self._map_clients(one_client, interleave=False)
        args = (clients, tuple(train), tuple(test), keys)
        if self.eval_order is None:
            out = jax.tree.map(lambda a: a[:self.num_clients], mapped(*args))  # empty clients dropped
            return sharding.on_every_device(out, self.mesh)
        order = jnp.asarray(self.eval_order)
        out = mapped(*tree_ops.gather(args, order))
        return tree_ops.gather(out, jnp.argsort(order))

    def _map_clients(self, fn, interleave: bool):
        """`client_mapping.map_clients`, split over the mesh's devices when there is one."""
        mapped = client_mapping.map_clients(fn, self.mapping, self.config.chunk_size)
        return mapped if self.mesh is None else sharding.split_over_devices(mapped, self.mesh, interleave)


def summarize_evaluation(per_client) -> dict:
    """Unweighted mean, sample-weighted accuracy, std over clients, mean loss."""
    correct, count = per_client["correct"], per_client["count"]
    has = count > 0
    acc = np.where(has, correct / np.maximum(count, 1), 0.0)[has]
    return {
        "accuracy": float(acc.mean()) if acc.size else float("nan"),
        "accuracy_weighted": float(correct.sum() / max(count.sum(), 1)),
        "accuracy_std": float(acc.std()) if acc.size else float("nan"),
        "loss": float(per_client["loss_sum"].sum() / max(count.sum(), 1)),
    }
