"""From a RunConfig to a ready Engine: data, partition, model, optimizer, method.

The one place that wires the pieces together; the training command (commands/train.py), benchmarks
and tests call `build_experiment` on what `validate` returns (a `ValidRun`). Name checks happen before any
data loads, so a typo costs no time.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.engine import engine as engine_lib, memory_estimate
from fedjax_pfl.data import client_data, client_limits, files, partition, synthetic
from fedjax_pfl.data.pfllib_partition import pfllib_dirichlet_split
from fedjax_pfl.data.dataset import Dataset, with_normalization
from fedjax_pfl.data.registry import AUTO, INPUTS, canonical_name, input_kind, load_dataset, resolve_auto
from fedjax_pfl.core.errors import DataNotFoundError, UserError
from fedjax_pfl.engine.lr_schedule import LrSchedule
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.base import LocalSetup, RunFacts
from fedjax_pfl.methods.options import resolved
from fedjax_pfl.runs import host_devices
from fedjax_pfl.runs.sweep_points import expand
from fedjax_pfl.outputs.output_folder import default_run_folder
from fedjax_pfl.models.conv import resolve_conv_impl
from fedjax_pfl.models.networks import build_model, default_model
from fedjax_pfl.kernels.augmentation import augmentation
from fedjax_pfl.kernels.optim import make_optimizer


RESOLVED = "_resolved"  # a validated config's attribute: {key: what its 'auto' became and why}


@dataclasses.dataclass
class FederatedData:
    train: client_data.ClientData
    test: client_data.ClientData
    summary: dict
    text: str
    val: client_data.ClientData | None = None  # partition.val_fraction of each client's train split
    memory: memory_estimate.RunMemory | None = None  # the run's peak memory, estimated before the arrays were made


@dataclasses.dataclass(frozen=True)
class ValidRun:
    """A run configuration `validate` accepted: names resolved, values checked, output folder fixed. The entry
    points that run a configuration (`build_experiment`, `run_single`, `run_sweep`, `run_federations`) take only
    this; make it with `validate`.

    ``config`` hands out a copy on every read, so nothing done to it (or to the configuration given to
    `validate`) changes what runs; ``options``: the method's options dataclass (``checked.method`` is what
    config.json records of it). ``points``: a sweep's runs (seeds x listed values), each the ValidRun of its
    own single-run configuration with its traced ``values`` and ``grid_name``; () for one run.
    """

    checked: config_lib.RunConfig = dataclasses.field(repr=False)
    options: Any = None  # the method's options, typed once (None: a method without options)
    points: tuple[ValidRun, ...] = ()
    # a sweep point's traced name ('lr', option name) -> float
    values: MappingProxyType = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    grid_name: str = ""  # a sweep point's grid folder ('' without a grid, else e.g. 'lr0.05_mu0.01')

    @property
    def config(self) -> config_lib.RunConfig:
        return copy.deepcopy(self.checked)

    @property
    def out(self) -> Path:
        return Path(self.checked.out)


def require_valid(run, taker: str) -> None:
    """TypeError unless ``run`` is a `ValidRun` (a raw RunConfig is a programming error: pass validate(cfg))."""
    if not isinstance(run, ValidRun):
        raise TypeError(f"{taker} takes the ValidRun that validate(cfg) returns, not a {type(run).__name__}")


@dataclasses.dataclass
class Experiment:
    engine: engine_lib.Engine
    data: FederatedData
    dataset: Dataset
    config: config_lib.RunConfig  # the run's configuration as built (a model 'auto' resolved by its data)
    data_files: tuple[str, ...] = ()  # the dataset files actually read (none for generated data)

    @property
    def partition_summary(self):
        return self.data.summary

    @property
    def partition_text(self):
        return self.data.text


def make_normalize(dataset: Dataset):
    """jnp version of Dataset.normalize, applied to a batch when it is used."""
    mean = jnp.asarray(dataset.mean, jnp.float32)
    std = jnp.asarray(dataset.std, jnp.float32)
    scale = 1.0 / 255.0 if dataset.is_image else 1.0

    def normalize(x):
        return (x.astype(jnp.float32) * scale - mean) / std

    return normalize


def partition_dataset(dataset: Dataset, p: config_lib.PartitionConfig, seed: int, memory=None) -> FederatedData:
    """Client train/test index lists per the config, stacked into padded arrays (``memory``: the run's
    engine/memory_estimate.py RunMemory, checked once the sizes are known, before the arrays are made)."""
    if p.scheme == "natural":
        if not dataset.is_federated:
            raise UserError(f"partition 'natural' needs a dataset with its own clients (synthetic, pfllib), not {dataset.name}")
        train_idx = partition.indices_by_owner(dataset.client_ids_train)
        test_idx = partition.indices_by_owner(dataset.client_ids_test, len(train_idx))
        x_train, y_train, x_test, y_test = dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test
    elif p.test_from == "official":
        train_idx = _scheme(dataset.y_train, p, seed)
        if p.train_per_client:
            train_idx, _ = partition.sample_per_client(train_idx, dataset.y_train, p.train_per_client, 0, seed + 1)
        test_idx = partition.distribute_test_by_label_distribution(
            train_idx, dataset.y_train, dataset.y_test, seed + 2, p.test_per_client)
        x_train, y_train, x_test, y_test = dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test
    elif p.test_from in ("split", "split_train"):
        if p.test_from == "split":
            x_pool = np.concatenate([dataset.x_train, dataset.x_test])
            y_pool = np.concatenate([dataset.y_train, dataset.y_test])
        else:  # the official train set only (pFedKD-WCL's authors); the official test set is unused
            x_pool, y_pool = dataset.x_train, dataset.y_train
        if p.scheme == "pfllib_dirichlet":  # partition and split in one draw sequence, as PFLlib's generators
            train_idx, test_idx = pfllib_dirichlet_split(y_pool, p.num_clients, p.alpha, p.train_fraction, seed,
                                                         p.min_size, dataset.num_classes)
        elif p.train_per_client:
            pool_idx = _scheme(y_pool, p, seed)
            train_idx, test_idx = partition.sample_per_client(
                pool_idx, y_pool, p.train_per_client, p.test_per_client or 0, seed + 1)
        else:
            pool_idx = _scheme(y_pool, p, seed)
            train_idx, test_idx = partition.split_train_test(pool_idx, y_pool, p.train_fraction, seed + 1)
        x_train = x_test = x_pool
        y_train = y_test = y_pool
    else:
        raise UserError(f"partition.test_from must be 'split', 'split_train' or 'official', got {p.test_from!r}")
    if len(train_idx) != p.num_clients and p.scheme != "natural":
        raise UserError(f"partition produced {len(train_idx)} clients, expected {p.num_clients}")
    val = val_idx = None
    if p.val_fraction > 0:  # stratified, from the train split only: test data never pick a setting
        train_idx, val_idx = partition.split_train_test(train_idx, y_train, 1.0 - p.val_fraction, seed + 3)
    parts = {"train": train_idx, "test": test_idx, **({"val": val_idx} if val_idx is not None else {})}
    if memory is not None:  # the pool twice where train and test are pooled; views of it for its own clients
        memory.check_arrays({k: np.array([len(i) for i in v]) for k, v in parts.items()}, dataset,
                            1 + (p.scheme != "natural" and p.test_from == "split"), p.scheme == "natural" and not val_idx)
    if val_idx is not None:
        val = client_data.stack_clients(x_train, y_train, val_idx)
    info = {"dataset": dataset.name, "seed": seed, **dataclasses.asdict(p)}
    summary = partition.summary(train_idx, y_train, dataset.num_classes, test_idx, y_test, info=info)
    return FederatedData(
        train=client_data.stack_clients(x_train, y_train, train_idx),
        test=client_data.stack_clients(x_test, y_test, test_idx),
        summary=summary,
        text=partition.format_summary(summary),
        val=val,
        memory=memory,
    )


def _scheme(labels, p: config_lib.PartitionConfig, seed: int):
    """The partition of ``labels`` by ``p.scheme``, each of its parameters taken from the config field of the same
    name (data/partition.py's signatures name them)."""
    taken = inspect.signature(partition.SCHEMES[p.scheme]).parameters
    params = {name: getattr(p, name) for name in taken if name not in ("num_clients", "seed") and hasattr(p, name)}
    if "min_size" in params:  # fixed per-client sizes need that many samples per client
        params["min_size"] = max(p.min_size, (p.train_per_client or 0) + (p.test_per_client or 0))
    return partition.make_partition(p.scheme, labels, p.num_clients, seed, **params)


def run_facts(cfg: config_lib.RunConfig, model=None, num_clients: int | None = None) -> RunFacts:
    """What the method's checks read of the run ``cfg`` (`Algorithm.check_run`). Before its data are read, the
    model is built for the dataset's declared inputs (data/registry.py ``INPUTS``) with the 'native' convolution
    (the same parameters as every implementation's, and JAX's backend does not start) and the clients are
    partition.num_clients; None where only the data know. ``model``, ``num_clients``: what the data gave."""
    m, t, inputs = cfg.model, cfg.train, INPUTS.get(cfg.data.name)
    facts = (num_clients or known_clients(cfg), t.drop_last, t.persistent_optimizer, beyond_plain_sgd(t))
    if model is None and inputs is not None and m.name != "auto":
        return _outline_facts((m.name, m.init, m.hidden, t.precision, *inputs), *facts)
    return RunFacts(model, *facts)


@functools.lru_cache(maxsize=64)  # one model's shapes, once a process: validate runs for every cell of a table
def _outline_facts(model: tuple, *facts) -> RunFacts:
    name, init, hidden, precision, input_shape, num_classes = model
    return RunFacts(build_model(name, input_shape, num_classes, conv_impl="native", init=init, precision=precision,
                                **({"hidden": hidden} if hidden else {})), *facts)


def known_clients(cfg: config_lib.RunConfig) -> int | None:
    """The run's client count before its data are read: partition.num_clients, except for a folder that brings
    its own clients (a natural partition of anything but generated data)."""
    natural = cfg.partition.scheme == "natural" and cfg.data.name != "synthetic"
    return None if natural else cfg.partition.num_clients


def build_method(cfg: config_lib.RunConfig, dataset: Dataset, options):
    """The run's method, bound to its setup on ``dataset`` with its typed ``options`` (`ValidRun.options`)."""
    return get_method(cfg.method_name)(build_setup(cfg, dataset), options)


def build_setup(cfg: config_lib.RunConfig, dataset: Dataset) -> LocalSetup:
    t, m = cfg.train, cfg.model
    model_kwargs = {**({"hidden": m.hidden} if m.hidden else {}), **({"dropout": True} if m.dropout else {})}
    model = build_model(m.name, dataset.input_shape, dataset.num_classes, conv_impl=m.conv_impl, init=m.init,
                        precision=t.precision, **model_kwargs)

    if t.augment != "none" and len(dataset.input_shape) != 3:
        raise UserError(f"train.augment={t.augment} crops and flips images [H, W, C]; {dataset.name} has inputs of "
                        f"shape {tuple(dataset.input_shape)}: leave train.augment=none")
    return local_setup(t, model, make_normalize(dataset), eval_model=cfg.eval.model)


def local_setup(t: config_lib.TrainConfig, model, normalize, eval_model: str | None = None) -> LocalSetup:
    """The `LocalSetup` of train settings ``t`` for ``model`` on batches mapped by ``normalize``: every value
    from the settings, the optimizer a function of the learning rate (a round's comes with its hyperparameters)."""
    return LocalSetup(
        model=model,
        optimizer=functools.partial(make_optimizer, t.optimizer, momentum=t.momentum, weight_decay=t.weight_decay),
        lr=t.lr,
        batch_size=t.batch_size,
        local_epochs=t.local_epochs,
        normalize=normalize,
        augment=augmentation(t.augment),
        drop_last=t.drop_last,
        persistent_optimizer=t.persistent_optimizer,
        share_batch_stats=t.share_batch_stats,
        eval_model=eval_model,
        beyond_plain_sgd=beyond_plain_sgd(t),
    )


def engine_config(t: config_lib.TrainConfig, clients_per_round: int, progress: bool = False) -> engine_lib.EngineConfig:
    """The `EngineConfig` of train settings ``t`` with ``clients_per_round`` sampled a round; ``progress``:
    in-round progress callbacks (engine/round_progress.py)."""
    return engine_lib.EngineConfig(
        clients_per_round=clients_per_round,
        client_mapping=t.client_mapping,
        chunk_size=t.chunk_size,
        straggler_fraction=t.straggler_fraction,
        drop_fraction=t.drop_fraction,
        all_clients_train=t.all_clients_train,
        lr_schedule=LrSchedule(t.lr_schedule, t.lr_decay, t.rounds),
        progress=progress,
    )


def beyond_plain_sgd(t: config_lib.TrainConfig) -> tuple[str, ...]:
    """The train settings that make the run's optimizer more than plain SGD of train.lr, as ``key=value``."""
    return tuple(f"train.{k}={v}" for k, v, plain in (
        ("optimizer", t.optimizer, "sgd"), ("momentum", t.momentum, 0), ("weight_decay", t.weight_decay, 0))
        if v != plain)


def validate(cfg: config_lib.RunConfig) -> ValidRun:
    """The run ``cfg`` describes, checked: a one-line UserError on a bad name or value, before any data is read.
    ``cfg`` itself is left as it was.

    Resolved in the record, as config.json must record them: the dataset
    alias and ``data.name='auto'`` (the CIFAR-10 at hand: `resolve_dataset`),
    ``partition.scheme='auto'`` (`config.partition_scheme`), ``model.name='auto'``
    (by the dataset's inputs: `resolve_model`), ``eval.model='auto'`` (the
    method's default protocol), the method's options, typed once
    (``options``; ``cfg.method`` holds every option's value, defaults
    included), the data folder as an absolute path (the run resumes from any
    working directory) and the output folder (default:
    runs/<method>-<data>[-sweep]-<time>). The method's own rules on the run
    (`Algorithm.check_run`) are checked here too, before any data are read;
    what only the data can tell (a PFLlib folder's inputs and clients) when
    they are read. A sweep's points (runs/sweep_points.py) are checked too,
    each with its own values.
    """
    cfg = copy.deepcopy(cfg)
    algorithm = get_method(cfg.method_name)
    options = check_values(cfg, algorithm)
    if cfg.data.data_dir:
        cfg.data.data_dir = os.path.abspath(os.path.expanduser(cfg.data.data_dir))
    sweep = bool(cfg.seeds or cfg.sweep)
    cfg.out = cfg.out or str(default_run_folder(cfg.method_name, cfg.data.name, "sweep" if sweep else ""))
    points = []
    for point, values, grid_name in expand(cfg, algorithm.hyperparameter_names) if sweep else []:
        point_options = config_lib.method_options(algorithm.hparams_type, point.method)  # its listed values
        config_lib.validate_values(point)
        points.append(ValidRun(point, point_options, values=MappingProxyType(values), grid_name=grid_name))
    return ValidRun(cfg, options, tuple(points))


def check_values(cfg: config_lib.RunConfig, algorithm):
    """`validate`'s checks, resolving ``cfg``'s names in place -> the method's options."""
    options = config_lib.method_options(algorithm.hparams_type, cfg.method)
    cfg.method = resolved(options)
    resolve_dataset(cfg)
    cfg.data.name = canonical_name(cfg.data.name)  # raises UserError listing the valid names
    resolve_partition(cfg)
    resolve_model(cfg, {"image": True, "vector": False}.get(input_kind(cfg.data.name)))
    config_lib.validate_values(cfg)
    offered = algorithm.eval_models
    if cfg.eval.model == "auto":
        cfg.eval.model = offered[0]
    if cfg.eval.model not in offered:
        raise UserError(f"method {cfg.method_name!r} evaluates with eval.model = {' or '.join(offered)}, "
                        f"not {cfg.eval.model!r}")
    data_dir = cfg.data.data_dir
    if data_dir and cfg.data.source == "files" and cfg.data.name != "synthetic" and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder; pass the folder that holds the dataset files "
                        "or leave it out")
    algorithm.check_run(options, run_facts(cfg))
    return options


