"""The training command: ``python -m fedjax_pfl.train --method NAME [options] [key.sub=value ...]``.

Parses flags, a YAML preset (--config) and dotted overrides (in any order)
into a `RunConfig` (runs/config.py) and runs it: one run (runs/single_run.py)
or, with ``--seeds`` or lists of values, a sweep (runs/sweep.py); both go
through the one round loop (runs/loop.py). ``--method M --help`` adds M's
options (from its options dataclass). Exit statuses (runs/command.py): 2
with one ``error:`` line for bad input; 130 after Ctrl-C, which stops after
the round in flight with a checkpoint and the summary (status
"interrupted"; ``--resume`` continues it); 1 for an internal error, its
traceback in RUN/error.log.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedjax_pfl.engine import distributed
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs import host_devices
from fedjax_pfl.runs.command import INTERRUPTED, Command, OneLineParser, seed_list, split_overrides
from fedjax_pfl.runs.experiment import validate
from fedjax_pfl.outputs.output_folder import default_run_folder
from fedjax_pfl.runs.resume import saved_run
from fedjax_pfl.runs.single_run import run_single
from fedjax_pfl.runs.stop_request import StopRequest
from fedjax_pfl.runs.sweep import run_sweep

DEFAULT_NOTE = "defaults: the FedAS paper's CIFAR-10 setting (fedavgcnn, 20 clients, Dirichlet 0.1, E=5, B=16, lr 0.005, join ratio 0.6, 40 rounds)"

# flag -> dotted config key
FLAGS = {
    "dataset": "data.name", "data_dir": "data.data_dir", "partition": "partition.scheme",
    "num_clients": "partition.num_clients", "alpha": "partition.alpha",
    "classes_per_client": "partition.classes_per_client", "join_ratio": "train.join_ratio",
    "rounds": "train.rounds", "local_epochs": "train.local_epochs", "batch_size": "train.batch_size",
    "lr": "train.lr", "optimizer": "train.optimizer", "momentum": "train.momentum",
    "weight_decay": "train.weight_decay", "model": "model.name", "seed": "seed",
    "eval_every": "eval_every", "out": "out", "checkpoint_every": "checkpoint_every", "client_mapping": "train.client_mapping",
    "eval_model": "eval.model",
    "tensorboard": "log.tensorboard",
    "rounds_per_call": "train.rounds_per_call", "seeds": "seeds", "cpu_devices": "devices.cpu",
}


def build_parser() -> argparse.ArgumentParser:
    from fedjax_pfl.data.registry import dataset_names
    from fedjax_pfl.methods import method_names
    from fedjax_pfl.models.networks import model_names

    p = OneLineParser(
        prog="python -m fedjax_pfl.train",
        usage="%(prog)s [options] [key.sub=value ...]",
        description="Run a personalized federated learning method. " + DEFAULT_NOTE + ".",
        epilog=f"methods: {', '.join(method_names())}\ndatasets: {', '.join(dataset_names())}\n"
        f"models: {', '.join(model_names())}\npartitions: iid, dirichlet, pathological, practical, natural\n"
        "overrides (anywhere among the options): dotted config keys, e.g. method.mu=0.01 train.lr=0.1\n"
        "a method's own options: --method NAME --help",
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False,
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help (with --method: also its options)")
    p.add_argument("--method", help="method name (see the list below)")
    p.add_argument("--config", help="YAML preset, e.g. configs/fedas_cifar10.yaml")
    p.add_argument("--dataset")
    p.add_argument("--data-dir", help="folder with dataset files (else $FEDJAX_PFL_DATA_DIR, then the cache)")
    p.add_argument("--offline", action="store_true", help="never download a missing dataset file")
    p.add_argument("--partition", help="iid | dirichlet | pfllib_dirichlet | pathological | practical | client_dirichlet | natural")
    p.add_argument("--alpha", type=float, help="Dirichlet concentration")
    p.add_argument("--classes-per-client", type=int)
    p.add_argument("--num-clients", type=int)
    p.add_argument("--join-ratio", type=float)
    p.add_argument("--rounds", type=int)
    p.add_argument("--local-epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--optimizer", help="sgd | adam")
    p.add_argument("--momentum", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--model")
    p.add_argument("--seed", type=int)
    p.add_argument("--seeds", type=seed_list,
                   help="several seeds run as one vmapped program, e.g. 0,1,2,3,4 (a run folder each under --out)")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-model", help="whose model each client is evaluated with: auto (the method's default), "
                   "global or local (shared-body methods)")
    p.add_argument("--client-mapping", help="auto | vmap | map | chunked | packed | packed:W (W lanes)")
    p.add_argument("--cpu-devices", help="host devices on a CPU, the clients split over them: auto (one per core) "
                   "or a number")
    p.add_argument("--out", help="output folder (default runs/<method>-<dataset>-<time>)")
    p.add_argument("--checkpoint-every", type=int, help="save server and client state every K rounds (0: never)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--tensorboard", action="store_true", default=None,
                   help="also write TensorBoard event files into the run folder (needs tensorboardX)")
    p.add_argument("--rounds-per-call", type=int,
                   help="rounds fused into one compiled call (0: auto, calls of about 2 s)")
    p.add_argument("--distributed", action="store_true",
                   help="several processes through jax.distributed (automatic under SLURM srun or mpirun)")
    p.add_argument("--coordinator", help="HOST:PORT of process 0, for --distributed without a cluster launcher")
    p.add_argument("--num-processes", type=int, help="process count, for --distributed without a launcher")
    p.add_argument("--process-id", type=int, help="this process's index, for --distributed without a launcher")
    return p


def parse_args(argv=None):
    """-> (options, dotted overrides); overrides may stand anywhere among the options."""
    args, rest = build_parser().parse_known_args(argv)
    return args, split_overrides(rest)


def method_help(name: str) -> str:
    """A method's summary line and its options (name, type, default, allowed values, help), from its
    options dataclass (methods/options.py: one declaration serves the checks, this text and config.json)."""
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.methods.options import describe

    method = get_method(name)
    summary = " ".join((sys.modules[method.__module__].__doc__ or "").strip().split("\n\n")[0].split())
    options = describe(method.hparams_type)
    lines = [f"method {name}: {summary}".rstrip()]
    if not options:
        return "\n".join([*lines, "  (no options)"]) + "\n"
    shown = lambda v: "empty" if v is None else str(v).lower() if isinstance(v, bool) else v  # noqa: E731 (as YAML)
    lines.append(f"options (set with method.NAME=VALUE, e.g. method.{options[0].name}={shown(options[0].default)}):")
    width = max(len(o.name) for o in options)
    for o in options:
        allowed = f"; {o.allowed}" if o.allowed else ""
        lines.append(f"  {o.name:<{width}}  {o.type}, default {shown(o.default)}{allowed}")
        lines.append(f"  {'':<{width}}  {o.help}")
    return "\n".join(lines) + "\n"


def config_from_args(args, overrides=()) -> config_lib.RunConfig:
    """The run's config from flags, preset and overrides; with --resume, on top of the saved config."""
    base: dict = {}
    for flag, key in FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            node = base
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    if args.method:
        base["method_name"] = args.method
    if args.offline:
        base.setdefault("data", {})["allow_download"] = False
    if (args.dataset == "pfllib" and args.partition is None and not args.config
            and not any(o.startswith("partition.scheme=") for o in overrides)):
        base.setdefault("partition", {})["scheme"] = "natural"  # a PFLlib folder is its own partition
    cfg = config_lib.build(args.config, overrides, base)
    if args.resume:
        cfg = config_lib.build(args.config, overrides, base, start=saved_run(cfg.out, cfg)["config"])
    if not args.offline and "allow_download" not in base.get("data", {}) and not args.config:
        cfg.data.allow_download = True
    return cfg


