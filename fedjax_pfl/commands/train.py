"""The training command: ``python -m fedjax_pfl.train --method NAME [options] [key.sub=value ...]``.

Parses flags, a YAML preset (--config) and dotted overrides (in any order)
into a `RunConfig` (runs/config.py) and runs it: one run (runs/single_run.py)
or, with ``--seeds`` or lists of values, a sweep (runs/sweep.py); both go
through the one round loop (runs/loop.py). ``--method M --help`` adds M's
options (from its options dataclass). The run folder is locked for the
whole run (a second run on the same ``--out`` is refused at once) and never
one that holds files no run wrote (outputs/folder_claim.py). Exit statuses
(commands/command.py): 2 with one ``error:`` line for bad input; 130 after
Ctrl-C and 143 after SIGTERM, which stop after the round in flight with a
checkpoint and the summary (status "interrupted"; ``--resume`` continues
it); 1 for an internal error, its traceback in RUN/error.log.
"""

from __future__ import annotations

import argparse

from fedjax_pfl.core import declared
from fedjax_pfl.engine import distributed
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.options import describe
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs import host_devices
from fedjax_pfl.commands import open_files
from fedjax_pfl.commands.command import Command, OneLineParser, seed_list, split_overrides
from fedjax_pfl.runs.experiment import ValidRun, known_clients, validate
from fedjax_pfl.runs.resume import check_same_method, saved_run
from fedjax_pfl.runs.single_run import run_single
from fedjax_pfl.process.stop_request import StopRequest
from fedjax_pfl.runs.sweep import run_sweep

DEFAULT_NOTE = ("defaults: the FedAS paper's CIFAR-10 setting (the official files, else the project's JPEG copy "
                "cifar10_jpeg; fedavgcnn, 20 clients, Dirichlet 0.1, E=5, B=16, lr 0.005, join ratio 0.6, 40 rounds)")

def setting_flags() -> dict[str, tuple[str, object]]:
    """flag name (``num_clients`` for ``--num-clients``) -> (config key, declaration), for every run setting
    declared with a flag (runs/config.py)."""
    out = {}
    for key, info in config_lib.declarations():
        flag = info.spec.flag
        if flag:
            out[info.name if flag is True else flag] = (key, info)
    return out


def _flag_help(key: str, info) -> str:
    allowed = f" ({info.allowed})" if info.allowed else ""
    return f"{info.help}{allowed}; {key}, default {declared.shown(info.default)}"


def _add_setting(p: argparse.ArgumentParser, flag: str, key: str, info) -> None:
    name = "--" + flag.replace("_", "-")
    if info.type == "bool":
        p.add_argument(name, dest=flag, action="store_true", default=None, help=_flag_help(key, info))
        return
    kinds = {"int": int, "float": float, "list of int": seed_list}
    metavar = key.rsplit(".", 1)[-1].upper()
    p.add_argument(name, dest=flag, type=kinds.get(info.type.removesuffix(" or empty"), str), metavar=metavar,
                   help=_flag_help(key, info))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m fedjax_pfl.train",
        usage="%(prog)s [options] [key.sub=value ...]",
        description="Run a personalized federated learning method. " + DEFAULT_NOTE + ".",
        epilog="overrides (anywhere among the options): dotted config keys, e.g. method.mu=0.01 train.lr=0.1\n"
        "a method's own options: --method NAME --help; every key: the configuration reference",
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False,
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help (with --method: also its options)")
    p.add_argument("--config", help="YAML preset, e.g. configs/fedas_cifar10.yaml")
    for flag, (key, info) in setting_flags().items():
        _add_setting(p, flag, key, info)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--start-over", action="store_true",
                   help="start the run in --out afresh in place, replacing the run it holds (e.g. one stopped before "
                        "its first checkpoint was complete, which --resume cannot continue)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--distributed", action="store_true",
                   help="several processes through jax.distributed (automatic under SLURM srun or mpirun)")
    p.add_argument("--coordinator", help="HOST:PORT of process 0, for --distributed without a cluster launcher")
    p.add_argument("--num-processes", type=int, help="process count, for --distributed without a launcher")
    p.add_argument("--process-id", type=int, help="this process's index, for --distributed without a launcher")
    p.add_argument("--heartbeat-timeout", type=int, default=distributed.HEARTBEAT_TIMEOUT_S, metavar="SECONDS",
                   help="with several processes: how long a silent process takes to count as lost, so that the "
                        "others stop with a checkpoint kept (default %(default)s)")
    return p


