"""Rounds per second and peak memory at cross-device scale: client state kept on the device or on the host.

For each method, client count N and variant, one child process builds random
MLR-shaped client data (``--samples`` a client, ``--features`` inputs, 10
classes; no files), runs a warm-up round (its time is ``compile_s``) and then
``--rounds`` timed rounds with a cohort of ``--cohort`` clients, and prints one
JSON record: workload, variant (``device``: `Engine`, every client's state
[N, ...] on the device; ``host``: engine/host_clients.py, only the cohort),
device, rounds/s, compile s, peak device memory (memory_stats, where the
device reports it), peak host RSS, and whether [N, ...] state and data would
fit on the device by the auto rule (``host_clients.choose``). The device
variant is skipped (a record saying so) where it would not fit.

    python benchmarks/scale_rounds.py --quick
    python benchmarks/scale_rounds.py --methods fedavg,ditto --clients 1000,10000,100000
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import resource
import subprocess
import sys
import time

from common import device_name  # noqa: E402 (benchmarks/ is on sys.path)


def _child(spec: dict) -> dict:
    import jax
    import numpy as np
    import optax

    from fedjax_pfl.data.client_data import ClientData
    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.engine import host_clients
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.methods.base import LocalSetup
    from fedjax_pfl.models.networks import build_model
    from fedjax_pfl.runs import config as run_config
    from fedjax_pfl.runs import experiment

    n, samples, features, classes = spec["clients"], spec["samples"], spec["features"], 10
    rng = np.random.default_rng(0)
    data = ClientData(rng.normal(size=(n, samples, features)).astype(np.float32),
                      rng.integers(0, classes, size=(n, samples)).astype(np.int32),
                      np.full(n, samples, np.int32))
    model = build_model("mlr", (features,), classes)
    setup = LocalSetup(model=model, optimizer=functools.partial(optax.sgd, momentum=0.9), lr=0.05, batch_size=10,
                       local_epochs=1, normalize=lambda a: a, augment=None, drop_last=False,
                       persistent_optimizer=True, share_batch_stats=False, eval_model=None,
                       beyond_plain_sgd=("momentum",))
    method = get_method(spec["method"])(setup)
    config = dataclasses.replace(experiment.engine_config(run_config.TrainConfig(client_mapping="vmap"),
                                                          spec["cohort"]), stream_chunks=False)
    needed = host_clients.state_bytes(method, n) + 2 * host_clients.data_bytes(data)
    available = spec.get("device_bytes") or host_clients.device_bytes()
    on_host, rule = host_clients.choose("auto", needed, available)
    record = {"workload": {k: spec[k] for k in ("method", "clients", "cohort", "samples", "features")},
              "variant": spec["variant"], "device": device_name(), "state_and_data_bytes": needed,
              "fits_on_device": not on_host, "rule": rule}
    if spec["variant"] == "device" and on_host:
        return {**record, "skipped": "[N, ...] state and data would not fit on the device"}
    key = jax.random.PRNGKey(0)
    rounds = spec["rounds"]
    if spec["variant"] == "device":  # the data on the device once, as a run holds them
        placed = jax.device_put(data)
        engine = engine_lib.Engine(method, placed, placed, config)
        server, clients = engine.init(key)
        start = time.perf_counter()
        server, clients, _ = engine.round(server, clients, engine_lib.round_keys(key, 0)[0], 0)
        jax.block_until_ready(clients)
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        for t in range(1, rounds + 1):
            server, clients, _ = engine.round(server, clients, engine_lib.round_keys(key, t)[0], t)
        jax.block_until_ready((server, clients))
    else:
        host = host_clients.HostClients(engine_lib.Engine(method, data, data, config))
        server = host.init(key)
        start = time.perf_counter()
        server, _ = host.run(server, key, 1)
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        server, _ = host.run(server, key, rounds + 1, first=1)
        jax.block_until_ready(server)
    seconds = time.perf_counter() - start
    if not all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(server)):
        raise RuntimeError("non-finite server state")
    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    return {**record, "rounds_per_s": rounds / seconds, "compile_s": compile_s,
            "peak_device_bytes": int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None,
            "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="fedavg,ditto")  # MLR has no body: FedPer would be Local
    p.add_argument("--clients", default="1000,10000,100000")
    p.add_argument("--variants", default="device,host")
    p.add_argument("--cohort", type=int, default=50)
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--features", type=int, default=60)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--device-bytes", type=int, default=None, help="device memory for the fit rule (default: asked)")
    p.add_argument("--quick", action="store_true", help="1,000 and 10,000 clients, 3 rounds, 20 features")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    if args.quick:
        args.clients, args.rounds, args.features = "1000,10000", 3, 20
    for method in args.methods.split(","):
        for n in (int(c) for c in args.clients.split(",")):
            for variant in args.variants.split(","):
                spec = {"method": method, "clients": n, "cohort": args.cohort, "samples": args.samples,
                        "features": args.features, "rounds": args.rounds, "variant": variant,
                        "device_bytes": args.device_bytes}
                proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                      text=True)
                if proc.returncode != 0:
                    sys.exit(f"{method} N={n} {variant} failed:\n{proc.stderr[-3000:]}")
                print(proc.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
