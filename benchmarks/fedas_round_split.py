"""Where a FedAS round's seconds go, beside FedAvg's round on the same cell.

A round is one compiled program, so its phases are timed by taking them out
one at a time, each variant a real round of the same cell (same clients, same
draws, the round after a warm-up round, so the alignment runs):

    fedas            align, train E epochs, Fisher trace, Fisher-weighted body
    no_alignment     method.align=false: train, Fisher trace
    fedper           FedAS with both parts off (FedPer exactly): train
    fedper_E1        the same with train.local_epochs=1: the slope per epoch
    fedavg           FedAvg's round on the cell (its global model, all layers)

and the split: alignment = fedas - no_alignment (the old body's class means,
the alignment epoch, the feature-change diagnostic); Fisher trace =
no_alignment - fedper; local training = E x (fedper - fedper_E1) / (E - 1);
aggregation and the round's fixed work (selection, gathers, scatters) = fedper
- local training; evaluation = one evaluation of every client (timed alone).
The ideal FedAS/FedAvg ratio of a round is about (E + 2) / E: one alignment
epoch and one Fisher pass beside E epochs.

    python benchmarks/fedas_round_split.py                          # the preset cell (beta 0.1, P 0.6)
    python benchmarks/fedas_round_split.py train.join_ratio=0.2     # another cell of Table 3
    python benchmarks/fedas_round_split.py --quick                  # a tiny synthetic cell (a test runs it)
    python benchmarks/fedas_round_split.py --passes-only            # one client's Fisher pass and epoch only

Single rounds differ by up to +-10% on a shared CPU, so a phase read as a
difference of two rounds carries that noise; the record also times one
client's Fisher pass beside one epoch of its training, each compiled alone
(median of 5 calls), the trace's cost without the round around it.

Prints one JSON record: workload, device, load average, seconds per variant
(compile and round), the split (seconds and shares of the FedAS round), one
client's passes, the ratios, peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name, peak_memory_bytes  # noqa: E402

PRESET = ["--config", "configs/fedas_cifar10.yaml", "data.name=cifar10_jpeg", "train.lr_decay=0.999"]
QUICK = ["--method", "fedas", "--dataset", "synthetic", "--model", "mlp", "--num-clients", "6", "--partition",
         "natural", "--local-epochs", "2", "--batch-size", "8", "--join-ratio", "0.5"]
VARIANTS = {"fedas": [], "no_alignment": ["method.align=false"],
            "fedper": ["--method", "fedper"], "fedper_E1": ["--method", "fedper", "train.local_epochs=1"],
            "fedavg": ["--method", "fedavg"]}


def build(argv: list[str]):
    """The engine of the training command's run ``argv`` (validated as the command validates it)."""
    from fedjax_pfl.commands import train as cli
    from fedjax_pfl.runs.experiment import build_experiment

    args, overrides = cli.parse_args(argv)
    return build_experiment(cli.settle(cli.config_from_args(args, overrides))).engine


def timed_round(engine) -> dict:
    """Compile seconds (round 0, with its warm-up), then the seconds of round 1 (the alignment's first) and
    of one evaluation of every client after it."""
    key = jax.random.key(0)
    server, clients = engine.init(key)
    began = time.perf_counter()
    server, clients, _ = engine.round(server, clients, jax.random.fold_in(key, 0), 0)
    jax.block_until_ready((server, clients))
    compile_and_round = time.perf_counter() - began
    began = time.perf_counter()
    server, clients, _ = engine.round(server, clients, jax.random.fold_in(key, 1), 1)
    jax.block_until_ready((server, clients))
    round_seconds = time.perf_counter() - began
    jax.block_until_ready(engine.evaluate(server, clients, key))  # (compiles the evaluation)
    began = time.perf_counter()
    jax.block_until_ready(engine.evaluate(server, clients, key))
    return {"first_call_s": round(compile_and_round, 2), "round_s": round(round_seconds, 2),
            "evaluation_s": round(time.perf_counter() - began, 2)}


