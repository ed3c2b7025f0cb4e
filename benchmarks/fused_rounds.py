"""Fused rounds: K rounds per compiled call vs one round per call, in one run.

For small models (MLR, MLP: the pFedKD-WCL presets) a round is mostly host
dispatch; `Engine.run_rounds` scans K rounds with their evaluations on
device. Each variant runs in this process on the same experiment, after one
warm-up call that compiles it; one JSON record per variant, then the ratio.

    python benchmarks/fused_rounds.py            # FedAvg, MLP 784-100-10, FMNIST 20 clients, Dir 0.1
    python benchmarks/fused_rounds.py --quick    # fewer rounds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name, peak_memory_bytes  # noqa: E402

from fedjax_pfl.runs import config as config_lib  # noqa: E402
from fedjax_pfl.core.errors import UserError  # noqa: E402
from fedjax_pfl.runs.experiment import build_experiment, validate  # noqa: E402


def experiment(args):
    cfg = config_lib.build(overrides=[
        f"method_name={args.method}", f"data.name={args.dataset}", "model.name=mlp", "model.hidden=[100]",
        "partition.scheme=dirichlet", "partition.alpha=0.1", f"partition.num_clients={args.clients}",
        "train.local_epochs=1", f"train.batch_size={args.batch}", "train.lr=0.05", "train.join_ratio=1.0",
        f"train.client_mapping={args.mapping}"]
        + ([f"partition.train_per_client={args.train_per_client}", f"partition.test_per_client={args.train_per_client}"]
           if args.train_per_client else []))
    cfg.data.allow_download = False
    return build_experiment(validate(cfg))


def time_variant(exp, k: int, rounds: int, eval_every: int) -> dict:
    """Seconds per round for calls of ``k`` rounds (one warm-up call compiles first)."""
    key = jax.random.key(0)
    server, clients = exp.engine.init(key)
    began = time.perf_counter()
    server, clients, _, _ = exp.engine.run_rounds(server, clients, key, 0, k, rounds + k, eval_every)
    jax.block_until_ready(server)
    compile_s = time.perf_counter() - began
    began = time.perf_counter()
    for first in range(k, k + rounds, k):
        server, clients, _, _ = exp.engine.run_rounds(server, clients, key, first, k, rounds + k, eval_every)
    jax.block_until_ready(server)
    seconds = (time.perf_counter() - began) / rounds
    return {"rounds_per_call": k, "s_per_round": seconds, "rounds_per_s": 1.0 / seconds,
            "first_call_s": compile_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="fedavg")
    p.add_argument("--dataset", default="fmnist")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--mapping", default="auto")
    p.add_argument("--k", type=int, default=10, help="rounds per fused call")
    p.add_argument("--rounds", type=int, default=40, help="timed rounds per variant (a multiple of --k)")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--train-per-client", type=int, default=0,
                   help="samples per client (train and test; 0: the whole partition), e.g. 50 for rounds of ~no work")
    p.add_argument("--quick", action="store_true", help="20 timed rounds")
    args = p.parse_args(argv)
    rounds = 20 if args.quick else args.rounds
    rounds = max(args.k, rounds // args.k * args.k)
    try:
        exp = experiment(args)
    except UserError as e:  # missing data, bad option: one line, exit 2
        print(f"fused_rounds: {e}", file=sys.stderr)
        return 2
    workload = {"method": args.method, "dataset": args.dataset, "model": "mlp-100", "clients": args.clients,
                "partition": "dirichlet 0.1", "train_per_client": args.train_per_client or "all", "batch": args.batch, "epochs": 1,
                "mapping": str(exp.engine.mapping), "eval_every": args.eval_every}
    records = {}
    for k in (1, args.k):
        rec = {"workload": workload, "device": device_name(), "jax": jax.__version__,
               **time_variant(exp, k, rounds, args.eval_every), "peak_memory_bytes": peak_memory_bytes()}
        records[k] = rec
        print(json.dumps(rec), flush=True)
    ratio = records[args.k]["rounds_per_s"] / records[1]["rounds_per_s"]
    print(json.dumps({"workload": workload, "device": device_name(),
                      f"fused_k{args.k}_over_single_rounds_per_s": ratio}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