def parse_args(argv=None):
    """-> (options, dotted overrides); overrides may stand anywhere among the options."""
    args, rest = build_parser().parse_known_args(argv)
    return args, split_overrides(rest)


def method_help(name: str) -> str:
    """A method's summary line and its options (name, type, default, allowed values, help), from its
    options dataclass (methods/options.py: one declaration serves the checks, this text and config.json)."""
    method = get_method(name)
    summary = " ".join(method.doc.strip().split("\n\n")[0].split())
    options = describe(method.hparams_type)
    lines = [f"method {name}: {summary}".rstrip()]
    if not options:
        return "\n".join([*lines, "  (no options)"]) + "\n"
    shown = declared.shown
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
    for flag, (key, _) in setting_flags().items():
        value = getattr(args, flag)
        if value is not None:
            node = base
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    cfg = config_lib.build(args.config, overrides, base)
    if args.resume:
        saved = saved_run(cfg.out, cfg)
        cfg = config_lib.build(args.config, overrides, base, start=saved["config"])
        check_same_method(saved, cfg.method_name, cfg.out)
    return cfg


def run(cfg: config_lib.RunConfig, progress: bool = True, resume: bool = False, observe=None,
        stop: StopRequest | None = None, start_over: bool = False) -> dict:
    """Run one configuration end to end (a sweep when it lists seeds or values); returns the summary.

    ``observe(rounds_done)``: called after every compiled call (runs/loop.py); ``stop``: the Ctrl-C and
    SIGTERM handling (process/stop_request.py; its ``requested`` says afterwards whether one came);
    ``start_over``: replace the run the output folder holds.
    """
    return run_settled(settle(cfg), progress, resume, observe, stop, start_over)


def run_settled(run: ValidRun, progress: bool = True, resume: bool = False, observe=None,
                stop: StopRequest | None = None, start_over: bool = False) -> dict:
    """`run` of the record `settle` made (the command settles once, to name its folder first)."""
    cfg = run.checked
    host_devices.apply(cfg.devices.cpu, known_clients(cfg))  # before JAX starts (if it has not: else left as is)
    if run.points:  # several runs as federations of one program
        open_files.ensure(len(run.points), cfg.log.tensorboard)
        return run_sweep(run, progress, resume, observe, stop, start_over)
    return run_single(run, progress, resume, observe, stop, start_over)


def settle(cfg: config_lib.RunConfig) -> ValidRun:
    """The one place the library validates a configuration (`validate`: names resolved, values checked, output
    folder and data folder fixed); everything after takes the record it returns."""
    return validate(cfg)


def main(argv=None, observe=None) -> int:
    """The command: exit 0 when the run finished, 2 on bad input, 130 on Ctrl-C and 143 on SIGTERM (also when
    the run could finish its last round), 1 on an internal error (its traceback in RUN/error.log;
    commands/command.py).

    ``observe(rounds_done)`` is called after every compiled call (see `run`).
    """
    command = Command("interrupted; nothing more was written (a run with checkpoints continues with --resume)",
                      own_process=argv is None)

    def body() -> int:
        args, overrides = parse_args(argv)
        if args.help:
            print(build_parser().format_help() + ("\n" + method_help(args.method) if args.method else ""), end="")
            return 0
        host_devices.check_environment()  # JAX_PLATFORMS, XLA_FLAGS: before JAX starts
        distributed.start(args.distributed, args.coordinator, args.num_processes, args.process_id,
                          heartbeat_timeout_s=args.heartbeat_timeout)
        cfg = config_from_args(args, overrides)
        if cfg.seeds or cfg.sweep:  # before its runs are expanded and checked one by one
            open_files.ensure(open_files.sweep_runs(cfg), cfg.log.tensorboard)
        run = settle(cfg)
        command.folder = run.out
        stop = StopRequest()
        command.output.stop = stop
        run_settled(run, progress=not args.no_progress, resume=args.resume, observe=observe, stop=stop,
                    start_over=args.start_over)
        return stop.exit_status if stop.requested else 0

    return command.run(body)
