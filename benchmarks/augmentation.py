"""What ``train.augment=crop_flip`` costs: rounds per second with and without it, in one run.

The workload is the FedPAC CIFAR-10 preset (configs/fedpac_cifar10.yaml, its
CNN, B=50, the practical partition) on the project's cifar10_jpeg copy, made
small enough to time on a CPU: fewer clients and samples, one local epoch.
Both variants are built in this process and compiled by a warm-up call; then
alternating blocks of single-round calls are timed, so load on a shared
machine hits both alike. One JSON record per variant (seconds per round: the
median over blocks), then the ratio. Peak memory is the process's (both
variants live in it).

    python benchmarks/augmentation.py            # 10 clients x 300 images, FedAvg
    python benchmarks/augmentation.py --quick    # fewer blocks
    python benchmarks/augmentation.py --method fedpac --clients 20
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name, peak_memory_bytes  # noqa: E402

from fedjax_pfl.core.errors import UserError  # noqa: E402
from fedjax_pfl.runs import config as config_lib  # noqa: E402
from fedjax_pfl.runs.experiment import build_experiment, validate  # noqa: E402

PRESET = Path(__file__).resolve().parents[1] / "configs" / "fedpac_cifar10.yaml"
VARIANTS = ("none", "crop_flip")


def experiment(args, augment: str):
    cfg = config_lib.build(str(PRESET), [
        f"method_name={args.method}", f"data.name={args.dataset}", f"partition.num_clients={args.clients}",
        f"partition.samples_per_client={args.samples}", "partition.test_per_client=50", "train.local_epochs=1",
        f"train.client_mapping={args.mapping}", f"train.augment={augment}"])
    cfg.data.allow_download = False
    return build_experiment(validate(cfg))


def timed_rounds(engine, state, key, first: int, rounds: int):
    """(state after ``rounds`` single-round calls from round ``first``, seconds per round)."""
    server, clients = state
    began = time.perf_counter()
    for t in range(first, first + rounds):
        server, clients, _, _ = engine.run_rounds(server, clients, key, t, 1, 10 ** 6, 10 ** 6)
    jax.block_until_ready(server)
    return (server, clients), (time.perf_counter() - began) / rounds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="fedavg")
    p.add_argument("--dataset", default="cifar10_jpeg")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--samples", type=int, default=300, help="train images per client")
    p.add_argument("--mapping", default="map")
    p.add_argument("--blocks", type=int, default=5, help="alternating timed blocks per variant")
    p.add_argument("--rounds", type=int, default=3, help="rounds per block")
    p.add_argument("--quick", action="store_true", help="2 blocks of 1 round")
    args = p.parse_args(argv)
    blocks, rounds = (2, 1) if args.quick else (args.blocks, args.rounds)
    try:
        experiments = {v: experiment(args, v) for v in VARIANTS}
    except UserError as e:  # missing data, bad option: one line, exit 2
        print(f"augmentation: {e}", file=sys.stderr)
        return 2
    key = jax.random.key(0)
    state, compile_s, seconds = {}, {}, {v: [] for v in VARIANTS}
    for v, exp in experiments.items():
        began = time.perf_counter()
        state[v], _ = timed_rounds(exp.engine, exp.engine.init(key), key, 0, 1)
        compile_s[v] = time.perf_counter() - began
    for block in range(blocks):
        for v in VARIANTS:
            state[v], s = timed_rounds(experiments[v].engine, state[v], key, 1 + block * rounds, rounds)
            seconds[v].append(s)
    workload = {"preset": "configs/fedpac_cifar10.yaml", "method": args.method, "dataset": args.dataset,
                "clients": args.clients, "train_per_client": args.samples, "batch": 50, "epochs": 1,
                "mapping": str(experiments["none"].engine.mapping), "blocks": blocks, "rounds_per_block": rounds}
    records = {}
    for v in VARIANTS:
        for leaf in jax.tree.leaves(state[v][0]):
            if not bool(jax.numpy.all(jax.numpy.isfinite(leaf))):
                raise FloatingPointError(f"train.augment={v}: the server state is not finite; no number reported")
        s = statistics.median(seconds[v])
        records[v] = {"workload": workload, "variant": f"train.augment={v}", "device": device_name(),
                      "jax": jax.__version__, "s_per_round": s, "rounds_per_s": 1.0 / s,
                      "compile_s": compile_s[v], "peak_memory_bytes": peak_memory_bytes(),
                      "load_average": os.getloadavg()[0]}
        print(json.dumps(records[v]), flush=True)
    print(json.dumps({"workload": workload, "device": device_name(),
                      "crop_flip_over_none_rounds_per_s": records["crop_flip"]["rounds_per_s"]
                      / records["none"]["rounds_per_s"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
