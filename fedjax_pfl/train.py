"""Command line: ``python -m fedjax_pfl.train --method NAME [options]``.

Builds the run from flags, a YAML preset (--config) and dotted overrides,
loads and partitions the data, runs the rounds with a progress bar, and writes
the output folder (run_output.py). User errors print one line and exit 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np

from fedjax_pfl import checkpoint
from fedjax_pfl import config as config_lib
from fedjax_pfl import run_output
from fedjax_pfl.errors import DivergedError, UserError
from fedjax_pfl.runs.results_writer import ResultsWriter

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
    "tensorboard": "log.tensorboard",
}


def build_parser() -> argparse.ArgumentParser:
    from fedjax_pfl.data.registry import dataset_names
    from fedjax_pfl.methods import method_names
    from fedjax_pfl.models import model_names

    p = argparse.ArgumentParser(
        prog="python -m fedjax_pfl.train",
        description="Run a personalized federated learning method. " + DEFAULT_NOTE + ".",
        epilog=f"methods: {', '.join(method_names())}\ndatasets: {', '.join(dataset_names())}\n"
        f"models: {', '.join(model_names())}\npartitions: iid, dirichlet, pathological, practical, natural",
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
    p.add_argument("--eval-every", type=int)
    p.add_argument("--client-mapping", help="auto | vmap | map | chunked")
    p.add_argument("--out", help="output folder (default runs/<method>-<dataset>-<time>)")
    p.add_argument("--checkpoint-every", type=int, help="save server and client state every K rounds (0: never)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--tensorboard", action="store_true", default=None,
                   help="also write TensorBoard event files into the run folder (needs tensorboardX)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. method.mu=0.01 train.lr=0.1")
    return p


def config_from_args(args) -> config_lib.RunConfig:
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
    cfg = config_lib.build(args.config, args.overrides, base)
    if not args.offline and "allow_download" not in base.get("data", {}) and not args.config:
        cfg.data.allow_download = True
    return cfg


def run(cfg: config_lib.RunConfig, progress: bool = True, resume: bool = False) -> dict:
    """Run one configuration end to end; returns the final summary."""
    from fedjax_pfl.experiment import build_experiment

    exp = build_experiment(cfg)
    out = Path(cfg.out or f"runs/{cfg.method_name}-{cfg.data.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    ckpt_path = out / "checkpoint.npz"
    if (out / "metrics.jsonl").exists() and not resume:
        raise UserError(f"{out} already holds a run (metrics.jsonl); choose another --out, remove it, "
                        "or continue it with --resume")
    results = ResultsWriter(out, tensorboard=cfg.log.tensorboard)  # metrics.csv, clients.csv, plots/, TensorBoard
    out.mkdir(parents=True, exist_ok=True)
    run_output.write_json(out / "config.json", {"config": config_lib.to_dict(cfg), "versions": run_output.versions()})
    run_output.write_json(out / "partition.json", exp.partition_summary)
    print(exp.partition_text)
    key = jax.random.key(cfg.seed)
    init_key, key = jax.random.split(key)
    server, clients = exp.engine.init(init_key)
    first = 0
    if resume:
        (server, clients), done = checkpoint.restore(ckpt_path, (server, clients))
        first = done + 1
        run_output.truncate_metrics(out / "metrics.jsonl", last_round=done)
    log = run_output.MetricsLog(out / "metrics.jsonl")
    rounds = cfg.train.rounds
    bar = _progress(rounds, progress)
    bar.update(first)
    status = {"status": "interrupted"}
    try:
        start = time.perf_counter()
        for t in range(first, rounds):
            round_key, eval_key = jax.random.split(jax.random.fold_in(key, t))
            server, clients, metrics = exp.engine.round(server, clients, round_key, t)
            if (t + 1) % cfg.eval_every == 0 or t == rounds - 1:
                log.write(_evaluate(exp, server, clients, eval_key, metrics, t, start))
                bar.set_postfix(acc=f"{log.records[-1]['accuracy']:.4f}")
                results.evaluated(log.records[-1])
            if cfg.checkpoint_every and ((t + 1) % cfg.checkpoint_every == 0 or t == rounds - 1):
                checkpoint.save(ckpt_path, (server, clients), t)
            if t == rounds - 1 or (cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0):
                results.snapshot(exp.engine.evaluate(server, clients, eval_key))  # tables and figures
            bar.update(1)
        status = {"status": "finished"}
    except UserError as e:
        status = {"status": "failed", "error": str(e)}
        raise
    finally:
        bar.close()
        log.close()
        summary = {**status, **run_output.final_summary(log.records)}
        run_output.write_json(out / "summary.json", summary)
        results.close()
    print(f"wrote {out}/ (config.json, partition.json, metrics.jsonl, metrics.csv, clients.csv, summary.json"
          f"{', plots/' if results.draws else ''}{', TensorBoard events' if results.tensorboard else ''})")
    if "last" in summary:
        print(f"final accuracy {summary['last']['accuracy']:.4f} (mean of last 10 evals "
              f"{summary['mean_last_10']['accuracy']:.4f}; best {summary['best_optimistic']['accuracy']:.4f})")
    return summary


def _evaluate(exp, server, clients, key, metrics, t, start) -> dict:
    """Evaluate every client; stop the run if anything is not finite."""
    evaluation = exp.engine.evaluate_summary(server, clients, key)
    train_loss = float(metrics["train_loss"])
    if not (math.isfinite(train_loss) and math.isfinite(evaluation["loss"])):
        raise DivergedError(
            f"round {t}: loss is not finite (train {train_loss}, test {evaluation['loss']}); "
            "lower the learning rate (--lr) or check the data normalisation"
        )
    return {"round": t, **evaluation, "train_loss": train_loss, "seconds": time.perf_counter() - start}


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="rounds", unit="round", disable=not enabled, file=sys.stderr)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        run(cfg, progress=not args.no_progress, resume=args.resume)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
