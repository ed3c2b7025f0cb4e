"""Padding efficiency (real / executed client-steps) of each client mapping on the GPU suite's partitions.

    PYTHONPATH=. python benchmarks/padding_efficiency.py                 # 100 and 1000 clients, a few seconds
    PYTHONPATH=. python benchmarks/padding_efficiency.py --clients 100 --widths 8,24

Counts, not timings, so any machine gives the same numbers: the partition is
the suite's (benchmarks/gpu_suite.py: CIFAR-shaped pool of 45,000 + 15,000
samples, Dirichlet 0.1 on the labels, each client's pool 75/25 train/test, B=16,
E=5, every client every round), the step counts are the engine's
(`local_training.real_steps`) and the executed counts are what each mapping
computes (`client_mapping.executed_steps`: ``map`` each client's own steps,
``vmap`` every client to the largest, ``chunked:W`` sorted chunks of W to their
own largest, ``packed:W`` W lanes to the longest lane's load). Prints one JSON
record per partition: the counts of every mapping and width, W* (the engine's
``packed`` width, `client_mapping.packed_width`) and whether packed's efficiency
is at least `TARGET` for every W up to total / largest client.
"""

from __future__ import annotations

import argparse
import json
import sys

from common import random_cifar_like, run_config  # noqa: E402 (benchmarks/ is on sys.path)

TARGET = 0.97
WIDTHS = (8, 16, 24, 32, 48, 64, 100)


def client_steps(clients: int, train_samples: int, test_samples: int, batch: int, epochs: int):
    """Every client's local steps in a round of the suite's partition with ``clients`` clients (host numpy)."""
    import numpy as np

    from fedjax_pfl.kernels.local_training import real_steps
    from fedjax_pfl.runs.config import drawn_data_seed
    from fedjax_pfl.runs.experiment import partition_dataset

    cfg = run_config(**{"data.name": "cifar10", "partition.scheme": "dirichlet", "partition.alpha": 0.1,
                        "partition.num_clients": clients,
                        "partition.min_size": max(1, min(10, train_samples // (4 * clients)))})
    data = partition_dataset(random_cifar_like(train_samples, test_samples), cfg.partition, drawn_data_seed(cfg.seed, cfg.data_seed))
    return np.asarray(real_steps(np.asarray(data.train.n), batch, epochs, drop_last=False))


def mapping_counts(steps, widths) -> dict:
    """{mapping label: executed client-steps} for map, vmap and chunked:W / packed:W at each width."""
    import jax.numpy as jnp
    import numpy as np

    from fedjax_pfl.engine.client_mapping import executed_steps, of

    ordered = jnp.asarray(np.sort(steps)[::-1])  # the engine hands chunks their clients sorted by steps
    out = {"map": int(executed_steps(ordered, of("map"))), "vmap": int(executed_steps(ordered, of("vmap")))}
    for w in widths:
        out[f"chunked:{w}"] = int(executed_steps(ordered, of("chunked", w)))
        out[f"packed:{w}"] = int(executed_steps(jnp.asarray(steps), of(f"packed:{w}")))
    return out


def partition_record(clients: int, args) -> dict:
    from fedjax_pfl.engine.client_mapping import packed_width

    steps = client_steps(clients, args.train_samples, args.test_samples, args.batch, args.epochs)
    real, largest = int(steps.sum()), int(steps.max())
    widths = sorted(set(args.widths) | {packed_width(steps, clients, backend="gpu")})
    executed = mapping_counts(steps, widths)
    efficiency = {name: round(real / count, 4) for name, count in executed.items()}
    bound = real / largest
    checked = [w for w in widths if w <= bound]
    return {
        "benchmark": "padding_efficiency", "clients": clients,
        "workload": (f"CIFAR-shaped pool {args.train_samples}+{args.test_samples}, Dirichlet 0.1, 75/25 per client, "
                     f"B={args.batch}, E={args.epochs}, every client every round"),
        "real_client_steps": real, "largest_client_steps": largest, "total_over_largest": round(bound, 2),
        "packed_width": packed_width(steps, clients, backend="gpu"),
        "executed_client_steps": executed, "padding_efficiency": efficiency,
        "packed_at_least_target": {"target": TARGET, "widths": checked,
                                   "holds": all(efficiency[f"packed:{w}"] >= TARGET for w in checked)},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="100,1000")
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    p.add_argument("--train-samples", type=int, default=45000)
    p.add_argument("--test-samples", type=int, default=15000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=5)
    args = p.parse_args(argv)
    args.widths = [int(w) for w in args.widths.split(",")]
    records = [partition_record(int(c), args) for c in args.clients.split(",")]
    for record in records:
        print(json.dumps(record))
    return 0 if all(r["packed_at_least_target"]["holds"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
