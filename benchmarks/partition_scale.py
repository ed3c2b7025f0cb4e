"""Seconds to partition a labelled pool over 10,000-100,000 clients, each scheme, and the per-client split after.

    PYTHONPATH=. python benchmarks/partition_scale.py                       # 10,000 and 100,000 clients
    PYTHONPATH=. python benchmarks/partition_scale.py --clients 10000 --schemes dirichlet

Host NumPy only (no JAX): the pool is ``--per-client`` uniform labels over
10 classes per client (20 x 10,000 = 200,000 labels at 10,000 clients), the
cross-device shape where most clients are small: Dirichlet alpha 0.01 (and 0.1)
with min_size 10 (the repair moves samples to nearly every client),
Dirichlet 0.01 cut to each client's top 2 classes, pathological 2 classes
per client, client_dirichlet top 2 (independent and disjoint draws). One JSON
record per (scheme, clients): the seconds of the partition and of
`split_train_test` (75/25 per client), the smallest client, and the process's
peak resident memory; a last record gives each scheme's seconds at the
largest count over the smallest (how the time grows with the clients).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time

import numpy as np

from fedjax_pfl.data import partition

NUM_CLASSES = 10


def schemes(min_size: int) -> dict:
    """name -> (function of (labels, clients, seed) -> partition, its parameters as recorded)."""
    def dirichlet(alpha, k=None):
        params = {"alpha": alpha, "min_size": min_size, "max_classes_per_client": k}
        return (lambda labels, n, seed: partition.dirichlet(labels, n, seed=seed, **params)), params

    def client_dirichlet(disjoint):
        params = {"alpha": 0.1, "size_range": (10, 30), "max_classes_per_client": 2, "disjoint": disjoint}
        return (lambda labels, n, seed: partition.client_dirichlet(labels, n, seed=seed, **params)), params

    pathological = {"classes_per_client": 2}
    return {
        "dirichlet_0.01": dirichlet(0.01),
        "dirichlet_0.1": dirichlet(0.1),
        "dirichlet_0.01_top2": dirichlet(0.01, 2),
        "pathological_2": ((lambda labels, n, seed: partition.pathological(labels, n, seed=seed, **pathological)),
                           pathological),
        "client_dirichlet_top2": client_dirichlet(False),
        "client_dirichlet_top2_disjoint": client_dirichlet(True),
    }


def record(name: str, fn, params: dict, clients: int, per_client: int, seed: int) -> dict:
    labels = np.random.default_rng(seed).integers(0, NUM_CLASSES, clients * per_client)
    began = time.perf_counter()
    parts = fn(labels, clients, seed)
    partition_s = time.perf_counter() - began
    began = time.perf_counter()
    train, test = partition.split_train_test(parts, labels, 0.75, seed + 1)
    split_s = time.perf_counter() - began
    sizes = np.array([p.size for p in parts])
    return {"workload": {"scheme": name, **params, "clients": clients, "pool": int(labels.size),
                         "classes": NUM_CLASSES},
            "device": f"host numpy ({platform.machine()}, {platform.python_implementation()})",
            "partition_s": round(partition_s, 3), "split_train_test_s": round(split_s, 3),
            "smallest_client": int(sizes.min()), "largest_client": int(sizes.max()),
            "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="10000,100000", help="comma-separated client counts")
    p.add_argument("--per-client", type=int, default=20, help="pool samples per client")
    p.add_argument("--min-size", type=int, default=10)
    p.add_argument("--schemes", default="", help="comma-separated names (default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    table = schemes(args.min_size)
    names = [s for s in args.schemes.split(",") if s] or list(table)
    counts = [int(c) for c in args.clients.split(",")]
    seconds: dict[str, dict[int, float]] = {}
    for clients in counts:
        for name in names:
            fn, params = table[name]
            row = record(name, fn, params, clients, args.per_client, args.seed)
            seconds.setdefault(name, {})[clients] = row["partition_s"] + row["split_train_test_s"]
            print(json.dumps(row), flush=True)
    if len(counts) > 1:
        lo, hi = min(counts), max(counts)
        print(json.dumps({"growth": f"seconds at {hi} clients over seconds at {lo} (clients x{hi // lo})",
                          **{name: round(s[hi] / max(s[lo], 1e-9), 2) for name, s in seconds.items()}}))


if __name__ == "__main__":
    main()
