"""Run configuration: dataclasses, YAML presets and dotted overrides.

A run is described by `RunConfig`. A YAML file (configs/*.yaml) gives any
subset of its fields as nested mappings; ``key.sub=value`` overrides apply on
top (values parsed as YAML scalars). ``method`` holds the method's own options
(e.g. ``method.mu=0.01`` for FedProx), checked against its options dataclass.
Defaults: the FedAS paper's CIFAR-10 setting (docs/methods/conventions.md).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import inspect
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from fedjax_pfl.core import declared
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.dataset import NORMALIZATIONS
from fedjax_pfl.data.partition import SCHEMES
from fedjax_pfl.data.registry import ALIASES, SOURCES, dataset_names
from fedjax_pfl.outputs.tensorboard_log import MISSING as TENSORBOARD_MISSING

setting = declared.declare


def _below() -> types.SimpleNamespace:
    """The registries below the run layer (methods, engine, kernels, models, host devices), imported when a value
    is checked or shown, not with this module: they import JAX, and reading a configuration (the reproduce
    command's plans, the report) needs none."""
    from fedjax_pfl import methods
    from fedjax_pfl.engine import client_mapping
    from fedjax_pfl.kernels import augmentation, optim
    from fedjax_pfl.models import conv, initialization, networks, precision
    from fedjax_pfl.runs import host_devices
    return types.SimpleNamespace(methods=methods, client_mapping=client_mapping, augmentation=augmentation,
                                 optim=optim, conv=conv, initialization=initialization, networks=networks,
                                 precision=precision, host_devices=host_devices)


def _client_mapping(value) -> None:
    try:
        _below().client_mapping.parse(value)
    except UserError as e:
        raise UserError(f"train.client_mapping: {e}") from None


def _size_range(value) -> None:
    if value is not None and not (len(value) == 2 and 1 <= value[0] <= value[1]):
        raise UserError(f"partition.size_range must be [smallest, largest] with 1 <= smallest <= largest, got {list(value)}")


def _distinct(value) -> None:
    if len(set(value)) != len(value):
        raise UserError(f"seeds must be distinct numbers >= 0, got {list(value)}")


AUTO = "auto"
# partition schemes that experiment.py deals itself (the rest are data/partition.py's SCHEMES)
OWN_SCHEMES = ("pfllib_dirichlet", "natural")


@dataclasses.dataclass
class DataConfig:
    name: str = setting(AUTO, "dataset (aliases: fashion_mnist = fmnist); cifar10_jpeg is the project's lossy "
                        "JPEG copy of CIFAR-10; auto: the official cifar10 files when found, else cifar10_jpeg when "
                        "found, else cifar10; config.json records which", choices=(AUTO, *dataset_names(), *ALIASES),
                        flag="dataset")
    data_dir: str | None = setting(None, "folder with dataset files", none="$FEDJAX_PFL_DATA_DIR, then the cache",
                                   flag=True)
    allow_download: bool = setting(False, "download a missing official dataset file into the cache folder "
                                   "($FEDJAX_PFL_CACHE_DIR, else ~/.cache/fedjax_pfl); not with --data-dir, whose "
                                   "folder must hold the files", flag="download")
    source: str = setting("files", "where datasets come from: standard files, or TensorFlow Datasets",
                          choices=SOURCES)
    synthetic_size_factor: int = setting(1, "synthetic: client sizes x this (FedProx: 1; pFedKD-WCL's authors' "
                                         "generator: 5)", at_least=1)
    synthetic_samples_per_client: int | None = setting(None, "synthetic: every client's size (train and test "
                                                        "together), e.g. for 100,000 clients of even size",
                                                        at_least=2, none="FedProx's lognormal sizes")
    normalization: str = setting("dataset", "'dataset': its per-channel mean/std; 'half': (x/255 - 0.5) / 0.5 "
                                 "(PFLlib's data)", choices=NORMALIZATIONS)


@dataclasses.dataclass
class PartitionConfig:
    scheme: str = setting(AUTO, "how samples are dealt to clients; auto: natural for a folder that brings its own "
                          "clients (pfllib), else dirichlet; config.json records which",
                          choices=(AUTO, *SCHEMES, *OWN_SCHEMES), flag="partition")
    num_clients: int = setting(20, "number of clients", at_least=1, flag=True)
    alpha: float = setting(0.1, "Dirichlet concentration", more_than=0, flag=True)
    min_size: int = setting(10, "dirichlet: fewest samples per client (pfllib_dirichlet: PFLlib's least_samples)",
                            at_least=0)
    classes_per_client: int = setting(2, "pathological: classes per client", at_least=1, flag=True)
    num_groups: int = setting(5, "practical: client groups", at_least=1)
    dominant_classes_per_group: int = setting(2, "practical: dominant classes of each group", at_least=1)
    uniform_fraction: float = setting(0.2, "practical: share of each client's samples drawn uniformly", at_least=0,
                                      at_most=1)
    samples_per_client: int | None = setting(None, "practical: samples per client", at_least=1,
                                             none="(practical needs it)")
    train_fraction: float = setting(0.75, "per-client split of the merged pool into train / test", more_than=0,
                                    less_than=1)
    train_per_client: int | None = setting(None, "fixed train samples per client (DiversiFed, FedPAC)", at_least=0,
                                           none="the split by train_fraction")
    test_per_client: int | None = setting(None, "fixed test samples per client", at_least=0,
                                          none="the split by train_fraction")
    test_from: str = setting("split", "'split': a per-client split of train+test; 'split_train': of the official "
                             "train set only; 'official': the official test set, dealt by each client's labels",
                             choices=("split", "split_train", "official"))
    val_fraction: float = setting(0.0, "of each client's train split held out as validation data (picks grid "
                                  "points)", at_least=0, less_than=1)
    max_classes_per_client: int | None = setting(None, "(client_)dirichlet: keep only each client's k largest "
                                                 "classes (pFedKD-WCL)", at_least=1, none="every class")
    size_range: tuple[int, ...] | None = setting(None, "client_dirichlet: client sizes floor(linspace(smallest, "
                                                 "largest, num_clients))", check=_size_range,
                                                 none="(client_dirichlet needs it)")
    disjoint: bool = setting(False, "client_dirichlet: no sample in two clients (a class asked for beyond its pool "
                             "is cut in proportion); false: clients draw independently, as pFedKD-WCL's authors")


@dataclasses.dataclass
class TrainConfig:
    rounds: int = setting(40, "communication rounds", at_least=1, flag=True)
    local_epochs: int = setting(5, "local epochs per round (E)", at_least=1, flag=True)
    batch_size: int = setting(16, "local batch size (B)", at_least=1, flag=True)
    optimizer: str = setting("sgd", "local optimizer", choices=lambda: _below().optim.OPTIMIZERS, flag=True)
    lr: float = setting(0.005, "local learning rate", more_than=0, flag=True)
    momentum: float = setting(0.0, "SGD momentum", at_least=0, less_than=1, flag=True)
    weight_decay: float = setting(0.0, "L2 weight decay of the local optimizer", at_least=0, flag=True)
    join_ratio: float = setting(0.6, "share of clients sampled each round", more_than=0, at_most=1, flag=True)
    straggler_fraction: float = setting(0.0, "selected clients that train 1..E//2 epochs", at_least=0, at_most=1)
    drop_fraction: float = setting(0.0, "selected clients whose upload is lost", at_least=0, at_most=1)
    client_mapping: str = setting("auto", "how clients are mapped over in a round (auto: measured per backend; "
                                  "packed:W: W lanes, packed: W from the data)", check=_client_mapping,
                                  allowed=lambda: _below().client_mapping.ALLOWED, flag=True)
    chunk_size: int = setting(8, "clients vmapped at once under the chunked mapping", at_least=1)
    client_state: str = setting("auto", "where every client's state is kept: device ([N, ...] arrays), host (host "
                                "memory, each round's cohort streamed to the device) or auto (host when the [N, ...] "
                                "state and data pass half the device's memory)", choices=("auto", "device", "host"),
                                flag=True)
    share_batch_stats: bool = setting(True, "BatchNorm statistics travel with the shared parameters")
    rounds_per_call: int = setting(0, "rounds fused into one compiled call (0: auto, calls of about 2 s)",
                                   at_least=0, flag=True)
    lr_schedule: str = setting("exponential", "per round t: 'exponential' lr * lr_decay**t; 'cosine' "
                               "lr * (1 + cos(pi t / rounds)) / 2", choices=("exponential", "cosine"))
    lr_decay: float = setting(1.0, "exponential factor per round (1.0: constant lr; PFAKD's authors: 0.9)",
                              more_than=0, at_most=1)
    persistent_optimizer: bool = setting(False, "optimizer state of the parts a client keeps survives across "
                                         "rounds")
    drop_last: bool = setting(False, "drop each epoch's last partial train batch (PyTorch DataLoader drop_last)")
    augment: str = setting("none", "training-batch augmentation (crop_flip: pad 4, random crop, flip)",
                           choices=lambda: _below().augmentation.AUGMENTATIONS)
    max_experiments_per_call: int = setting(0, "seeds/grid points trained as rows of one program (0: as many as "
                                            "fit in memory)", at_least=0)
    all_clients_train: bool = setting(False, "every client trains each round; only the sampled ones are "
                                      "aggregated (pFedMe's code)")
    precision: str = setting("fp32", "what the layers compute in: bf16 activations and matmul inputs with float32 "
                             "parameters, optimizer state, losses and reductions (models/precision.py)",
                             choices=lambda: tuple(_below().precision.PRECISIONS))


@dataclasses.dataclass
class ModelConfig:
    name: str = setting("auto", "model; auto: fedavgcnn (the FedAS paper's CNN) for images, mlp for feature "
                        "vectors; config.json records which", choices=lambda: ("auto", *_below().networks.model_names()),
                        flag="model")
    conv_impl: str = setting("auto", "convolution implementation (auto: direct on CPU and GPU, never pallas); "
                             "direct covers Dense gradients too", choices=lambda: ("auto", *_below().conv.CONV_IMPLS))
    hidden: tuple[int, ...] | None = setting(None, "MLP hidden sizes", at_least=1, none="the model's own")
    init: str = setting("flax", "where parameters start: Flax's defaults or PyTorch's (the papers' code)",
                        choices=lambda: _below().initialization.INITS)
    dropout: bool = setting(False, "pfl_cnn: pfl-research's dropout in training (0.25 after the pool, 0.5 after Dense)")


@dataclasses.dataclass
class EvalConfig:
    model: str = setting("auto", "whose model each client is evaluated with: auto (the method's default, what its "
                         "authors evaluate); shared-body methods also take local (the client's model after its own "
                         "last training) or global (the current global body with the client's own head)",
                         flag="eval_model")


@dataclasses.dataclass
class LogConfig:
    tensorboard: bool = setting(False, "also write TensorBoard event files into the run folder (needs "
                                "tensorboardX)", flag=True)


@dataclasses.dataclass
class DevicesConfig:
    cpu: str = setting("auto", "host devices on a CPU, the clients split over them: auto (one per core, or a count "
                       "set by XLA_FLAGS / JAX_NUM_CPU_DEVICES) or a number",
                       check=lambda value: _below().host_devices.parse(value),
                       allowed="auto or a whole number >= 1", flag="cpu_devices")


@dataclasses.dataclass
class RunConfig:
    method_name: str = setting("fedas", "method", choices=lambda: _below().methods.method_names(), flag="method")
    method: dict[str, Any] = setting(None, "the method's own options (method.NAME=VALUE; --method M --help lists "
                                     "them)", factory=dict)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    partition: PartitionConfig = dataclasses.field(default_factory=PartitionConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    devices: DevicesConfig = dataclasses.field(default_factory=DevicesConfig)
    seed: int = setting(0, "seed of training (and of the data, unless data_seed is set)", at_least=0, flag=True)
    data_seed: int | None = setting(None, "seed of the data partition and of generated data", at_least=0,
                                    none="seed")
    seeds: tuple[int, ...] = setting((), "several seeds trained as rows of one program, e.g. 0,1,2 (a run folder each)",
                                     at_least=0, check=_distinct, none="just seed", flag=True)
    vary_data_with_seed: bool = setting(False, "with seeds: each seed draws its own partition")
    sweep: dict[str, Any] = setting(None, "train.lr / method.X -> list of values: a grid run in one program",
                                    factory=dict)
    eval_every: int = setting(1, "rounds between evaluations", at_least=1, flag=True)
    checkpoint_every: int = setting(0, "rounds between checkpoints of server and client state (0: never)",
                                    at_least=0, flag=True)
    out: str | None = setting(None, "output folder", none="runs/<method>-<dataset>-<time>", flag=True)


SECTIONS = ("data", "partition", "model", "train", "eval", "log", "devices")


def declarations() -> list[tuple[str, declared.FieldInfo]]:
    """(config key, declaration) of every run setting, top-level keys first, as the reference page lists them."""
    out = [(info.name, info) for info in declared.describe(RunConfig)]
    hints = _type_hints(RunConfig)
    for section in SECTIONS:
        out += [(f"{section}.{info.name}", info) for info in declared.describe(hints[section])]
    return out


# Numbers reach the compiled program as int32 / float32: larger ones are refused here, with a one-line
# error, instead of overflowing inside JAX.
MAX_WHOLE = 2**31 - 1
MAX_FLOAT = 3.4028234663852886e38  # float32's largest
MIN_FLOAT = 1.1754943508222875e-38  # float32's smallest normal: below it a value is 0 (or, flushed, 0 on devices)


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def check_float32(value, where: str) -> None:
    """UserError for a number that is not 0 but is 0 in float32 (e.g. an lr of 1e-50: the run would not move)."""
    if isinstance(value, float) and value != 0 and abs(value) < MIN_FLOAT:
        raise UserError(f"{where}={value!r} is 0 in float32, the precision the run computes in (its smallest normal "
                        f"number is {MIN_FLOAT:.4g}); give a value at least that large")


def _coerce(value, annotation, where: str):
    """Convert a YAML value to a dataclass field's annotated type, or raise UserError."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if value is None:
        if type(None) in args or annotation is Any:
            return None
        raise UserError(f"{where} may not be empty")
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if origin is tuple:
        seq = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_coerce(v, args[0], where) for v in seq)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where} must be true or false, got {value!r}")
    if annotation in (int, float):
        if isinstance(value, str):  # YAML 1.1 reads '5e-4' (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                number = None
            if number is not None and math.isfinite(number):
                value = number
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value) or abs(value) > (MAX_WHOLE if annotation is int else MAX_FLOAT):
            size = f"{MAX_WHOLE} (int32)" if annotation is int else f"{MAX_FLOAT:.4g} (float32)"
            raise UserError(f"{where} must be finite and at most {size} in size, got {value!r}")
        if annotation is float:
            check_float32(value, where)
        if annotation is int and float(value) != int(value):
            raise UserError(f"{where} must be a whole number, got {value!r}")
        return annotation(value)
    if annotation is str:
        return str(value)
    return value


_type_hints = functools.cache(typing.get_type_hints)  # per dataclass: a table builds hundreds of configs


def apply_mapping(cfg, mapping: dict, where: str = ""):
    """Set fields of dataclass ``cfg`` from a nested mapping (in place)."""
    if not isinstance(mapping, dict):
        raise UserError(f"config section {where or 'root'} must be a mapping")
    hints = _type_hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg)}
    for key, value in mapping.items():
        path = f"{where}.{key}" if where else key
        if key not in names:
            raise UserError(f"unknown config key {path!r}; valid keys here: {', '.join(sorted(names))}")
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current):
            apply_mapping(current, value, path)
        elif key == "method":
            if not isinstance(value, dict):
                raise UserError("config key 'method' must be a mapping of method options")
            current.update(value)
        else:
            setattr(cfg, key, _coerce(value, hints[key], path))
    return cfg


def parse_override(text: str) -> dict:
    """``'a.b=1'`` -> ``{'a': {'b': 1}}`` with the value parsed as YAML."""
    if "=" not in text:
        raise UserError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise UserError(f"override {text!r}: the value is not valid YAML; quote it") from None
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def load_yaml(path: str | Path) -> dict:
    """The mapping in a YAML file (a fresh copy each call; the file is parsed again only when it changed)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file {path} not found (presets live in configs/)")
    stat = path.stat()
    return copy.deepcopy(_parse_yaml(path, stat.st_mtime_ns, stat.st_size))


class _RepeatedKey(yaml.YAMLError):
    def __init__(self, key, first: int, again: int):
        super().__init__(f"{key!r} at line {again} repeats the key of line {first}")
        self.key, self.first, self.again = key, first, again


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently: two
    ``train:`` blocks would run only the second)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = lines.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: YAML itself refuses it below
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _RepeatedKey(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


@functools.lru_cache(maxsize=64)
def _parse_yaml(path: Path, mtime_ns: int, size: int) -> dict:
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_UniqueKeyLoader) or {}
    except _RepeatedKey as e:
        raise UserError(f"{path} gives the key {e.key!r} twice, at line {e.first} and at line {e.again} (YAML would "
                        "keep only the second); merge them into one") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise UserError(f"{path} is not valid YAML{at}: {problem}; fix the file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {path}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping at the top level")
    return data


def hyperparameter_name(key: str) -> str | None:
    """The name setting ``key`` goes by among the values a compiled round takes as an argument
    (methods/base.py `Hyperparams`): ``train.lr`` -> ``lr``, ``method.X`` -> ``X`` (its method says which of
    its options can be: `Algorithm.hyperparameter_names`); None for the settings a round bakes in. A list at
    such a key is a grid run in one program (runs/sweep.py)."""
    lr = _below().methods.base.LR
    section, _, name = key.partition(".")
    return name if section == "method" else lr if key == f"train.{lr}" else None


def take_sweep(mapping: dict, sweep: dict) -> dict:
    """``mapping`` without its list values at `hyperparameter_name` keys, which go to ``sweep`` (a later
    scalar for a key removes its list)."""
    out = {}
    for key, value in mapping.items():
        if key == "sweep":
            continue
        if isinstance(value, dict):
            kept = {}
            for name, v in value.items():
                dotted = f"{key}.{name}"
                if hyperparameter_name(dotted) is not None and isinstance(v, list):
                    sweep[dotted] = v
                    continue
                sweep.pop(dotted, None)
                kept[name] = v
            value = kept
        out[key] = value
    return out


def build(config_file: str | None = None, overrides: list[str] = (), base: dict | None = None,
          start: dict | None = None) -> RunConfig:
    """Defaults [<- ``start``, a saved config when resuming] <- YAML preset <- ``base``
    (e.g. command-line flags) <- dotted overrides. Lists at `hyperparameter_name` keys land in ``cfg.sweep``."""
    cfg = RunConfig()
    sweep: dict = dict((start or {}).get("sweep") or {})
    layers = [start] if start else []
    if config_file:
        layers.append(load_yaml(config_file))
    if base:
        layers.append(base)
    layers += [parse_override(text) for text in overrides]
    for layer in layers:
        apply_mapping(cfg, take_sweep(layer, sweep) if isinstance(layer, dict) else layer)
    cfg.sweep = sweep
    return cfg


def method_options(options_type, options: dict):
    """Instantiate a method's options dataclass from ``cfg.method``, checking names and types."""
    if options_type is None:
        if options:
            raise UserError(f"this method takes no options, got: {', '.join(options)}")
        return None
    hints = typing.get_type_hints(options_type)
    names = {f.name for f in dataclasses.fields(options_type)}
    kwargs = {}
    for key, value in options.items():
        if key not in names:
            raise UserError(f"unknown method option {key!r}; valid: {', '.join(sorted(names)) or 'none'}")
        kwargs[key] = _coerce(value, hints[key], f"method.{key}")
    return options_type(**kwargs)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def check_declared(cfg: RunConfig) -> None:
    """Every run setting against its declaration (type, range, choices)."""
    declared.check_fields(cfg, "")
    for section in SECTIONS:
        declared.check_fields(getattr(cfg, section), f"{section}.")


def drawn_data_seed(seed: int, data_seed: int | None) -> int:
    """The seed the data partition and generated data are drawn with: ``data_seed``, or ``seed`` where it is
    empty (its declaration)."""
    return seed if data_seed is None else data_seed


def partition_scheme(cfg: RunConfig) -> str:
    """partition.scheme of ``cfg``, 'auto' resolved as its declaration says: natural for a folder that brings its
    own clients (PFLlib's), else dirichlet (runs/experiment.py's `validate` records it in the configuration)."""
    if cfg.partition.scheme != AUTO:
        return cfg.partition.scheme
    return "natural" if cfg.data.name == "pfllib" else "dirichlet"


def check_partition_parameters(p: PartitionConfig, scheme: str) -> None:
    """An optional partition parameter set for a ``scheme`` that does not take it, or one the scheme needs left
    empty (data/partition.py's signatures say which scheme takes what)."""
    takes = {name: set(inspect.signature(fn).parameters) for name, fn in SCHEMES.items()}
    for field in dataclasses.fields(p):
        users = [s for s, params in takes.items() if field.name in params]
        if field.default is not None or not users:
            continue
        value = getattr(p, field.name)
        needed = (scheme in takes and field.name in takes[scheme]
                  and inspect.signature(SCHEMES[scheme]).parameters[field.name].default is inspect.Parameter.empty)
        _check(value is not None or not needed,
               f"partition.{field.name} is needed by partition.scheme={scheme}; set it")
        _check(value is None or scheme in users,
               f"partition.{field.name} applies to partition.scheme={' or '.join(users)} only, not {scheme!r}; "
               "leave it empty")


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (ValueError: a module set to None in sys.modules, i.e. blocked)
        return False


def validate_values(cfg: RunConfig) -> None:
    """Reject values that make no sense, whatever the entry point (one-line UserErrors): each setting
    against its declaration, then the rules between settings."""
    check_declared(cfg)
    for key, value in [*_flatten(to_dict(cfg)).items(), *((f"method.{k}", v) for k, v in cfg.method.items())]:
        check_float32(value, key)
    t, p, d = cfg.train, cfg.partition, cfg.data
    scheme = partition_scheme(cfg)
    check_partition_parameters(p, scheme)
    _check(t.lr_schedule == "exponential" or t.lr_decay == 1.0,
           "train.lr_decay applies to train.lr_schedule=exponential only; leave it at 1.0 with cosine")
    _check(scheme != "pfllib_dirichlet" or (p.test_from in ("split", "split_train") and not p.train_per_client
                                              and not p.test_per_client),
           "partition.scheme=pfllib_dirichlet splits each client's pool train_fraction / rest itself: it needs "
           "partition.test_from=split (or split_train) and no train_per_client / test_per_client")
    _check(d.synthetic_size_factor == 1 or d.name == "synthetic",
           f"data.synthetic_size_factor applies to data.name=synthetic only, not {d.name!r}; leave it at 1")
    _check(d.synthetic_samples_per_client is None or d.name == "synthetic",
           f"data.synthetic_samples_per_client applies to data.name=synthetic only, not {d.name!r}; leave it empty")
    _check(d.synthetic_samples_per_client is None or d.synthetic_size_factor == 1,
           "data.synthetic_size_factor scales the lognormal client sizes; with data.synthetic_samples_per_client "
           "set, leave it at 1")
    _check(not cfg.log.tensorboard or _installed("tensorboardX"), TENSORBOARD_MISSING)
    _check(t.augment == "none" or d.name != "synthetic",
           f"train.augment={t.augment} crops and flips images; data.name=synthetic has feature vectors: leave it none")
    _check(not (d.allow_download and d.data_dir and d.source == "files"),
           f"data.allow_download downloads into the cache folder, but --data-dir {d.data_dir} names the folder that "
           "must hold the files: put them there and leave out --download, or leave out --data-dir")


# What may differ between a run's segments (or between a run folder and the reproduce cell that finds it):
# where files are (the partition is compared instead) and whether they may be downloaded, how long it runs (rounds
# extend only), and how the same arithmetic is laid out on the machine (devices: checkpoints re-pad the client
# axis to any count; rounds per call; the client mapping: tests/test_engine.py holds the mappings equal).
RESUME_MAY_CHANGE = ("data.data_dir", "data.allow_download", "train.rounds", "out", "train.rounds_per_call",
                     "log.tensorboard", "devices.cpu", "train.client_mapping", "train.chunk_size")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "method":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def _option_defaults(method_name) -> dict:
    """{option: default} of a method's options (as config.json writes them); {} for an unknown method."""
    methods = _below().methods
    options = methods.get_method(method_name).hparams_type if method_name in methods.method_names() else None
    if options is None:
        return {}
    return {f.name: list(f.default) if isinstance(f.default, tuple) else f.default
            for f in dataclasses.fields(options) if f.default is not dataclasses.MISSING}


def resume_differences(saved: dict, new: dict) -> list[str]:
    """``'key: saved -> new'`` for each setting a resumed run would change, beyond RESUME_MAY_CHANGE.

    A key the saved config lacks (a run started before the key existed) counts as its default,
    the behaviour that run had; so does a method option it lacks."""
    saved, new = ({**c, "method": {**_option_defaults(c.get("method_name")), **(c.get("method") or {})}}
                  for c in (saved, new))
    a, b = {**_flatten(to_dict(RunConfig())), **_flatten(saved)}, _flatten(new)
    for flat in (a, b):  # an empty data_seed means `seed`: the same run
        flat["data_seed"] = drawn_data_seed(flat.get("seed"), flat.get("data_seed"))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if k not in RESUME_MAY_CHANGE and a.get(k) != b.get(k)]