def run(cfg: config_lib.RunConfig, progress: bool = True, resume: bool = False, observe=None,
        stop: StopRequest | None = None) -> dict:
    """Run one configuration end to end (a sweep when it lists seeds or values); returns the summary.

    ``observe(rounds_done)``: called after every compiled call (runs/loop.py); ``stop``: the Ctrl-C
    handling (runs/stop_request.py; its ``requested`` says afterwards whether Ctrl-C was pressed).
    """
    settle(cfg)
    host_devices.apply(cfg.devices.cpu)  # before JAX starts (if it has not: else left as is)
    if cfg.seeds or cfg.sweep:  # several runs in one vmapped program
        return run_sweep(cfg, progress, resume, observe, stop)
    return run_single(cfg, progress, resume, observe, stop)


def settle(cfg: config_lib.RunConfig) -> None:
    """Validate ``cfg`` (names resolved in place) and fix its output folder (default: runs/<method>-<data>-<time>)."""
    validate(cfg)
    kind = "sweep" if cfg.seeds or cfg.sweep else ""
    cfg.out = cfg.out or str(default_run_folder(cfg.method_name, cfg.data.name, kind))


def main(argv=None, observe=None) -> int:
    """The command: exit 0 when the run finished, 2 on bad input, 130 on Ctrl-C (also when the run could
    finish its last round), 1 on an internal error (its traceback in RUN/error.log; runs/command.py).

    ``observe(rounds_done)`` is called after every compiled call (see `run`).
    """
    command = Command("interrupted; nothing more was written (a run with checkpoints continues with --resume)")

    def body() -> int:
        args, overrides = parse_args(argv)
        if args.help:
            print(build_parser().format_help() + ("\n" + method_help(args.method) if args.method else ""), end="")
            return 0
        distributed.start(args.distributed, args.coordinator, args.num_processes, args.process_id)
        cfg = config_from_args(args, overrides)
        settle(cfg)
        command.folder = Path(cfg.out)
        stop = StopRequest()
        run(cfg, progress=not args.no_progress, resume=args.resume, observe=observe, stop=stop)
        return INTERRUPTED if stop.requested else 0

    return command.run(body)