def _note(cfg: config_lib.RunConfig, key: str, text: str) -> None:
    setattr(cfg, RESOLVED, {**getattr(cfg, RESOLVED, {}), key: text})


def resolved_notes(cfg: config_lib.RunConfig) -> dict[str, str]:
    """{key: what its 'auto' became and why} for the settings `validate` and `build_experiment` resolved."""
    return dict(getattr(cfg, RESOLVED, {}))


def resolve_dataset(cfg: config_lib.RunConfig) -> None:
    """``data.name='auto'`` -> the official cifar10 when its files are here, else cifar10_jpeg when it is
    (data/registry.py's `resolve_auto`)."""
    if cfg.data.name == AUTO:
        cfg.data.name, why = resolve_auto(cfg.data.data_dir, cfg.data.source)
        _note(cfg, "data.name", f"{cfg.data.name} ({why})")


def resolve_partition(cfg: config_lib.RunConfig) -> None:
    """``partition.scheme='auto'`` -> its scheme (`config.partition_scheme`), recorded."""
    if cfg.partition.scheme == AUTO:
        cfg.partition.scheme = config_lib.partition_scheme(cfg)
        why = "the folder brings its own clients" if cfg.partition.scheme == "natural" else "the default"
        _note(cfg, "partition.scheme", f"{cfg.partition.scheme} (auto: {why})")