def pass_seconds(engine, repeats: int = 5) -> dict:
    """One client's Fisher pass beside one epoch of its local training (the median client by size, its
    initial variables, each compiled alone, medians of ``repeats`` calls): the phases without the whole
    round's noise, each in units of the other."""
    from fedjax_pfl.methods import fedas, training

    m, key = engine.method, jax.random.key(0)
    _, clients = engine.init(key)
    sizes = np.asarray(engine.train.n)
    client = int(np.argsort(sizes)[len(sizes) // 2])
    data, variables = jax.tree.map(lambda a: a[client], (engine.train, clients["variables"]))
    fisher = jax.jit(lambda v, d: fedas.fisher_trace(m, m.local, v, d))
    epoch = jax.jit(lambda v, d, k: training.train(m.local, training.supervised_objective(m), v, d, k, 1,
                                                   max_epochs=1))
    calls = {"fisher_pass": lambda: fisher(variables, data), "training_epoch": lambda: epoch(variables, data, key)}
    medians = {}
    for name, call in calls.items():
        jax.block_until_ready(call())  # compiles
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            jax.block_until_ready(call())
            times.append(time.perf_counter() - began)
        medians[name] = round(statistics.median(times), 4)
    return {"client_samples": int(sizes[client]), "seconds": medians,
            "fisher_over_epoch": round(medians["fisher_pass"] / medians["training_epoch"], 3)}


def split(seconds: dict, epochs: int) -> dict:
    """The FedAS round's seconds by phase (module docstring), and their shares of it."""
    fedas, plain = seconds["fedas"]["round_s"], seconds["fedper"]["round_s"]
    training = epochs * (plain - seconds["fedper_E1"]["round_s"]) / (epochs - 1)
    parts = {"alignment": fedas - seconds["no_alignment"]["round_s"],
             "fisher_trace": seconds["no_alignment"]["round_s"] - plain,
             "local_training": training, "aggregation_and_fixed": plain - training,
             "evaluation": seconds["fedas"]["evaluation_s"]}
    total = fedas + parts["evaluation"]
    return {"seconds": {k: round(v, 2) for k, v in parts.items()},
            "share_of_round_and_evaluation": {k: round(v / total, 3) for k, v in parts.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny synthetic cell instead of the preset")
    p.add_argument("--mapping", default="map", help="train.client_mapping of every variant (default map)")
    p.add_argument("--cpu-devices", default="1", help="devices.cpu of every variant (default 1: one host device)")
    p.add_argument("--passes-only", action="store_true",
                   help="only one client's Fisher pass beside one epoch of its training (no rounds)")
    args, overrides = p.parse_known_args(argv)
    base = [*(QUICK if args.quick else PRESET), f"train.client_mapping={args.mapping}", f"devices.cpu={args.cpu_devices}",
            "--out", os.devnull, *overrides]
    seconds, epochs = {}, None
    if args.passes_only:
        print(json.dumps({"workload": "quick synthetic cell" if args.quick else "FedAS preset cell",
                          "overrides": overrides, "device": device_name(), "jax": jax.__version__,
                          "load_average": [round(x, 2) for x in os.getloadavg()],
                          "one_client_passes": pass_seconds(build(base))}))
        return 0
    for name, extra in VARIANTS.items():
        engine = build([*base, *extra])
        if name == "fedas":
            epochs = engine.method.setup.local_epochs
        seconds[name] = timed_round(engine)
        if name == "fedas":
            passes = pass_seconds(engine)
    if epochs is None or epochs < 2:
        print("fedas_round_split: the cell needs at least 2 local epochs (the training slope)", file=sys.stderr)
        return 2
    record = {"workload": "quick synthetic cell" if args.quick else "FedAS preset cell (fedas_cifar10.yaml)",
              "overrides": overrides, "mapping": args.mapping, "device": device_name(), "jax": jax.__version__,
              "load_average": [round(x, 2) for x in os.getloadavg()], "local_epochs": epochs,
              "variants": seconds, "fedas_round_split": split(seconds, epochs), "one_client_passes": passes,
              "fedas_over_fedavg": {"round": round(seconds["fedas"]["round_s"] / seconds["fedavg"]["round_s"], 3),
                                    "ideal_round": round((epochs + 2) / epochs, 3)},
              "peak_memory_bytes": peak_memory_bytes()}
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
