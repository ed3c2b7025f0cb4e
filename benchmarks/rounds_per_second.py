"""Rounds per second of the engine against the usual per-client Python loop.

For each workload (method, model, clients, samples per client) and each
variant, one child process builds random CIFAR- or MNIST-shaped client data
(no files needed), runs a warm-up round (compile time reported apart) and then
timed rounds, and prints one JSON record. Variants:

- ``engine-vmap`` / ``engine-map`` / ``engine-chunked``: the jit-compiled round
  with each client-mapping setting;
- ``loop``: the same method as a per-client Python loop: one jitted
  ``client_update`` per client, clients one after another, then the jitted
  server step (how PyTorch simulators run, minus PyTorch);
- ``loop-per-batch`` (FedAvg only): one jitted SGD step per batch, batches and
  clients in Python loops (the PFLlib shape).

Each record names the device, JAX version and workload and gives rounds/s,
seconds per round (median), compile seconds, samples/s, padding efficiency
and peak memory. The parent prints the records and the ratio of every variant
to ``loop``. A run that produced non-finite parameters raises instead of
reporting a number.

    python benchmarks/rounds_per_second.py --quick
    python benchmarks/rounds_per_second.py --methods fedavg,fedas --models fedavgcnn --clients 10,20,100,500,1000
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

from common import device_name, peak_memory_bytes  # noqa: E402 (benchmarks/ is on sys.path)

SHAPES = {"mnist": (28, 28, 1), "cifar": (32, 32, 3)}


def build(workload: dict, mapping: str):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.data.client_data import stack_clients
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.runs.config import TrainConfig
    from fedjax_pfl.runs.experiment import engine_config, local_setup
    from fedjax_pfl.models.networks import build_model

    shape = SHAPES[workload["data"]]
    n, N = workload["samples"], workload["clients"]
    rng = np.random.default_rng(0)
    sizes = rng.integers(max(1, n // 2), n + 1, size=N) if workload.get("ragged") else np.full(N, n)
    x = rng.integers(0, 256, size=(int(sizes.sum()), *shape), dtype=np.uint8)
    y = rng.integers(0, 10, size=int(sizes.sum())).astype(np.int32)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    data = stack_clients(x, y, [np.arange(bounds[i], bounds[i + 1]) for i in range(N)])
    kwargs = {"hidden": tuple(workload["hidden"])} if workload.get("hidden") else {}
    model = build_model(workload["model"], shape, 10, **kwargs)
    train = TrainConfig(lr=workload["lr"], batch_size=workload["batch"], local_epochs=workload["epochs"],
                        client_mapping=mapping if mapping != "loop" else "vmap", chunk_size=workload.get("chunk", 10))
    setup = local_setup(train, model, lambda a: a.astype(jnp.float32) / 255.0 - 0.5)
    method = get_method(workload["method"])(setup)
    S = max(1, round(N * workload["join_ratio"]))
    return engine_lib.Engine(method, data, data, engine_config(train, S)), sizes


def loop_round(engine, jitted):
    """One round as a per-client Python loop over the method's jitted client update."""
    import jax
    import jax.numpy as jnp

    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.core import tree_ops
    from fedjax_pfl.methods.base import ClientRound, ServerRound

    client_update, server_update, gather = jitted

    def run(server, clients, key, t):
        cfg, method = engine.config, engine.method
        k_sel, _, k_clients = jax.random.split(key, 3)
        selected = engine_lib.select_clients(k_sel, engine.num_clients, cfg.clients_per_round)
        keys = jax.random.split(k_clients, cfg.clients_per_round)
        chosen = method.prepare(server, gather(clients, selected), selected)
        outs = []
        for j in range(cfg.clients_per_round):
            client = jax.tree.map(lambda a: a[j], chosen)
            data_j = jax.tree.map(lambda a: a[selected[j]], engine.train)
            info = ClientRound(jnp.int32(t), jnp.int32(method.setup.local_epochs))
            outs.append(client_update(server, client, data_j, keys[j], info))
        chosen = jax.tree.map(lambda *a: jnp.stack(a), *[o[0] for o in outs])
        uploads = jax.tree.map(lambda *a: jnp.stack(a), *[o[1] for o in outs])
        info = ServerRound(jnp.int32(t), selected, engine.train.n[selected].astype(jnp.float32),
                           jnp.ones(cfg.clients_per_round, bool))
        server, chosen = server_update(server, chosen, uploads, info)
        return server, tree_ops.scatter(clients, selected, chosen)

    return run


