"""DiversiFed's O(N^2) server kernel against the naive pairwise Python loop.

For N models of P parameters (random float32, no files needed):

- ``kernel``: one jit call of ``model_distance.mix_models`` for all N rows:
  distances from ONE Gram matmul of the centered models, Xi from the
  model-distance loss, U = Xi @ W as one matmul;
- ``naive``: how a PyTorch simulator does it: a Python loop over pairs with
  one jitted ``||w_i - w_j||`` per pair, the same Xi (N x N, negligible), then
  a Python loop over pairs accumulating u_i += xi_ij (w_j - w_i). When a loop
  would exceed ``--naive-budget-s`` its per-pair time is measured on the first
  pairs and multiplied by the pair count (``naive_extrapolated: true``, with
  the number of pairs timed).

Every record names the device and JAX version and gives the kernel and naive
seconds and their ratio, and the kernel's max relative error against the pairs
the naive loop computed. A combination whose working set would not fit in
memory (about 4 copies of the [N, P] matrix, on the device or in host RAM) is
skipped and listed with the reason. Any non-finite result raises.

``round_share`` times a whole DiversiFed round (paper shapes: 40 clients,
E=10, B=100, Adam, FMNIST MLP 64 with 300 samples per client; CIFAR-10 LeNet
with 500 outside --quick) and the server kernel of that round alone (the
``prepare`` step for the selected clients), on random data of the same shapes.

    python benchmarks/diversifed_kernel.py --quick            # < 2 min on a CPU
    python benchmarks/diversifed_kernel.py --out kernel.json  # N in {10,40,100,400}, P in 50K..11M
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.kernels import model_distance as md

from common import device_name  # noqa: E402 (benchmarks/ is on sys.path)

FULL_NS = (10, 40, 100, 400)
FULL_SIZES = (50_000, 500_000, 2_000_000, 11_000_000)
QUICK_SIZES = (50_000, 500_000)
COPIES = 4  # W, its centered copy, U, headroom
TAU, ETA = 1.0, 0.01
SCALE, SPREAD = 0.05, 0.01  # random models: shared offset of SPREAD, per-model noise of SCALE per parameter


def available_bytes() -> int:
    d = jax.devices()[0]
    stats = d.memory_stats() if hasattr(d, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info.get("MemAvailable", info["MemTotal"])


def check_finite(name, *arrays):
    for a in arrays:
        if not bool(jnp.all(jnp.isfinite(a))):
            raise FloatingPointError(f"{name}: non-finite values in the result")


def block(tree):
    return jax.tree.map(lambda a: a.block_until_ready(), tree)


def time_kernel(w, repeats):
    fn = jax.jit(lambda w: md.mix_models(w, TAU, ETA))  # DiversiFed's server step as the method runs it
    start = time.perf_counter()
    out = block(fn(w))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = block(fn(w))
        times.append(time.perf_counter() - start)
    check_finite("kernel", *out)
    return out, statistics.median(times), compile_s


_pair_distance = jax.jit(lambda a, b: jnp.sqrt(jnp.sum(jnp.square(a - b))))
_pair_axpy = jax.jit(lambda acc, x, wj, wi: acc + x * (wj - wi))


def time_naive(w, xi, budget_s):
    """The per-pair loops; returns (seconds (maybe extrapolated), details, distances computed)."""
    n = w.shape[0]
    rows = [block(w[i]) for i in range(n)]  # a list of models, as a simulator holds them
    block(_pair_distance(rows[0], rows[1 % n]))
    block(_pair_axpy(rows[0], jnp.float32(0.0), rows[0], rows[0]))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    got = {}
    start = time.perf_counter()
    for i, j in pairs:
        got[(i, j)] = _pair_distance(rows[i], rows[j])
        if len(got) % 64 == 0:
            block(got[(i, j)])
            if time.perf_counter() - start > budget_s:
                break
    block(list(got.values()))
    d_time = time.perf_counter() - start
    d_total = d_time * len(pairs) / max(len(got), 1)

    xi_host = np.asarray(xi)
    ordered = [(i, j) for i in range(n) for j in range(n) if j != i]
    done = 0
    start = time.perf_counter()
    acc = rows[0]
    for i in range(n):
        acc = rows[i]
        for j in range(n):
            if j == i:
                continue
            acc = _pair_axpy(acc, jnp.float32(xi_host[i, j]), rows[j], rows[i])
            done += 1
            if done % 64 == 0:
                block(acc)
                if time.perf_counter() - start > budget_s:
                    break
        if time.perf_counter() - start > budget_s:
            break
    block(acc)
    u_time = time.perf_counter() - start
    u_total = u_time * len(ordered) / max(done, 1)
    check_finite("naive", acc, *got.values())
    details = {"naive_distance_pairs_timed": len(got), "naive_distance_pairs": len(pairs),
               "naive_mix_pairs_timed": done, "naive_mix_pairs": len(ordered),
               "naive_extrapolated": len(got) < len(pairs) or done < len(ordered)}
    return d_total + u_total, details, got


def kernel_vs_naive(ns, sizes, repeats, budget_s):
    records, skipped = [], []
    key = jax.random.key(0)
    for p in sizes:
        for n in ns:
            need = COPIES * n * p * 4
            avail = available_bytes()
            if need > 0.8 * avail:
                skipped.append({"n": n, "params": p, "reason": f"needs ~{need / 2**30:.1f} GiB "
                                f"({COPIES} x N x P float32), {avail / 2**30:.1f} GiB available"})
                print(f"skip N={n} P={p}: does not fit memory", file=sys.stderr)
                continue
            w = jax.random.normal(jax.random.fold_in(key, n * 7 + p), (n, p), jnp.float32) * SCALE
            w = block(w + SPREAD * jax.random.normal(jax.random.fold_in(key, p), (1, p), jnp.float32))
            (u, xi, d), kernel_s, compile_s = time_kernel(w, repeats)
            naive_s, details, got = time_naive(w, xi, budget_s)
            d_host = np.asarray(d)
            err = max(abs(float(v) - float(d_host[i, j])) / float(v) for (i, j), v in got.items())
            rec = {"n": n, "params": p, "kernel_s": kernel_s, "kernel_compile_s": compile_s,
                   "naive_s": naive_s, "ratio_naive_over_kernel": naive_s / kernel_s,
                   "max_rel_err_vs_naive_distances": err, **details}
            print(json.dumps(rec), file=sys.stderr, flush=True)
            records.append(rec)
            del w, u, xi, d
    return records, skipped


def round_share(quick: bool, repeats: int):
    """Seconds of one DiversiFed round and of its server kernel, paper shapes, random data."""

    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.core import tree_ops
    from fedjax_pfl.data.client_data import stack_clients
    from fedjax_pfl.runs.config import TrainConfig
    from fedjax_pfl.runs.experiment import engine_config, local_setup
    from fedjax_pfl.methods.diversifed import DIVERSIFED
    from fedjax_pfl.models.networks import build_model

    workloads = [("fmnist-mlp64", "mlp", (28, 28, 1), 300, {"hidden": (64,)})]
    if not quick:
        workloads.append(("cifar10-lenet", "lenet", (32, 32, 3), 500, {}))
    out = []
    for label, model_name, shape, per_client, kw in workloads:
        n = 40
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, size=(n * per_client, *shape), dtype=np.uint8)
        y = rng.integers(0, 10, size=n * per_client).astype(np.int32)
        data = stack_clients(x, y, [np.arange(i * per_client, (i + 1) * per_client) for i in range(n)])
        model = build_model(model_name, shape, 10, **kw)
        setup = local_setup(TrainConfig(optimizer="adam", lr=1e-3, batch_size=100, local_epochs=10), model,
                            lambda a: a.astype(jnp.float32) / 255.0 - 0.5)
        method = DIVERSIFED(setup)
        eng = engine_lib.Engine(method, data, data, engine_config(TrainConfig(), n))
        server, clients = eng.init(jax.random.key(0))
        start = time.perf_counter()
        server, clients, _ = eng.round(server, clients, jax.random.key(1), 0)
        block((server, clients))
        compile_s = time.perf_counter() - start
        times = []
        for t in range(repeats):
            start = time.perf_counter()
            server, clients, _ = eng.round(server, clients, jax.random.key(2 + t), 1 + t)
            block((server, clients))
            times.append(time.perf_counter() - start)
        check_finite("round", *jax.tree.leaves(server))
        selected = jnp.arange(n)
        prep = jax.jit(method.prepare)
        block(prep(server, clients, selected))
        ktimes = []
        for _ in range(max(repeats, 3)):
            start = time.perf_counter()
            block(prep(server, clients, selected))
            ktimes.append(time.perf_counter() - start)
        params = tree_ops.flatten_stacked(server["params"]).shape[1]
        round_s, kernel_s = statistics.median(times), statistics.median(ktimes)
        rec = {"workload": label, "clients": n, "params": params, "round_s": round_s, "round_compile_s": compile_s,
               "kernel_s": kernel_s, "kernel_share": kernel_s / round_s}
        print(json.dumps(rec), file=sys.stderr, flush=True)
        out.append(rec)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="P in {50K, 500K}, short naive budget, FMNIST round only")
    p.add_argument("--ns", default=None, help="comma-separated model counts (default 10,40,100,400)")
    p.add_argument("--sizes", default=None, help="comma-separated parameter counts (default 50K,500K,2M,11M)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--naive-budget-s", type=float, default=None,
                   help="seconds per naive loop before extrapolating (default 1 quick, 10 full)")
    p.add_argument("--no-round", action="store_true", help="skip the round-share measurement")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    ns = tuple(int(v) for v in args.ns.split(",")) if args.ns else FULL_NS
    sizes = tuple(int(float(v)) for v in args.sizes.split(",")) if args.sizes else (
        QUICK_SIZES if args.quick else FULL_SIZES)
    repeats = args.repeats or (2 if args.quick else 5)
    budget = args.naive_budget_s if args.naive_budget_s is not None else (1.0 if args.quick else 10.0)
    started = time.perf_counter()
    records, skipped = kernel_vs_naive(ns, sizes, repeats, budget)
    shares = [] if args.no_round else round_share(args.quick, repeats)
    result = {"benchmark": "diversifed_kernel", "device": device_name(), "platform": jax.devices()[0].platform,
              "jax_version": jax.__version__, "quick": args.quick, "tau": TAU, "eta": ETA,
              "naive_budget_s": budget, "repeats": repeats, "records": records, "skipped": skipped,
              "round_share": shares, "total_s": time.perf_counter() - started}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
