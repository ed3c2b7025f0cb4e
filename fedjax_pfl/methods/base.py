"""The method contract: an algorithm is a few pure functions for ONE client plus batched server steps.

A method's file declares one `Algorithm`: its name, `Paper`, options
dataclass, evaluation protocols, the `Schedule` the engine must follow, and its
functions, each taking the bound method ``m`` first (``m.model``: the model;
``m.hparams``: its options; ``m.static``: what ``static`` derived from them
once; ``m.lr`` and ``m.optimizer``: this round's learning rate and the local
optimizer at it; ``m.local``: the `LocalTraining` record of the run's train
and data settings, which a contract function hands on whole to the steps that
read it):

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
    static(m)                                      -> values derived once from setup and options
    check(name, options, facts: RunFacts)          -> None, or a one-line UserError (the run's validation)

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

import copy
import dataclasses
import functools
import sys
import typing
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.kernels.counted_loop import PLAIN, Loops
from fedjax_pfl.models.networks import Model


@dataclasses.dataclass(frozen=True, eq=False)
class LocalSetup:
    """What every client needs to train: model, optimizer, learning rate, batch size, epochs.

    A plain record: runs/ builds it from the run's train settings (runs/config.py
    declares each one's default and allowed values and checks them); tests that
    build it by hand pass every value. ``normalize`` maps a stored batch (uint8
    images or float features) to the model's float32 input. ``optimizer`` is the
    local optimizer as a function of the learning rate (as ``optax.sgd``): a
    round's learning rate arrives with its `Hyperparams` (`Method.optimizer`).
    The optimizer state is fresh at every local phase unless
    ``persistent_optimizer`` (see `training.train_kept`).
    """

    model: Model
    optimizer: Callable[[Any], optax.GradientTransformation]  # learning rate -> the local optimizer
    lr: float  # train.lr: the learning rate before the schedule (a round's: `Method.lr`)
    batch_size: int
    local_epochs: int
    normalize: Callable[[jax.Array], jax.Array]
    augment: Callable | None  # train.augment: (key, stored batch) -> batch, before normalize (augmentation.py)
    drop_last: bool  # train.drop_last: each epoch's partial batch is dropped (local_training)
    persistent_optimizer: bool  # train.persistent_optimizer: clients keep their optimizer state
    share_batch_stats: bool  # train.share_batch_stats: BatchNorm statistics travel with a shared body
    eval_model: str | None  # eval.model: one of the method's `eval_models`; None: its default
    beyond_plain_sgd: tuple[str, ...]  # the train settings that make `optimizer` more than SGD of the lr


@dataclasses.dataclass(frozen=True, eq=False)
class LocalTraining:
    """How a client trains this round: the run's train and data settings a method's steps read.

    A method function that reads one takes this record as an argument (a
    contract function passes ``m.local`` on whole), so its signature shows
    what it depends on; no function of a method reads a train or data setting
    through ``m`` (tests/test_method_inputs.py).
    """

    optimizer: optax.GradientTransformation  # the run's local optimizer at this round's learning rate
    batch_size: int  # train.batch_size (B)
    local_epochs: int  # train.local_epochs (E)
    normalize: Callable[[jax.Array], jax.Array]  # a stored batch -> the model's float32 input (data.normalization)
    augment: Callable | None  # train.augment: (key, stored batch) -> batch, before normalize
    drop_last: bool  # train.drop_last
    persistent_optimizer: bool  # train.persistent_optimizer
    share_batch_stats: bool  # train.share_batch_stats
    loops: Loops  # how the client's counted loops run (packed lanes, progress reports): the engine's, not a setting


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What a method's checks read of the run it is to join (`Algorithm.check_run`).

    runs/experiment.py's `validate` gives what it knows before any data are
    read; a fact that only the data decide (None there: a PFLlib folder's
    inputs, a folder's own clients) is checked once they are read.
    """

    model: Model | None  # the run's model; None: its inputs are what the data files hold
    num_clients: int | None  # None: the data bring their own clients
    drop_last: bool  # train.drop_last
    persistent_optimizer: bool  # train.persistent_optimizer
    beyond_plain_sgd: tuple[str, ...]  # the train settings that make the optimizer more than SGD of train.lr

    @functools.cached_property
    def variables(self) -> dict:
        """The model's initial variables as shapes (`jax.eval_shape`: nothing is computed; the key is made inside,
        so JAX's backend does not start: a run's validation comes before its devices are set)."""
        return jax.eval_shape(lambda: self.model.init(jax.random.key(0)))


