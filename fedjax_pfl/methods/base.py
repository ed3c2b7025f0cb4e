"""The method contract: an algorithm is a few pure functions for ONE client plus batched server steps.

A method's file declares one `Algorithm`: its name, `Paper`, options
dataclass, evaluation protocols, the `Schedule` the engine must follow, and its
functions, each taking the bound method ``m`` first (``m.setup``: model,
optimizer, batch size, epochs; ``m.hparams``: its options; ``m.static``: what
``static`` derived from them once):

    init(m, key, N)                                -> server, clients      (every client leaf [N, ...])
    client_update(m, server, client, data, key, info: ClientRound)
                                                   -> client, upload       (one client)
    server_update(m, server, clients, uploads, info: ServerRound)
                                                   -> server, clients      (uploads stacked [S, ...])
    prepare(m, server, clients, selected)          -> clients              (before local training, batched)
    update_every_client(m, server, client, data, key, round)
                                                   -> client               (all N clients, after the server step)
    eval_variables(m, server, client, data, key)   -> what eval_logits reads
    eval_logits(m, variables, x)                   -> logits of the personalized model
    round_diagnostics(m, server, new_server, uploads, info)
                                                   -> {name: scalar or [S]} (metrics.jsonl)
    static(m)                                      -> values derived once from setup and options (checked there)

``init`` and ``client_update`` are required; by default the server step and
``prepare`` change nothing, nobody is updated after the server step, and each
client is evaluated with its own ``client['variables']`` through the model. The
steps methods share are plain functions called by name from small modules:
training.py (local SGD with the run's setup), shared_body.py (receive, upload
and average a shared part), step_counted.py, anchored.py, finetune.py; never
hooks or base classes.

Calling an algorithm with a setup and options binds it:
``get_method('fedas')(setup, options)`` is a `Method`, which the engine runs
(``method.client_update(server, client, data, key, info)``, ...) and whose
``schedule`` it reads. A method never loops over clients and never places data
on devices: the engine samples clients, gathers their state, maps
``client_update`` over them (vmap, lax.map, chunked or packed lanes) and
scatters the result back. ``data`` is one client's ``(x [n_max, ...], y
[n_max], n)``.
"""

from __future__ import annotations

import dataclasses
import sys
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
    unless ``persistent_optimizer`` (see `training.train_kept`).
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


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the engine must run a method's round: the only facts about a method the engine reads."""

    # Its `prepare` or `server_update` reads or changes the stacked state of the round's selected clients
    # (DiversiFed's anchors, FedPAC's heads): the engine gathers all S of them at once. Otherwise, under
    # client_mapping 'chunked', it gathers, trains and scatters them chunk by chunk: `prepare` is not called
    # and `server_update` gets ``clients=None`` (and must return it).
    needs_selected_state: bool = False
    # After each round's server step the engine maps `update_every_client` over ALL N clients, selected or not
    # (FedALA's adaptive local aggregation, which its authors run on every client every round).
    updates_every_client: bool = False
    # Its server steps after each selected client (pFedHN's authors): the engine visits the round's clients one
    # after another (engine/sequential_clients.py), each trained from the server state the previous one's
    # `server_update` left, that step given a round of one client.
    server_steps_per_client: bool = False
    # Its server step uses only uploads with ``info.uploaded`` (as drop_fraction needs), so
    # train.all_clients_train may let every client train; a server step that does not: False.
    aggregates_uploaded_only: bool = True
    # Why the ``packed`` client mapping (engine/packed_loops.py) cannot run its client update, in a few words;
    # empty: it can (otherwise the engine runs 'chunked' instead, and says so).
    cannot_pack: str = ""


@dataclasses.dataclass(frozen=True)
class Paper:
    """The publication a method implements, for its documentation page and the README's methods table."""

    name: str  # the method's display name
    authors: str = ""
    title: str = ""  # empty: no paper of its own (a baseline); ``note`` says what it is
    venue: str = ""
    year: int | None = None
    url: str = ""
    code: str = ""  # the authors' repository on GitHub (owner/name), where the method follows it
    note: str = ""  # how this method relates to the paper

    @property
    def where(self) -> str:
        """Venue and year, or 'baseline' for a method without a paper."""
        return f"{self.venue} {self.year or ''}".strip() if self.title else "baseline"


# ---- what a method without its own step does ----------------------------------------------


def no_preparation(m, server, clients, selected):
    """`prepare` that leaves the selected clients' state as it is."""
    return clients


def keep_server(m, server, clients, uploads, info):
    """`server_update` that keeps the server state (a method without communication)."""
    return server, clients


def keep_client(m, server, client, data, key, round_index):
    """`update_every_client` that leaves the client as it is."""
    return client


def own_variables(m, server, client, data, key):
    """`eval_variables`: the client's own ``client['variables']``."""
    return client["variables"]


def model_logits(m, variables, x):
    """`eval_logits`: the model's logits in inference mode on a normalised batch ``x``."""
    return m.model.apply(variables, x, train=False).logits


def no_diagnostics(m, server, new_server, uploads, info) -> dict:
    """`round_diagnostics` that reports nothing."""
    return {}