def per_batch_round(engine):
    """FedAvg the PFLlib way: a jitted SGD step per batch, Python loops over batches and clients."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from fedjax_pfl import aggregation, losses
    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.kernels.local_training import Batch

    method = engine.method
    setup = method.setup
    opt = setup.optimizer(setup.lr)  # the local optimizer is a function of the learning rate

    @jax.jit
    def step(variables, opt_state, x, y):
        def loss(p):
            out = method.model.apply({**variables, "params": p}, setup.normalize(x), train=True)
            return losses.cross_entropy(out.logits, y)
        g = jax.grad(loss)(variables["params"])
        updates, opt_state = opt.update(g, opt_state, variables["params"])
        return {**variables, "params": optax.apply_updates(variables["params"], updates)}, opt_state

    average = jax.jit(aggregation.weighted_mean)
    x_all, y_all, n_all = (np.asarray(a) for a in engine.train)
    rng = np.random.default_rng(0)

    def run(server, clients, key, t):
        k_sel = jax.random.split(key, 3)[0]
        selected = np.asarray(engine_lib.select_clients(k_sel, engine.num_clients, engine.config.clients_per_round))
        trained = []
        for c in selected:
            v = server["variables"]
            opt_state = opt.init(v["params"])
            n = int(n_all[c])
            for _ in range(setup.local_epochs):
                order = rng.permutation(n)
                for s in range(math.ceil(n / setup.batch_size)):
                    b = order[s * setup.batch_size:(s + 1) * setup.batch_size]
                    v, opt_state = step(v, opt_state, jnp.asarray(x_all[c][b]), jnp.asarray(y_all[c][b]))
            trained.append(v)
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *trained)
        return {"variables": average(stacked, jnp.asarray(n_all[selected], jnp.float32))}, clients

    return run


def measure(workload: dict, variant: str, rounds: int) -> dict:
    import jax

    from fedjax_pfl.core import tree_ops
    from fedjax_pfl.data.client_data import padding_efficiency

    mapping = variant.replace("engine-", "") if variant.startswith("engine-") else "loop"
    engine, sizes = build(workload, mapping)
    key = jax.random.key(0)
    server, clients = engine.init(key)
    if variant.startswith("engine-"):
        run = lambda s, c, k, t: engine.round(s, c, k, t)[:2]
    elif variant == "loop":
        m = engine.method
        run = loop_round(engine, (jax.jit(m.client_update), jax.jit(m.server_update), jax.jit(tree_ops.gather)))
    elif variant == "loop-per-batch":
        run = per_batch_round(engine)
    else:
        raise ValueError(variant)
    times = []
    for t in range(rounds + 1):
        start = time.perf_counter()
        server, clients = run(server, clients, jax.random.fold_in(key, t), t)
        jax.block_until_ready((server, clients))
        times.append(time.perf_counter() - start)
    leaves = jax.tree.leaves((server, clients))
    if not leaves or not all(bool(jax.numpy.isfinite(a).all()) for a in leaves if a.dtype.kind == "f"):
        raise RuntimeError(f"{variant} on {workload}: non-finite state after {rounds + 1} rounds")
    steady = statistics.median(times[1:])
    S = engine.config.clients_per_round
    samples = workload["epochs"] * float(sizes.mean()) * S
    return {
        "workload": workload, "variant": variant, "device": device_name(), "jax": jax.__version__,
        "backend": jax.default_backend(), "rounds_timed": rounds, "s_per_round": steady,
        "rounds_per_s": 1.0 / steady, "compile_s": max(0.0, times[0] - steady),
        "samples_per_s": samples / steady,
        "padding_efficiency": padding_efficiency(sizes, workload["batch"]),
        "peak_memory_bytes": peak_memory_bytes(),
    }


QUICK = [
    dict(method="fedavg", model="mlp", hidden=[200, 200], data="mnist", clients=20, samples=300, batch=32,
         epochs=1, lr=0.05, join_ratio=1.0),
    dict(method="fedavg", model="fedavgcnn", data="cifar", clients=20, samples=128, batch=32, epochs=1,
         lr=0.05, join_ratio=1.0),
]


def workloads_from_args(args) -> list[dict]:
    if args.quick:
        return QUICK
    out = []
    for method in args.methods.split(","):
        for model in args.models.split(","):
            for clients in (int(c) for c in args.clients.split(",")):
                out.append(dict(method=method, model=model, data="cifar" if model != "mlp" else "mnist",
                                hidden=[200, 200] if model == "mlp" else None, clients=clients,
                                samples=args.samples, batch=args.batch, epochs=args.epochs, lr=args.lr,
                                join_ratio=args.join_ratio, chunk=args.chunk, ragged=args.ragged))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="MLP and FedAvgCNN, 20 clients, under 2 minutes on 2 CPU cores")
    p.add_argument("--methods", default="fedavg")
    p.add_argument("--models", default="mlp,fedavgcnn")
    p.add_argument("--clients", default="20")
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--join-ratio", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--chunk", type=int, default=10)
    p.add_argument("--ragged", action="store_true", help="client sizes uniform in [samples/2, samples]")
    p.add_argument("--variants", default="engine-vmap,engine-map,engine-chunked,loop")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up round")
    p.add_argument("--out", help="also write the records to this JSONL file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick and args.rounds == 3:
        args.rounds = 2
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["workload"], spec["variant"], spec["rounds"])))
        return 0
    records = []
    for workload in workloads_from_args(args):
        variants = args.variants.split(",")
        if workload["method"] == "fedavg" and args.quick:
            variants = variants + ["loop-per-batch"]
        group = {}
        for variant in variants:
            spec = json.dumps({"workload": workload, "variant": variant, "rounds": args.rounds})
            proc = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"benchmark failed: {workload['method']}/{workload['model']} {variant}")
            group[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        base = group.get("loop")
        for rec in group.values():
            if base:
                rec["speedup_vs_loop"] = base["s_per_round"] / rec["s_per_round"]
            print(json.dumps(rec), flush=True)
            records.append(rec)
    if args.out:
        with open(args.out, "a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
