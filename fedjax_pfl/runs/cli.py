"""Command line: ``python -m fedjax_pfl.train --method NAME [options] [key.sub=value ...]``.

Builds the run from flags, a YAML preset (--config) and dotted overrides (in
any order), loads and partitions the data, runs the rounds with a progress
bar, and writes the output folder (run_output.py). User errors print one line
and exit 2. Ctrl-C stops after the round in flight, writes a checkpoint and
the summary (status "interrupted") and exits 130; ``--resume`` continues it.

A non-finite training loss is caught without a host sync per round: each
round's metrics stay on the device until the next evaluation or checkpoint,
when they are read in one transfer and checked (`check_rounds`), naming the
first bad round and its clients.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from fedjax_pfl.engine import checkpoint
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.engine import distributed
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.runs import run_output
from fedjax_pfl.core.errors import DivergedError, UserError
from fedjax_pfl.runs.call_planner import CallPlanner
from fedjax_pfl.runs.progress import progress_bar
from fedjax_pfl.runs.results_writer import ResultsWriter
from fedjax_pfl.runs.stop_request import StopRequest

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
    "rounds_per_call": "train.rounds_per_call", "seeds": "seeds",
}
# Test hook: "ROUND:SIGNAL" (e.g. "2:KILL") sends the signal to this process once that round has been
# dispatched, before its checks, evaluation and checkpoint (as a Ctrl-C or kill arriving mid-round).
TEST_SIGNAL_ENV = "FEDJAX_PFL_TEST_SIGNAL_AFTER_ROUND"


def _seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated whole numbers, got {text!r}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (through main), instead of usage + message
        raise UserError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    from fedjax_pfl.data.registry import dataset_names
    from fedjax_pfl.methods import method_names
    from fedjax_pfl.models.networks import model_names

    p = _Parser(
        prog="python -m fedjax_pfl.train",
        usage="%(prog)s [options] [key.sub=value ...]",
        description="Run a personalized federated learning method. " + DEFAULT_NOTE + ".",
        epilog=f"methods: {', '.join(method_names())}\ndatasets: {', '.join(dataset_names())}\n"
        f"models: {', '.join(model_names())}\npartitions: iid, dirichlet, pathological, practical, natural\n"
        "overrides (anywhere among the options): dotted config keys, e.g. method.mu=0.01 train.lr=0.1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--method", help="method name (see the list below)")
    p.add_argument("--config", help="YAML preset, e.g. configs/fedas_cifar10.yaml")
    p.add_argument("--dataset")
    p.add_argument("--data-dir", help="folder with dataset files (else $FEDJAX_PFL_DATA_DIR, then the cache)")
    p.add_argument("--offline", action="store_true", help="never download a missing dataset file")
    p.add_argument("--partition", help="iid | dirichlet | pathological | practical | natural")
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
    p.add_argument("--seeds", type=_seed_list,
                   help="several seeds run as one vmapped program, e.g. 0,1,2,3,4 (a run folder each under --out)")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-model", help="whose model each client is evaluated with: auto (the method's default), "
                   "global or local (shared-body methods)")
    p.add_argument("--client-mapping", help="auto | vmap | map | chunked")
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
    overrides = [t for t in rest if "=" in t and not t.startswith("-")]
    unknown = [t for t in rest if t not in overrides]
    if unknown:
        raise UserError(f"unrecognized arguments: {' '.join(unknown)} (see --help; overrides look like key.sub=value)")
    return args, overrides


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
        cfg = config_lib.build(args.config, overrides, base, start=saved_run(output_folder(cfg), cfg)["config"])
    if not args.offline and "allow_download" not in base.get("data", {}) and not args.config:
        cfg.data.allow_download = True
    return cfg


def output_folder(cfg) -> Path:
    return Path(cfg.out or f"runs/{cfg.method_name}-{cfg.data.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def saved_run(out: Path, cfg=None) -> dict:
    """The config.json of the run in ``out`` (to resume it), or UserError."""
    if cfg is not None and not cfg.out:
        raise UserError("--resume needs --out FOLDER, the folder of the run to continue")
    saved = run_output.read_json(out / "config.json")
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        raise UserError(f"nothing to resume in {out} (no readable config.json); run without --resume to start afresh")
    return saved


def check_output_folder(out: Path, resume: bool) -> None:
    """Fail before any work when ``out`` cannot hold this run."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; choose another --out")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--out {out} lies under {existing}, which is a file; choose another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write in {existing} (permission denied or read-only); choose another --out")
    if not resume and ((out / "metrics.jsonl").exists() or (out / "config.json").exists()):
        raise UserError(f"{out} already holds a run; choose another --out, remove it, or continue it with --resume")


def check_same_config(saved: dict, cfg) -> None:
    """A resumed run must use the configuration it was started with (train.rounds may grow)."""
    changed = config_lib.resume_differences(saved["config"], config_lib.to_dict(cfg))
    if changed:
        raise UserError(f"--resume must use the configuration the run was started with; changed: {'; '.join(changed)}"
                        " (only train.rounds may grow)")