def _declaring_module() -> str:
    """The module whose top level runs the `Algorithm(...)` being made (past the dataclass machinery)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, "dataclasses"):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class Algorithm:
    """One method, declared once in its own file: everything the engine, the command line and the docs read.

    ``round_diagnostics`` reports numbers about a round, {name: value}: a scalar,
    or [S], one value per selected client in the order of ``info.selected``.
    ``server`` is the state the round started from, ``new_server`` the one after
    `server_update`; ``uploads`` may carry per-client values for it
    (``upload['collaboration']``, averaged by `kernels.collaboration.client_means`).
    A method that weights other clients' models reports its collaboration there
    (kernels/collaboration.py; docs/methods/conventions.md).
    """

    name: str  # --method NAME
    paper: Paper
    init: Callable
    client_update: Callable
    server_update: Callable = keep_server
    hparams_type: type | None = None  # its options: a frozen dataclass of `options.option` fields
    eval_models: tuple[str, ...] = ("local",)  # eval.model protocols; the first is its default, its authors'
    # The engine's schedule, or a function of the options giving it (pFedHN's aggregate='sequential').
    schedule: Schedule | Callable[[Any], Schedule] = Schedule()
    prepare: Callable = no_preparation
    update_every_client: Callable = keep_client
    eval_variables: Callable = own_variables
    eval_logits: Callable = model_logits
    round_diagnostics: Callable = no_diagnostics
    static: Callable | None = None
    keeps_optimizer_state: bool = False  # supports train.persistent_optimizer (`training.train_kept`)
    needs_body_head_split: bool = False  # shares a body: a model without body parameters cannot work
    own_sgd: bool = False  # its update rule is its own plain SGD of train.lr: other optimizer settings are refused
    module: str = ""  # the module that declares it (filled in when made)

    def __post_init__(self):
        if not self.module:
            object.__setattr__(self, "module", _declaring_module())

    def __repr__(self) -> str:
        return f"Algorithm({self.name!r}, {self.module})"

    def __call__(self, setup: LocalSetup, hparams: Any = None) -> "Method":
        """This algorithm bound to ``setup`` and ``hparams`` (None: the default options)."""
        return Method(self, setup, hparams)

    def refuse_unsupported(self, persistent_optimizer: bool, beyond_plain_sgd: tuple[str, ...] = ()) -> None:
        """UserError for run settings this method would ignore: train.persistent_optimizer where it keeps no
        optimizer state, an optimizer beyond plain SGD (``beyond_plain_sgd``) where it takes its own."""
        if persistent_optimizer and not self.keeps_optimizer_state:
            raise UserError(f"method {self.name!r} does not support train.persistent_optimizer; leave it false")
        if self.own_sgd and beyond_plain_sgd:
            raise UserError(f"method {self.name!r} takes its own plain SGD steps of train.lr (its authors' optimizer), "
                            f"so {', '.join(beyond_plain_sgd)} would be ignored: set train.optimizer=sgd, "
                            "train.momentum=0 and train.weight_decay=0")


class Method:
    """An `Algorithm` bound to a run's `LocalSetup` and options: what the engine runs.

    Each call passes itself to the algorithm's function of the same name, so a
    function reads the setup as ``m.setup`` and the options as ``m.hparams``.
    """

    def __init__(self, algorithm: Algorithm, setup: LocalSetup, hparams: Any = None):
        algorithm.refuse_unsupported(setup.persistent_optimizer, setup.beyond_plain_sgd)
        if hparams is None and algorithm.hparams_type is not None:
            hparams = algorithm.hparams_type()
        self.algorithm = algorithm
        self.setup = setup
        self.hparams = hparams
        self.static = algorithm.static(self) if algorithm.static is not None else None

    def __repr__(self) -> str:
        return f"Method({self.name!r}, {self.hparams!r})"

    @property
    def name(self) -> str:
        return self.algorithm.name

    @property
    def model(self) -> Model:
        return self.setup.model

    @property
    def eval_model(self) -> str:
        """The evaluation protocol in use (``setup.eval_model`` or the algorithm's default)."""
        return self.setup.eval_model or self.algorithm.eval_models[0]

    @property
    def schedule(self) -> Schedule:
        schedule = self.algorithm.schedule
        return schedule if isinstance(schedule, Schedule) else schedule(self.hparams)

    def rebuilt(self, setup: LocalSetup, hparams: Any) -> "Method":
        """The same algorithm bound to another setup and options (engine/method_values.py)."""
        return Method(self.algorithm, setup, hparams)

    def init(self, key, num_clients: int):
        return self.algorithm.init(self, key, num_clients)

    def prepare(self, server, clients, selected):
        return self.algorithm.prepare(self, server, clients, selected)

    def client_update(self, server, client, data, key, info: ClientRound):
        return self.algorithm.client_update(self, server, client, data, key, info)

    def server_update(self, server, clients, uploads, info: ServerRound):
        return self.algorithm.server_update(self, server, clients, uploads, info)

    def update_every_client(self, server, client, data, key, round_index):
        return self.algorithm.update_every_client(self, server, client, data, key, round_index)

    def eval_variables(self, server, client, data, key):
        return self.algorithm.eval_variables(self, server, client, data, key)

    def eval_logits(self, variables, x):
        return self.algorithm.eval_logits(self, variables, x)

    def round_diagnostics(self, server, new_server, uploads, info: ServerRound) -> dict:
        return self.algorithm.round_diagnostics(self, server, new_server, uploads, info)


class LegacyMethod:
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

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.needs_selected_state, self.updates_every_client, self.server_steps_per_client,
                        self.aggregates_uploaded_only, self.cannot_pack)

    @property
    def algorithm(self):
        return type(self)

    def rebuilt(self, setup, hparams):
        return type(self)(setup, hparams)

    @classmethod
    def refuse_unsupported(cls, persistent_optimizer: bool, beyond_plain_sgd: tuple[str, ...] = ()) -> None:
        cls.refuse_persistent_optimizer(persistent_optimizer)
        if hasattr(cls, "refuse_ignored_optimizer"):
            cls.refuse_ignored_optimizer(beyond_plain_sgd)

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


def shared_init(method: LegacyMethod, key, num_clients: int):
    """Every client starts from the same initial variables (docs/methods/conventions.md)."""
    variables = method.init_variables(key)
    return variables, tree_ops.broadcast(variables, num_clients)