def resolve_model(cfg: config_lib.RunConfig, is_image: bool | None) -> None:
    """``model.name='auto'`` -> the default model for image or vector inputs (None: not known yet)."""
    if cfg.model.name == "auto" and is_image is not None:
        cfg.model.name = default_model(is_image)
        _note(cfg, "model.name", f"{cfg.model.name} (auto: the default for {'images' if is_image else 'feature vectors'})")


def check_files_read(data_dir, read: list) -> None:
    """An explicit data folder must be the one the files were read from."""
    if not data_dir:
        return
    root = Path(data_dir).expanduser().resolve()
    outside = [p for p in read if root not in (Path(p).resolve(), *Path(p).resolve().parents)]
    if outside:
        raise UserError(f"--data-dir {data_dir} lacks the dataset files (found {outside[0]} elsewhere); "
                        f"put them in {data_dir} or pass --data-dir {Path(outside[0]).parent}")


def build_experiment(run: ValidRun, dataset: Dataset | None = None, progress: bool = False) -> Experiment:
    """The experiment of ``run`` (on ``dataset`` when given); ``progress``: in-round progress callbacks
    (engine/round_progress.py)."""
    require_valid(run, "build_experiment")
    cfg = run.config
    seed = config_lib.drawn_data_seed(cfg.seed, cfg.data_seed)
    read: list = []
    memory = memory_estimate.RunMemory(memory_estimate.RunPlan.of(cfg, seed))  # (the process before data)
    if dataset is None:
        extra = ({"num_clients": cfg.partition.num_clients, "seed": seed,
                  "size_factor": cfg.data.synthetic_size_factor,
                  "samples_per_client": cfg.data.synthetic_samples_per_client} if cfg.data.name == "synthetic" else {})
        if cfg.data.name == "synthetic":  # before a sample is drawn (sized on a one-client copy of its data)
            memory.check_before_loading(build_method(cfg, synthetic.load_synthetic(num_clients=1, samples_per_client=2),
                                                     run.options))
        explicit_dir = bool(cfg.data.data_dir) and cfg.data.source == "files"
        try:
            with files.recording_reads() as read:
                dataset = load_dataset(cfg.data.name, data_dir=cfg.data.data_dir,
                                       allow_download=cfg.data.allow_download,
                                       source=cfg.data.source, **extra)
        except DataNotFoundError as e:
            hint = " (or --dataset cifar10_jpeg, the project's JPEG copy)" if cfg.data.name == "cifar10" else ""
            raise DataNotFoundError(f"{e} To try the library without any files, use --dataset synthetic{hint}.") from None
        if explicit_dir:
            check_files_read(cfg.data.data_dir, read)
    dataset = with_normalization(dataset, cfg.data.normalization)
    resolve_model(cfg, dataset.is_image)  # (datasets whose files decide their inputs)
    method = build_method(cfg, dataset, run.options)
    memory.with_method(method)
    data = partition_dataset(dataset, cfg.partition, seed, memory)
    if INPUTS[cfg.data.name] is None or known_clients(cfg) is None:  # facts validate could not know
        method.algorithm.check_run(run.options, run_facts(cfg, method.setup.model, data.train.num_clients))
    client_limits.check_batch_size(cfg.train.batch_size, data.train.n)
    num_clients = data.train.num_clients
    engine_cfg = engine_config(cfg.train, engine_lib.clients_per_round(num_clients, cfg.train.join_ratio), progress)
    engine = engine_lib.Engine(method, data.train, data.test, engine_cfg, val=data.val)
    kept = dataset.without_samples() if cfg.data.name == "synthetic" else dataset  # (generated: never reused)
    return Experiment(engine, data, kept, cfg, tuple(str(p) for p in dict.fromkeys(read)))



def resolved_settings(cfg: config_lib.RunConfig, mapping: dict) -> dict:
    """What the config's 'auto' settings became in this run (config.json's "resolved"): the dataset and the
    model (when 'auto', with why: `resolved_notes`), the convolution implementation, the arithmetic
    (train.precision), ``mapping``, the client mapping's record (engine/mapping_choice.py: timed or not), and
    the devices that ran (runs/host_devices.py)."""
    return {**resolved_notes(cfg), "model.conv_impl": resolve_conv_impl(cfg.model.conv_impl),
            "train.precision": cfg.train.precision,
            "train.client_mapping": mapping, "devices.cpu": host_devices.record()}