def check_resume(saved: dict, cfg, done: int, partition_now: dict, partition_saved) -> list[dict]:
    """Checks a resume against what the run was started with -> the updated resume history."""
    check_same_config(saved, cfg)
    before = saved["config"]["train"]["rounds"]
    rounds = cfg.train.rounds
    if cfg.train.lr_schedule == "cosine" and rounds != before:
        raise UserError(f"a cosine lr schedule spans the run's {before} rounds; it cannot be extended to {rounds}")
    if done >= rounds - 1:
        if rounds == before:
            raise UserError(f"the run in {cfg.out} already finished its {rounds} rounds; to extend it, "
                            f"pass a larger --rounds with --resume")
        raise UserError(f"the checkpoint is after round {done + 1}; --rounds must be more than {done + 1}")
    if partition_saved is not None and run_output.as_json(partition_now) != partition_saved:
        raise UserError("the data give a different partition than the run was started with; resume with the same "
                        "dataset files")
    return [*saved.get("resumed", []), {"after_round": done, "rounds_before": before, "rounds": rounds}]


def first_bad_round(records: list[dict]):
    """(round, client ids) of the first non-finite client training loss, or None.

    ``records``: host per-round metrics, each with 'round', 'client_loss' [S]
    and 'selected' [S] (the engine's round metrics).
    """
    for r in records:
        bad = ~np.isfinite(np.asarray(r["client_loss"]))
        if bad.any():
            return int(r["round"]), [int(c) for c in np.asarray(r["selected"])[bad]]
    return None


def check_rounds(records: list[dict]) -> list[dict]:
    """Reads per-round device metrics in one transfer; DivergedError at the first non-finite loss."""
    host = jax.device_get(records)
    bad = first_bad_round(host)
    if bad is not None:
        t, clients = bad
        raise DivergedError(f"round {t}: training loss is not finite for client(s) {', '.join(map(str, clients))}; "
                            "lower the learning rate (--lr) or check the data normalisation")
    return host


def _test_signal(t: int) -> None:
    spec = os.environ.get(TEST_SIGNAL_ENV, "")
    if spec and int(spec.split(":")[0]) == t:
        os.kill(os.getpid(), getattr(signal, "SIG" + spec.split(":")[1]))


def _write_start(out: Path, cfg, exp, saved: dict | None, history: list[dict]) -> None:
    """config.json (config, versions, data files read, resume history) and partition.json."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if saved is None:
            record = {"config": config_lib.to_dict(cfg), "versions": run_output.versions(),
                      "data_files": list(exp.data_files)}
        else:
            record = {**saved, "config": config_lib.to_dict(cfg), "resumed": history}
            history[-1]["versions"] = run_output.versions()
        run_output.write_json(out / "config.json", record)
        run_output.write_json(out / "partition.json", exp.partition_summary)
    except OSError as e:
        raise UserError(f"cannot write the run folder {out}: {e.strerror or e}; choose another --out") from None


def run(cfg: config_lib.RunConfig, progress: bool = True, resume: bool = False) -> dict:
    """Run one configuration end to end; returns the final summary."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    if cfg.seeds or cfg.sweep:  # several runs in one vmapped program
        from fedjax_pfl.runs.sweep import run_sweep

        return run_sweep(cfg, progress, resume)
    validate(cfg)
    out = output_folder(cfg)
    if not distributed.is_main_process():  # only process 0 writes the run folder (checkpoints: every process)
        with tempfile.TemporaryDirectory(prefix="fedjax_pfl-process-") as scratch:
            return _run(cfg, out, Path(scratch), progress=False, resume=resume)
    check_output_folder(out, resume)
    return _run(cfg, out, out, progress, resume)


