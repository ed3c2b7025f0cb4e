"""Times the direct, im2col and native convolutions (and, by name, the Pallas one) for FedAvgCNN local training.

Workload: one client's local training is a ``lax.scan`` of ``--steps`` SGD
steps (batch ``--batch``, 32x32x3 inputs, 10 classes, cross-entropy) of
``fedavgcnn`` built by ``fedjax_pfl.models.networks``. It runs for one client
('seq'), for ``--clients`` clients with ``vmap`` ('vmap', per-client weights)
and with ``lax.map`` ('map'). Each (implementation, mode) runs in a fresh
subprocess so its peak RSS is its own. Compile time is reported apart from
run time (the best of ``--reps`` runs; native runs once, it is slow). Other
processes on the machine inflate the times: the 1-minute load average is
reported. Prints one JSON object.

    python benchmarks/conv_impl.py [--steps 16] [--batch 32] [--clients 4]
        [--impls direct,im2col,native] [--modes seq,vmap,map]

``--impls direct,pallas --modes vmap --clients 100`` times the Pallas kernels
(models/pallas_conv.py) on a GPU; on a CPU they run in interpret mode (slow,
not a speed figure), so they are not among the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

IMPLS = ("direct", "im2col", "native")  # the defaults; "pallas" by name
MODES = ("seq", "vmap", "map")


def run_one(impl: str, mode: str, steps: int, batch: int, clients: int, reps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax
    from jax import lax

    from fedjax_pfl.models.networks import build_model

    model = build_model("fedavgcnn", (32, 32, 3), 10, conv_impl=impl)
    opt = optax.sgd(0.01)

    def loss_fn(params, x, y):
        logits = model.apply({"params": params}, x).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def local_train(params, xs, ys):
        def step(carry, batch_xy):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch_xy)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, _), losses = lax.scan(step, (params, opt.init(params)), (xs, ys))
        return params, losses.mean()

    n = 1 if mode == "seq" else clients
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = jax.vmap(lambda k: model.init(k)["params"])(jax.random.split(keys[0], n))
    xs = jax.random.normal(keys[1], (n, steps, batch, 32, 32, 3), jnp.float32)
    ys = jax.random.randint(keys[2], (n, steps, batch), 0, 10)
    if mode == "seq":
        fn, args = local_train, jax.tree.map(lambda a: a[0], (params, xs, ys))
    elif mode == "vmap":
        fn, args = jax.vmap(local_train), (params, xs, ys)
    else:
        fn, args = (lambda p, x, y: lax.map(lambda a: local_train(*a), (p, x, y))), (params, xs, ys)

    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    run_s = min(times)
    return {
        "impl": impl, "mode": mode, "clients": n, "compile_s": round(compile_s, 3),
        "run_s": round(run_s, 4), "reps": reps,
        "s_per_step": round(run_s / steps, 5),
        "s_per_client_step": round(run_s / steps / n, 5),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--reps", type=int, default=3, help="timed runs for direct and im2col (native: 1)")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--one", nargs=2, metavar=("IMPL", "MODE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        impl, mode = a.one
        reps = a.reps if impl != "native" else 1
        print(json.dumps(run_one(impl, mode, a.steps, a.batch, a.clients, reps)))
        return

    import jax

    impls, modes = a.impls.split(","), a.modes.split(",")
    load_before = os.getloadavg()[0]
    results = []
    for mode in modes:
        for impl in impls:
            cmd = [sys.executable, __file__, "--one", impl, mode, "--steps", str(a.steps),
                   "--batch", str(a.batch), "--clients", str(a.clients), "--reps", str(a.reps)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
    by = {(r["impl"], r["mode"]): r for r in results}
    print(json.dumps({
        "benchmark": "conv_impl",
        "workload": (f"fedavgcnn 32x32x3, 10 classes, local training lax.scan of {a.steps} "
                     f"SGD steps, batch {a.batch}; seq = 1 client, vmap/map = {a.clients} "
                     "clients with their own weights"),
        "device": str(jax.devices()[0]), "backend": jax.default_backend(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "jax": jax.__version__,
        "load_avg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "results": results,
        "native_over_im2col_run_time": {
            m: round(by[("native", m)]["run_s"] / by[("im2col", m)]["run_s"], 2)
            for m in modes if ("native", m) in by and ("im2col", m) in by},
        "im2col_over_direct_run_time": {
            m: round(by[("im2col", m)]["run_s"] / by[("direct", m)]["run_s"], 2)
            for m in modes if ("im2col", m) in by and ("direct", m) in by},
    }, indent=1))


if __name__ == "__main__":
    main()