class Hyperparams(NamedTuple):
    """The values a compiled round takes as an argument (a pytree of scalars, traced there), as optax's
    ``inject_hyperparams``: a grid's points, federations of one program, take theirs each, and the lr schedule,
    a function of the round index, gives each round its ``lr``. A method reads them as `Method.lr`,
    `Method.base_lr`, `Method.optimizer` and the fields of ``m.hparams`` named in ``options``."""

    lr: Any  # this round's learning rate: train.lr times the schedule's factor
    base_lr: Any  # train.lr before the schedule
    options: dict  # float options (`Algorithm.hyperparameter_names`) -> value, in place of the bound ones


LR = "lr"  # the name train.lr goes by among a round's values (`Algorithm.hyperparameter_names`)


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
    static: Callable | None = None  # m -> what the method derives once when bound (m.static)
    # (name, options, facts: RunFacts) -> None: the method's own rules on a run, a one-line UserError (`check_run`)
    check: Callable | None = None
    keeps_optimizer_state: bool = False  # supports train.persistent_optimizer (`training.train_kept`)
    needs_body_head_split: bool = False  # shares a body: a model without body parameters cannot work
    own_sgd: bool = False  # its update rule is its own plain SGD of train.lr: other optimizer settings are refused
    # The module whose top level makes it (also through `dataclasses.replace`): the registry takes the algorithms
    # a module makes, not those it imports.
    module: str = dataclasses.field(init=False, default="")

    def __post_init__(self):
        object.__setattr__(self, "module", _declaring_module())

    def __repr__(self) -> str:
        return f"Algorithm({self.name!r}, {self.module})"

    def __call__(self, setup: LocalSetup, hparams: Any = None) -> "Method":
        """This algorithm bound to ``setup`` and ``hparams`` (None: the default options)."""
        return Method(self, setup, hparams)

    @property
    def doc(self) -> str:
        """The declaring module's docstring: the algorithm and its notes (the documentation page, ``--help``)."""
        return sys.modules[self.module].__doc__ or ""

    def schedule_of(self, hparams: Any = None) -> Schedule:
        """The engine's schedule under options ``hparams`` (None: the default options)."""
        if isinstance(self.schedule, Schedule):
            return self.schedule
        return self.schedule(hparams if hparams is not None else self.hparams_type())

    @property
    def hyperparameter_names(self) -> tuple[str, ...]:
        """``lr`` and the float options: the values a compiled round takes as arguments (`Hyperparams`),
        which a grid may vary in one program."""
        if self.hparams_type is None:
            return (LR,)
        hints = typing.get_type_hints(self.hparams_type)
        return (LR, *(f.name for f in dataclasses.fields(self.hparams_type)
                      if hints[f.name] in (float, typing.Optional[float])))

    def check_run(self, options, facts: RunFacts) -> None:
        """A one-line UserError for a run this method cannot take with options ``options``: settings it would
        ignore (train.persistent_optimizer where it keeps no optimizer state, an optimizer beyond plain SGD where
        it takes its own), a model without the body it shares, and its own rules (`check`). A fact not known
        yet (None) is not checked. The run's validation calls it (runs/experiment.py); binding checks nothing."""
        if facts.persistent_optimizer and not self.keeps_optimizer_state:
            raise UserError(f"method {self.name!r} does not support train.persistent_optimizer; leave it false")
        if self.own_sgd and facts.beyond_plain_sgd:
            raise UserError(f"method {self.name!r} takes its own plain SGD steps of train.lr (its authors' optimizer), "
                            f"so {', '.join(facts.beyond_plain_sgd)} would be ignored: set train.optimizer=sgd, "
                            "train.momentum=0 and train.weight_decay=0")
        if (self.needs_body_head_split and facts.model is not None
                and not jax.tree.leaves(facts.variables["params"]["body"])):
            raise UserError(f"method {self.name!r} shares the model's body, but {facts.model.name!r} has no body "
                            "parameters (its feature is the input); choose a model with a body, e.g. --model mlp")
        if self.check is not None:
            self.check(self.name, options, facts)