def _run(cfg: config_lib.RunConfig, out: Path, files: Path, progress: bool, resume: bool) -> dict:
    """`run` with the run folder ``out`` (checkpoint, resume) and ``files``, where this process writes."""
    from fedjax_pfl.runs.experiment import build_experiment

    saved = saved_run(out) if resume else None
    if saved is not None:
        check_same_config(saved, cfg)  # before any data is read
    exp = build_experiment(cfg)
    ckpt_path = checkpoint.checkpoint_path(out)
    key = jax.random.key(cfg.seed)
    init_key, key = jax.random.split(key)
    server, clients = exp.engine.init(init_key)
    first, seconds_done, history = 0, 0.0, []
    if resume:
        (server, clients), done, meta = checkpoint.restore(ckpt_path, (server, clients),
                                                               num_clients=exp.engine.num_clients)
        history = check_resume(saved, cfg, done, exp.partition_summary,
                               run_output.read_json(out / "partition.json"))
        first, seconds_done = done + 1, float(meta.get("seconds", 0.0))
    _write_start(files, cfg, exp, saved, history)
    results = ResultsWriter(files, tensorboard=cfg.log.tensorboard)  # metrics.csv, clients.csv, plots/, TensorBoard
    if resume:
        run_output.truncate_metrics(files / "metrics.jsonl", last_round=first - 1)
    print(exp.partition_text)
    log = run_output.MetricsLog(files / "metrics.jsonl")
    rounds = cfg.train.rounds
    bar = progress_bar(rounds, progress)
    bar.update(first)
    status = {"status": "interrupted"}
    start = time.perf_counter() - seconds_done
    try:
        with StopRequest() as stop:
            calls = CallPlanner(cfg.train.rounds_per_call, rounds, cfg.checkpoint_every)
            t = first
            while t < rounds:
                stop_at = calls.stop_after(t)
                if calls.compiling:
                    print(f"compiling {calls.count} round(s) per call on {jax.devices()[0].device_kind} "
                          f"({jax.default_backend()}) ...", flush=True)
                began = time.perf_counter()
                server, clients, metrics, evaluations = exp.engine.run_rounds(
                    server, clients, key, t, calls.count, rounds, cfg.eval_every, stop=stop_at)
                calls.done(stop_at - t, time.perf_counter() - began, rounds - stop_at)
                per_round = [{k: v[j] for k, v in metrics.items()} for j in range(stop_at - t)]
                for r in range(t, stop_at):
                    _test_signal(r)
                check_rounds(per_round)
                for r in sorted(evaluations):
                    log.write(_record(evaluations[r], per_round[r - t], r, start, cfg.eval.model))
                    results.evaluated(log.records[-1])
                    bar.set_postfix(acc=f"{log.records[-1]['accuracy']:.4f}")
                last = stop_at - 1
                stopping = stop.requested and last < rounds - 1  # Ctrl-C: stop after this call, resumable
                if stopping or calls.checkpoint_due(last):
                    checkpoint.save(ckpt_path, (server, clients), last, {"seconds": time.perf_counter() - start})
                if last == rounds - 1 or calls.checkpoint_due(last):
                    final = evaluations.get(last)
                    results.snapshot(final if final is not None else
                                     exp.engine.evaluate(server, clients, engine_lib.round_keys(key, last)[1],
                                                         round_index=last))
                bar.update(stop_at - t)
                t = stop_at
                if stopping:
                    status = {"status": "interrupted", "after_round": last}
                    break
            else:
                status = {"status": "finished"}
    except UserError as e:
        status = {"status": "failed", "error": str(e)}
        raise
    finally:
        bar.close()
        log.close()
        summary = {**status, **run_output.final_summary(log.records)}
        run_output.write_json(files / "summary.json", summary)
        results.close()
    print(f"wrote {out}/ (config.json, partition.json, metrics.jsonl, metrics.csv, clients.csv, summary.json"
          f"{', plots/' if results.draws else ''}{', TensorBoard events' if results.tensorboard else ''})")
    if status["status"] == "interrupted":
        print(f"interrupted after round {status['after_round']}: checkpoint and summary written to {out}; "
              "continue with the same command and --resume", file=sys.stderr)
    if "last" in summary:
        mean, best = summary["mean_last_10"], summary["best_optimistic"]
        print(f"final accuracy {summary['last']['accuracy']:.4f} (mean of last {mean['evaluations']} evals "
              f"{mean['accuracy']:.4f}; best {best['by_accuracy']['accuracy']:.4f} at round "
              f"{best['by_accuracy']['round']}, best weighted {best['by_accuracy_weighted']['accuracy_weighted']:.4f} "
              f"at round {best['by_accuracy_weighted']['round']}; eval.model={cfg.eval.model})")
    return summary


def _record(per_client: dict, round_metrics: dict, t: int, start: float, eval_model: str) -> dict:
    """The metrics.jsonl record of an evaluated round; stops the run if the test loss is not finite.

    ``seconds`` is the wall time when the call holding round ``t`` returned.
    """
    evaluation = engine_lib.summarize_evaluation(per_client)
    if not math.isfinite(evaluation["loss"]):
        raise DivergedError(
            f"round {t}: test loss is not finite ({evaluation['loss']}); "
            "lower the learning rate (--lr) or check the data normalisation"
        )
    return {"round": t, **evaluation, "train_loss": float(round_metrics["train_loss"]), "eval_model": eval_model,
            "seconds": time.perf_counter() - start}


def main(argv=None) -> int:
    try:
        args, overrides = parse_args(argv)
        distributed.start(args.distributed, args.coordinator, args.num_processes, args.process_id)
        cfg = config_from_args(args, overrides)
        summary = run(cfg, progress=not args.no_progress, resume=args.resume)
    except UserError as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; nothing more was written (a run with checkpoints continues with --resume)",
              file=sys.stderr)
        return 130
    return 130 if summary.get("status") == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
