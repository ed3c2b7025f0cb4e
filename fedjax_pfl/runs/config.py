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
import math
import typing
from pathlib import Path
from typing import Any

import yaml

from fedjax_pfl.core.errors import UserError


@dataclasses.dataclass
class DataConfig:
    name: str = "cifar10"
    data_dir: str | None = None
    allow_download: bool = False
    source: str = "files"  # or 'tfds'
    synthetic_size_factor: int = 1  # synthetic: client sizes x this (FedProx: 1; pFedKD-WCL's authors' generator: 5)
    normalization: str = "dataset"  # 'dataset': its per-channel mean/std; 'half': (x/255 - 0.5) / 0.5 (PFLlib's data)


@dataclasses.dataclass
class PartitionConfig:
    scheme: str = "dirichlet"  # iid | dirichlet | pfllib_dirichlet | pathological | practical | client_dirichlet | natural
    num_clients: int = 20
    alpha: float = 0.1  # Dirichlet concentration
    min_size: int = 10  # dirichlet: fewest samples per client (pfllib_dirichlet: PFLlib's least_samples)
    classes_per_client: int = 2
    num_groups: int = 5
    dominant_classes_per_group: int = 2
    uniform_fraction: float = 0.2
    samples_per_client: int | None = None  # practical scheme
    train_fraction: float = 0.75  # per-client split of the merged pool
    train_per_client: int | None = None  # fixed sizes (DiversiFed, FedPAC)
    test_per_client: int | None = None
    test_from: str = "split"  # 'split' (per-client split of train+test) | 'split_train' (of the train set only) | 'official'
    val_fraction: float = 0.0  # of each client's train split held out as validation data (picks grid points)
    max_classes_per_client: int | None = None  # (client_)dirichlet: keep only each client's k largest classes (pFedKD-WCL)
    size_range: tuple[int, ...] | None = None  # client_dirichlet: client sizes floor(linspace(lo, hi, num_clients))


@dataclasses.dataclass
class TrainConfig:
    rounds: int = 40
    local_epochs: int = 5
    batch_size: int = 16
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.005
    momentum: float = 0.0
    weight_decay: float = 0.0
    join_ratio: float = 0.6
    straggler_fraction: float = 0.0
    drop_fraction: float = 0.0
    client_mapping: str = "auto"
    chunk_size: int = 8
    share_batch_stats: bool = True
    rounds_per_call: int = 0  # rounds fused into one compiled call; 0: auto (calls of about 2 s)
    lr_schedule: str = "exponential"  # per round t: 'exponential' lr * lr_decay**t | 'cosine' lr * (1 + cos(pi t / rounds)) / 2
    lr_decay: float = 1.0  # exponential factor per round (1.0: constant lr; PFAKD's authors: 0.9)
    persistent_optimizer: bool = False  # optimizer state of the parts a client keeps survives across rounds
    drop_last: bool = False  # drop each epoch's last partial train batch (PyTorch DataLoader drop_last)
    augment: str = "none"  # training-batch augmentation: none | crop_flip (pad 4, random crop, flip; kernels/augmentation.py)
    max_experiments_per_call: int = 0  # seeds/grid points vmapped in one program; 0: as many as fit in memory
    all_clients_train: bool = False  # every client trains each round; only the sampled ones are aggregated (pFedMe code)
    precision: str = "fp32"  # fp32 | bf16: bf16 activations and matmul inputs, float32 parameters, optimizer, losses


@dataclasses.dataclass
class ModelConfig:
    name: str = "fedavgcnn"
    conv_impl: str = "auto"  # direct | im2col | native | pallas (auto: direct on CPU and GPU, never pallas); direct: Dense grads too
    hidden: tuple[int, ...] | None = None  # MLP hidden sizes
    init: str = "flax"  # where parameters start: 'flax' (Flax's defaults) | 'torch' (PyTorch's defaults, the papers' code)


