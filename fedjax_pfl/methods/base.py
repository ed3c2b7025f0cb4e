"""The method contract: pure functions for ONE client plus batched server steps.

A method never loops over clients and never places data on devices; the engine
(engine.py) samples clients, gathers their state, maps `client_update` over
them (vmap, lax.map or chunked) and scatters the result back.

State shapes: ``server`` is any pytree; ``clients`` is a pytree whose leaves
carry a leading client axis [N, ...] (gathered to [S, ...] for the selected
clients). ``data`` is one client's ``(x [n_max, ...], y [n_max], n)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import local_training
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.models.networks import Model


@dataclasses.dataclass(frozen=True, eq=False)
class LocalSetup:
    """What every client needs to train: model, optimizer, batch size, epochs.

    ``normalize`` maps a stored batch (uint8 images or float features) to the
    model's float32 input. The optimizer state is fresh at every local phase
    unless ``persistent_optimizer`` (see `Method.train_kept`).
    """

    model: Model
    optimizer: optax.GradientTransformation
    batch_size: int
    local_epochs: int
    normalize: Callable[[jax.Array], jax.Array]
    make_optimizer: Callable[..., optax.GradientTransformation] | None = None
    share_batch_stats: bool = True  # BatchNorm statistics travel with a shared body
    learning_rate: float | None = None  # train.lr, for methods that take SGD steps by hand (pFedKD, pFedMe, ...)
    initial_learning_rate: float | None = None  # train.lr before the lr schedule; None: learning_rate
    eval_model: str | None = None  # eval.model: one of the method's `eval_models`; None: its default
    drop_last: bool = False  # train.drop_last: each epoch's partial batch is dropped (local_training)
    persistent_optimizer: bool = False  # train.persistent_optimizer: clients keep their optimizer state
    beyond_plain_sgd: tuple[str, ...] = ()  # the train settings that make `optimizer` more than SGD of learning_rate
    augment: Callable | None = None  # train.augment: (key, stored batch) -> batch, before normalize (augmentation.py)


class ClientRound(NamedTuple):
    """Per-client facts of this round, computed by the engine."""

    round: jax.Array  # int32 scalar, 0-based round index
    epochs: jax.Array  # int32 scalar, local epochs for this client (stragglers: fewer)


class ServerRound(NamedTuple):
    """Facts of this round for the server step; all [S] over the selected clients."""

    round: jax.Array
    selected: jax.Array  # int32 client indices
    num_samples: jax.Array  # float32 n_i (train size)
    uploaded: jax.Array  # bool; False for dropped uploads

    @property
    def sample_weights(self):
        """n_i for clients whose upload arrived, else 0 (FedAvg's weights)."""
        return jnp.where(self.uploaded, self.num_samples, 0.0)


class Method:
    """Base class; subclasses set ``name`` and override what they need.

    Defaults: no server->client preparation, identity server step, and
    evaluation with the client's own variables (``client['variables']``).

    ``eval_models`` names the evaluation protocols a method offers (the run
    setting ``eval.model``); the first is its default, the one its authors use.
    """

    name: str = ""
    hparams_type: type | None = None  # a dataclass of method-specific options
    eval_models: tuple[str, ...] = ("local",)  # 'local': each client's own model after its last training
    needs_body_head_split: bool = False  # shares a body: a model without body parameters cannot work
    keeps_optimizer_state: bool = False  # supports setup.persistent_optimizer (`train_kept`, `with_optimizer_state`)
    # Its server step uses only uploads with ``info.uploaded`` (as drop_fraction needs), so the engine's
    # train.all_clients_train may let every client train; a method whose server step does not sets False.
    aggregates_uploaded_only: bool = True
    # Its `prepare` or `server_update` reads or changes the stacked state of the round's selected clients
    # (DiversiFed's mixing, FedPAC's heads): the engine then gathers all S of them at once. Otherwise, under
    # client_mapping 'chunked', the engine gathers, trains and scatters them chunk by chunk: `prepare` is not
    # called and `server_update` gets ``clients=None`` (and must return it).
    needs_selected_state: bool = False
    # After each round's server step the engine maps `update_every_client` over ALL N clients, selected or
    # not (FedALA's adaptive local aggregation, which its authors run on every client every round).
    updates_every_client: bool = False
    # Its server steps after each selected client, as pFedHN's authors do: the engine then visits the
    # round's clients one after another (engine/sequential_clients.py), each trained from the server state
    # the previous one's `server_update` left, that step given a round of one client.
    server_steps_per_client: bool = False
    # Why the engine's ``packed`` client mapping (engine/packed_loops.py) cannot run this method's client
    # update, in a few words; empty: it can (the engine then runs 'chunked' instead, and says so).
    cannot_pack: str = ""

    def __init__(self, setup: LocalSetup, hparams: Any = None):
        self.refuse_persistent_optimizer(setup.persistent_optimizer)
        self.setup = setup
        if hparams is None and self.hparams_type is not None:
            hparams = self.hparams_type()
        self.hparams = hparams

    @classmethod
    def refuse_persistent_optimizer(cls, persistent: bool) -> None:
        """UserError if ``persistent`` (train.persistent_optimizer) and this method cannot keep its state."""
        if persistent and not cls.keeps_optimizer_state:
            raise UserError(f"method {cls.name!r} does not support train.persistent_optimizer; leave it false")

    # ---- state -------------------------------------------------------------
    def init(self, key, num_clients: int):
        """-> (server, clients) with clients' leaves stacked [N, ...]."""
        raise NotImplementedError

    def prepare(self, server, clients, selected):
        """Batched server->client step before local training (e.g. DiversiFed's u_i);
        a method that overrides it sets ``needs_selected_state``."""
        return clients

    def client_update(self, server, client, data, key, info: ClientRound):
        """-> (client, upload) for one client."""
        raise NotImplementedError

    def server_update(self, server, clients, uploads, info: ServerRound):
        """-> (server, clients) from stacked uploads of the selected clients (``clients``
        may be None, to return as is: see ``needs_selected_state``)."""
        return server, clients

    def round_diagnostics(self, server, new_server, uploads, info: ServerRound) -> dict:
        """Numbers about this round, {name: value}: a scalar, or [S], one value per selected client in the
        order of ``info.selected``. The engine adds them to the round metrics (``metrics['diagnostics']``;
        per client ``metrics['client_diagnostics']``), metrics.jsonl records them with each evaluation (per
        client as {client id: value}) and the run's figures draw the scalars (plots/diagnostics.png). ``server``: the state the round started from; ``new_server``:
        after `server_update`; ``uploads``: the round's stacked uploads [S, ...], where a method may put
        per-client values for this step (``upload['collaboration']``, averaged by
        `kernels.collaboration.client_means`). A method that weights other clients' models reports its
        collaboration here (kernels/collaboration.py; docs/methods/conventions.md). Default: none."""
        return {}

    def update_every_client(self, server, client, data, key, round_index):
        """-> client: one client's step from the new server state, which the engine runs on every client
        after the server step and before evaluation (only when ``updates_every_client``)."""
        return client

    def eval_variables(self, server, client, data, key):
        """The personalized model variables of one client, for evaluation (``eval_model``)."""
        return client["variables"]

    def eval_logits(self, variables, x):
        """Logits of the personalized model on a normalised batch ``x`` (inference mode).

        ``variables`` is what `eval_variables` returned; a method whose
        prediction is not one model's output (APFL's output mixture, FedProto's
        nearest prototype) overrides this and returns what it needs from there.
        """
        return self.model.apply(variables, x, train=False).logits

    # ---- helpers shared by methods ----------------------------------------
    @property
    def model(self) -> Model:
        return self.setup.model

    @property
    def eval_model(self) -> str:
        """The evaluation protocol in use (``setup.eval_model`` or this method's default)."""
        return self.setup.eval_model or self.eval_models[0]

    def init_variables(self, key):
        return self.model.init(key)

    def train(self, objective, variables, data, key, epochs, *, part="all", optimizer=None, max_epochs=None):
        """Masked local SGD (local_training.train) with this method's setup."""
        s = self.setup
        return local_training.train(
            objective,
            optimizer or s.optimizer,
            variables,
            data,
            key,
            batch_size=s.batch_size,
            max_epochs=max_epochs or s.local_epochs,
            epochs=epochs,
            normalize=s.normalize,
            part=part,
            drop_last=s.drop_last,
            augment=s.augment,
        )

    def train_kept(self, objective, client, variables, data, key, epochs, state="opt_state", *, part="all",
                   optimizer=None, max_epochs=None):
        """`train` of ``part`` from the client's kept optimizer state -> (variables, loss, kept).

        With ``setup.persistent_optimizer`` the optimizer state (e.g. SGD
        momentum) starts from ``client[state]`` and ``kept`` is
        ``{state: final state}``, to store in the client's state; as in
        PFLlib (PFAKD's authors' code), where each client keeps its optimizer
        objects across its participations, also for parameters it receives
        from the server. A method that trains its parts in phases keeps one
        state per phase (FedRep's and FedPAC's head and body; PFLlib's
        optimizers skip the parameters a phase freezes, so their momentum
        waits for the next phase of the same part). Otherwise the state
        starts fresh and ``kept`` is ``{}`` (client state unchanged).
        """
        if not self.setup.persistent_optimizer:
            variables, loss = self.train(objective, variables, data, key, epochs, part=part, optimizer=optimizer,
                                         max_epochs=max_epochs)
            return variables, loss, {}
        s = self.setup
        variables, loss, opt_state = local_training.train_with_state(
            objective, optimizer or s.optimizer, variables, data, key, batch_size=s.batch_size,
            max_epochs=max_epochs or s.local_epochs, epochs=epochs, normalize=s.normalize, part=part,
            drop_last=s.drop_last, opt_state=client[state], augment=s.augment)
        return variables, loss, {state: opt_state}

    def with_optimizer_state(self, clients, variables, num_clients: int, state="opt_state", *, part="all",
                             optimizer=None):
        """``clients`` plus a fresh optimizer state ``state`` of ``part`` of ``variables`` per client
        (persistent_optimizer only; ``optimizer``: the one `train_kept` will use, default the run's)."""
        if not self.setup.persistent_optimizer:
            return clients
        fresh = (optimizer or self.setup.optimizer).init(tree_ops.trainable_of(variables, part))
        return {**clients, state: tree_ops.broadcast(fresh, num_clients)}

    def supervised_objective(self, extra: Callable | None = None):
        """CE on the model output, plus ``extra(variables, batch, output, key)`` if given."""

        def objective(variables, batch, key):
            out = self.model.apply(variables, batch.x, train=True, mask=batch.mask)
            loss = losses.cross_entropy(out.logits, batch.y, batch.mask)
            if extra is not None:
                loss = loss + extra(variables, batch, out, key)
            return loss, out.batch_stats

        return objective

    def map_batches(self, fn, data):
        """``fn(batch)`` per batch slot, stacked (padding-only slots included): for inspection."""
        return local_training.map_batches(fn, data, self.setup.batch_size, self.setup.normalize)

    def sum_batches(self, fn, data):
        """Sum of ``fn(batch)`` over the client's real batches (local_training.sum_batches)."""
        return local_training.sum_batches(fn, data, self.setup.batch_size, self.setup.normalize)


def shared_init(method: Method, key, num_clients: int):
    """Every client starts from the same initial variables (docs/methods/conventions.md)."""
    variables = method.init_variables(key)
    return variables, tree_ops.broadcast(variables, num_clients)