class Method:
    """An `Algorithm` bound to a run's `LocalSetup`, options and `Hyperparams`: what the engine runs.

    Each call passes itself to the algorithm's function of the same name, so a
    function reads the options as ``m.hparams``, the round's learning rate as
    ``m.lr`` (``m.optimizer``: the local optimizer at it) and hands ``m.local``
    (the run's train and data settings, and how the client's counted loops run)
    to the steps that read them. The engine gives each round its values with
    `with_hyperparams`, and each client its loops with `with_loops`.
    """

    def __init__(self, algorithm: Algorithm, setup: LocalSetup, hparams: Any = None):
        if hparams is None and algorithm.hparams_type is not None:
            hparams = algorithm.hparams_type()
        self.algorithm = algorithm
        self.setup = setup
        self.options = hparams  # as bound (concrete, checked)
        self.hyperparams = Hyperparams(setup.lr, setup.lr, {})
        self.loops = PLAIN  # how the client's counted loops run (kernels/counted_loop.py)
        self.static = algorithm.static(self) if algorithm.static is not None else None

    def with_hyperparams(self, hyperparams: Hyperparams) -> "Method":
        """This method reading ``hyperparams`` (traced in a compiled round) in place of its bound values: the
        same algorithm, setup, options and ``static`` (derived once from the bound values; their checks ran
        there). A name beyond `Algorithm.hyperparameter_names` is a `UserError`."""
        unknown = set(hyperparams.options) - set(self.algorithm.hyperparameter_names)
        if unknown:
            raise UserError(f"method {self.name!r} cannot vary {', '.join(sorted(unknown))} in one program; "
                            f"it can vary: {', '.join(self.algorithm.hyperparameter_names)}")
        view = copy.copy(self)
        view.hyperparams = hyperparams
        return view

    def with_loops(self, loops: Loops) -> "Method":
        """This method running its clients' counted loops as ``loops`` says (packed lanes, progress reports)."""
        view = copy.copy(self)
        view.loops = loops
        return view

    def __repr__(self) -> str:
        return f"Method({self.name!r}, {self.options!r})"

    @property
    def hparams(self):
        """The options, with the float options of `Hyperparams.options` read from there."""
        if not self.hyperparams.options:
            return self.options
        return OptionValues(self.options, self.hyperparams.options)

    @property
    def lr(self):
        """This round's learning rate (train.lr times the schedule's factor)."""
        return self.hyperparams.lr

    @property
    def base_lr(self):
        """train.lr before the schedule (learning rates a method keeps unscheduled, GPFL's guidance)."""
        return self.hyperparams.base_lr

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """The run's local optimizer at this round's learning rate."""
        return self.setup.optimizer(self.lr)

    @property
    def local(self) -> LocalTraining:
        """The run's local training at this round's learning rate, the record a method's steps take."""
        settings = {f.name: getattr(self.setup, f.name) for f in dataclasses.fields(LocalTraining)
                    if f.name not in ("optimizer", "loops")}
        return LocalTraining(optimizer=self.optimizer, loops=self.loops, **settings)

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
        return self.algorithm.schedule_of(self.options)

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


class OptionValues:
    """A method's options read with some fields from elsewhere (`Hyperparams.options`: traced values); reads
    only, as a method reads ``m.hparams``."""

    def __init__(self, options, values: dict):
        self._options, self._values = options, values

    def __getattr__(self, name):
        values = self.__dict__["_values"]
        return values[name] if name in values else getattr(self.__dict__["_options"], name)

    def __repr__(self) -> str:
        return f"{self._options!r} with {sorted(self._values)} traced"