@dataclasses.dataclass
class EvalConfig:
    # Whose model each client is evaluated with: 'auto' takes the method's documented
    # default (what its authors evaluate); shared-body methods also take 'local' (the
    # client's model after its own last training) or 'global' (the current global
    # body with the client's own head, the model it holds after receiving the body).
    model: str = "auto"


@dataclasses.dataclass
class LogConfig:
    tensorboard: bool = False  # TensorBoard event files in the run folder (needs tensorboardX)


@dataclasses.dataclass
class DevicesConfig:
    # host (CPU) devices JAX makes before it starts, the clients split over them: 'auto' (one per core, or
    # a count set by XLA_FLAGS / JAX_NUM_CPU_DEVICES) or a number (runs/host_devices.py)
    cpu: str = "auto"


@dataclasses.dataclass
class RunConfig:
    method_name: str = "fedas"
    method: dict[str, Any] = dataclasses.field(default_factory=dict)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    partition: PartitionConfig = dataclasses.field(default_factory=PartitionConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    devices: DevicesConfig = dataclasses.field(default_factory=DevicesConfig)
    seed: int = 0
    data_seed: int | None = None  # seed of the data partition (and generated data); empty: `seed`
    seeds: tuple[int, ...] = ()  # several seeds in one vmapped program (runs/sweep.py); empty: just `seed`
    vary_data_with_seed: bool = False  # with `seeds`: each seed draws its own partition (shapes must agree)
    sweep: dict[str, Any] = dataclasses.field(default_factory=dict)  # 'train.lr' / 'method.X' -> list of values
    eval_every: int = 1
    checkpoint_every: int = 0  # rounds between checkpoints of server and client state (0: never)
    out: str | None = None


# Numbers reach the compiled program as int32 / float32: larger ones are refused here, with a one-line
# error, instead of overflowing inside JAX.
MAX_WHOLE = 2**31 - 1
MAX_FLOAT = 3.4028234663852886e38  # float32's largest


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


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


@functools.lru_cache(maxsize=64)
def _parse_yaml(path: Path, mtime_ns: int, size: int) -> dict:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
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


SWEEPABLE = ("train.lr", "method.")  # keys whose value may be a list: a grid run in one program (runs/sweep.py)


def take_sweep(mapping: dict, sweep: dict) -> dict:
    """``mapping`` without its list values at SWEEPABLE keys, which go to ``sweep`` (a later
    scalar for a key removes its list)."""
    out = {}
    for key, value in mapping.items():
        inner = value if isinstance(value, dict) else None
        if key == "train" and inner is not None and "lr" in inner:
            inner = dict(inner)
            lr = inner.pop("lr")
            if isinstance(lr, list):
                sweep["train.lr"] = lr
            else:
                sweep.pop("train.lr", None)
                inner["lr"] = lr
            value = inner
        elif key == "method" and inner is not None:
            value = {}
            for name, v in inner.items():
                if isinstance(v, list):
                    sweep[f"method.{name}"] = v
                else:
                    sweep.pop(f"method.{name}", None)
                    value[name] = v
        elif key == "sweep":
            continue
        out[key] = value
    return out


def build(config_file: str | None = None, overrides: list[str] = (), base: dict | None = None,
          start: dict | None = None) -> RunConfig:
    """Defaults [<- ``start``, a saved config when resuming] <- YAML preset <- ``base``
    (e.g. command-line flags) <- dotted overrides. Lists at SWEEPABLE keys land in ``cfg.sweep``."""
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


def validate_values(cfg: RunConfig) -> None:
    """Reject values that make no sense, whatever the entry point (one-line UserErrors)."""
    from fedjax_pfl.engine.client_mapping import MAPPINGS
    from fedjax_pfl.models.initialization import INITS
    from fedjax_pfl.data.dataset import NORMALIZATIONS
    from fedjax_pfl.kernels.augmentation import AUGMENTATIONS
    from fedjax_pfl.runs.host_devices import parse as parse_devices
    from fedjax_pfl.models.conv import CONV_IMPLS
    from fedjax_pfl.models.precision import PRECISIONS

    t, p = cfg.train, cfg.partition
    for name in ("rounds", "local_epochs", "batch_size", "chunk_size"):
        _check(getattr(t, name) >= 1, f"train.{name} must be >= 1, got {getattr(t, name)}")
    _check(math.isfinite(t.lr) and t.lr > 0, f"train.lr must be a number > 0, got {t.lr}")
    _check(t.optimizer in ("sgd", "adam"), f"train.optimizer must be 'sgd' or 'adam', got {t.optimizer!r}")
    _check(t.lr_schedule in ("exponential", "cosine"),
           f"train.lr_schedule must be 'exponential' or 'cosine', got {t.lr_schedule!r}")
    _check(math.isfinite(t.lr_decay) and 0 < t.lr_decay <= 1, f"train.lr_decay must be in (0, 1], got {t.lr_decay}")
    _check(t.lr_schedule == "exponential" or t.lr_decay == 1.0,
           "train.lr_decay applies to train.lr_schedule=exponential only; leave it at 1.0 with cosine")
    _check(p.max_classes_per_client is None or p.max_classes_per_client >= 1,
           f"partition.max_classes_per_client must be >= 1 (or empty), got {p.max_classes_per_client}")
    _check(p.max_classes_per_client is None or p.scheme in ("dirichlet", "client_dirichlet"),
           "partition.max_classes_per_client applies to partition.scheme=dirichlet or client_dirichlet only, "
           f"not {p.scheme!r}; leave it empty")
    _check((p.size_range is not None) == (p.scheme == "client_dirichlet"),
           "partition.size_range=[smallest, largest] is needed by partition.scheme=client_dirichlet and by no "
           f"other scheme (scheme {p.scheme!r}, size_range {p.size_range})")
    _check(p.size_range is None or (len(p.size_range) == 2 and 1 <= p.size_range[0] <= p.size_range[1]),
           f"partition.size_range must be [smallest, largest] with 1 <= smallest <= largest, got {p.size_range}")
    _check(p.scheme != "pfllib_dirichlet" or (p.test_from in ("split", "split_train") and not p.train_per_client
                                              and not p.test_per_client),
           "partition.scheme=pfllib_dirichlet splits each client's pool train_fraction / rest itself: it needs "
           "partition.test_from=split (or split_train) and no train_per_client / test_per_client")
    _check(p.test_from in ("split", "split_train", "official"),
           f"partition.test_from must be 'split', 'split_train' or 'official', got {p.test_from!r}")
    _check(cfg.data.normalization in NORMALIZATIONS,
           f"data.normalization must be one of {', '.join(NORMALIZATIONS)}, got {cfg.data.normalization!r}")
    _check(cfg.data.synthetic_size_factor >= 1, f"data.synthetic_size_factor must be >= 1, got {cfg.data.synthetic_size_factor}")
    _check(cfg.data.synthetic_size_factor == 1 or cfg.data.name == "synthetic",
           f"data.synthetic_size_factor applies to data.name=synthetic only, not {cfg.data.name!r}; leave it at 1")
    _check(t.augment in AUGMENTATIONS, f"train.augment must be one of {', '.join(AUGMENTATIONS)}, got {t.augment!r}")
    _check(t.augment == "none" or cfg.data.name != "synthetic",
           f"train.augment={t.augment} crops and flips images; data.name=synthetic has feature vectors: leave it none")
    _check(cfg.model.init in INITS, f"model.init must be one of {', '.join(INITS)}, got {cfg.model.init!r}")
    _check(t.precision in PRECISIONS, f"train.precision must be one of {', '.join(PRECISIONS)}, got {t.precision!r}")
    _check(cfg.model.conv_impl in ("auto", *CONV_IMPLS),
           f"model.conv_impl must be one of auto, {', '.join(CONV_IMPLS)}, got {cfg.model.conv_impl!r}")
    _check(0 <= t.momentum < 1, f"train.momentum must be in [0, 1), got {t.momentum}")
    _check(math.isfinite(t.weight_decay) and t.weight_decay >= 0,
           f"train.weight_decay must be >= 0, got {t.weight_decay}")
    _check(0 < t.join_ratio <= 1, f"train.join_ratio must be in (0, 1], got {t.join_ratio}")
    for name in ("straggler_fraction", "drop_fraction"):
        _check(0 <= getattr(t, name) <= 1, f"train.{name} must be in [0, 1], got {getattr(t, name)}")
    mappings = ("auto", *MAPPINGS)
    _check(t.client_mapping in mappings,
           f"unknown client mapping {t.client_mapping!r}; choose one of: {', '.join(mappings)}")
    _check(p.num_clients >= 1, f"partition.num_clients must be >= 1, got {p.num_clients}")
    _check(math.isfinite(p.alpha) and p.alpha > 0, f"partition.alpha must be > 0, got {p.alpha}")
    _check(p.classes_per_client >= 1, f"partition.classes_per_client must be >= 1, got {p.classes_per_client}")
    _check(p.min_size >= 0, f"partition.min_size must be >= 0, got {p.min_size}")
    _check(0 < p.train_fraction < 1, f"partition.train_fraction must be in (0, 1), got {p.train_fraction}")
    _check(0 <= p.uniform_fraction <= 1, f"partition.uniform_fraction must be in [0, 1], got {p.uniform_fraction}")
    _check(cfg.eval_every >= 1, f"eval_every must be >= 1, got {cfg.eval_every}")
    _check(cfg.checkpoint_every >= 0, f"checkpoint_every must be >= 0 (0: never), got {cfg.checkpoint_every}")
    _check(cfg.seed >= 0, f"seed must be >= 0, got {cfg.seed}")
    _check(cfg.data_seed is None or cfg.data_seed >= 0, f"data_seed must be >= 0, got {cfg.data_seed}")
    _check(all(s >= 0 for s in cfg.seeds) and len(set(cfg.seeds)) == len(cfg.seeds),
           f"seeds must be distinct numbers >= 0, got {list(cfg.seeds)}")
    _check(0 <= p.val_fraction < 1, f"partition.val_fraction must be in [0, 1), got {p.val_fraction}")
    _check(t.rounds_per_call >= 0, f"train.rounds_per_call must be >= 0 (0: auto), got {t.rounds_per_call}")
    _check(t.max_experiments_per_call >= 0,
           f"train.max_experiments_per_call must be >= 0 (0: as many as fit), got {t.max_experiments_per_call}")
    parse_devices(cfg.devices.cpu)


# Keys a resumed run may change: where the data lives (the partition is compared
# instead), whether it may be downloaded, and the number of rounds (extend only); the host device count
# (checkpoints re-pad the client axis to any count).
# What may differ between a run's segments (or between a run folder and the reproduce cell that finds it):
# where files are, how long it runs, and how the same arithmetic is laid out on the machine (devices,
# rounds per call, the client mapping: tests/test_engine.py holds the mappings equal).
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


def resume_differences(saved: dict, new: dict) -> list[str]:
    """``'key: saved -> new'`` for each setting a resumed run would change, beyond RESUME_MAY_CHANGE.

    A key the saved config lacks (a run started before the key existed) counts as its default,
    the behaviour that run had."""
    a, b = {**_flatten(to_dict(RunConfig())), **_flatten(saved)}, _flatten(new)
    for flat in (a, b):  # an empty data_seed means `seed`: the same run
        if flat.get("data_seed") is None:
            flat["data_seed"] = flat.get("seed")
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if k not in RESUME_MAY_CHANGE and a.get(k) != b.get(k)]
