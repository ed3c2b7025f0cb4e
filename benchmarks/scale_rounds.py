"""Rounds per second and peak memory at cross-device scale: client state kept on the device or on the host.

For each method, client count N and variant, one child process builds random
MLR-shaped client data (``--samples`` a client, ``--features`` inputs, 10
classes; no files; drawn a block of clients at a time), runs a warm-up round
(its time is ``compile_s``) and then ``--rounds`` timed rounds with a cohort
of ``--cohort`` clients, and prints one JSON record: workload, variant
(``device``: `Engine`, every client's state [N, ...] on the device; ``host``:
engine/host_clients.py, only the cohort), store (``memory``: host NumPy;
``memmap``: the data and the host-kept state in memory-mapped .npy files in a
temporary folder, written through the file, so only a cohort's rows are read
into memory; ``--store auto``: memmap where the data and state pass half the
host memory available), device, rounds/s, compile s, peak device memory
(memory_stats, where the device reports it), peak host RSS beside the
estimate of engine/memory_estimate.py (``estimate_host_bytes``,
``peak_over_estimate``), and whether [N, ...] state and data would fit on the
device by the auto rule (``host_clients.choose``). The device variant is
skipped (a record saying so) where it would not fit.

    python benchmarks/scale_rounds.py --quick
    python benchmarks/scale_rounds.py --methods fedavg,ditto --clients 1000,10000,100000
    python benchmarks/scale_rounds.py --methods fedavg,ditto --clients 1000000 --variants host --store memmap
    python benchmarks/scale_rounds.py --clients 1000000 --variants host --store memmap --estimate-only
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


BLOCK_BYTES = 64 << 20  # random client data drawn this much at a time


def client_data(n: int, samples: int, features: int, classes: int, folder: str | None):
    """Random MLR-shaped ClientData [n, samples, features] float32 drawn a block of clients at a time (the same
    numbers either way): host NumPy, or with ``folder`` memory-mapped .npy files there, written through the
    file."""
    import numpy as np

    from fedjax_pfl.data.client_data import ClientData

    shapes = {"x": ((n, samples, features), np.float32), "y": ((n, samples), np.int32)}
    if folder is None:
        arrays = {k: np.empty(shape, dtype) for k, (shape, dtype) in shapes.items()}
    else:
        files = {k: open(f"{folder}/data_{k}.npy", "wb") for k in shapes}
        for k, (shape, dtype) in shapes.items():
            np.lib.format.write_array_header_1_0(files[k], {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                            "shape": shape})
    rng = np.random.default_rng(0)
    per_block = max(1, BLOCK_BYTES // (samples * features * 4))
    for start in range(0, n, per_block):
        count = min(per_block, n - start)
        block = {"x": rng.standard_normal((count, samples, features), np.float32),
                 "y": rng.integers(0, classes, size=(count, samples), dtype=np.int32)}
        for k, values in block.items():
            if folder is None:
                arrays[k][start:start + count] = values
            else:
                values.tofile(files[k])  # (no bytes copy of the block)
    if folder is not None:
        for f in files.values():
            f.close()
        arrays = {k: np.load(f"{folder}/data_{k}.npy", mmap_mode="r") for k in shapes}
    return ClientData(arrays["x"], arrays["y"], np.full(n, samples, np.int32))


def _child(spec: dict) -> dict:
    import shutil
    import tempfile

    import jax
    import numpy as np
    import optax

    from fedjax_pfl.data import client_limits
    from fedjax_pfl.data.client_limits import shown
    from fedjax_pfl.engine import host_clients, memory_estimate
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.methods.base import LocalSetup
    from fedjax_pfl.models.networks import build_model

    jax.devices()  # (the backend started: the process as the estimate's "process" counts it)
    process = client_limits.resident_bytes()
    n, samples, features, classes = spec["clients"], spec["samples"], spec["features"], 10
    model = build_model("mlr", (features,), classes)
    setup = LocalSetup(model=model, optimizer=functools.partial(optax.sgd, momentum=0.9), lr=0.05, batch_size=10,
                       local_epochs=1, normalize=lambda a: a, augment=None, drop_last=False,
                       persistent_optimizer=True, share_batch_stats=False, eval_model=None,
                       beyond_plain_sgd=("momentum",))
    method = get_method(spec["method"])(setup)
    data_bytes = n * samples * (features * 4 + 4)
    state = host_clients.state_bytes(method, n)
    needed = state + 2 * data_bytes
    available = spec.get("device_bytes") or host_clients.device_bytes()
    on_host, rule = host_clients.choose("auto", needed, available)
    host = spec["variant"] == "host"
    store = spec.get("store", "auto")
    if store == "auto":
        free = client_limits.available_bytes()
        store = "memmap" if host and free is not None and data_bytes + state > free // 2 else "memory"
    mapped = host and store == "memmap"
    shape = memory_estimate.Shape(n, (samples,), features * 4 + 4, 0 if host else data_bytes, in_place=True,
                                  state_bytes=state, on_host=host, mapped=mapped, records=False)
    est = memory_estimate.estimate(shape, process)
    record = {"workload": {k: spec[k] for k in ("method", "clients", "cohort", "samples", "features")},
              "variant": spec["variant"], "store": store, "device": device_name(), "state_and_data_bytes": needed,
              "fits_on_device": not on_host, "rule": rule, "estimate_host_bytes": est.host_bytes,
              "estimate": f"{shown(est.host_bytes)} ({est.phase}: {est.parts()})"}
    if spec["variant"] == "device" and on_host:
        return {**record, "skipped": "[N, ...] state and data would not fit on the device"}
    if spec.get("estimate_only"):
        return {**record, "skipped": "--estimate-only", "available_host_bytes": client_limits.available_bytes()}
    folder = tempfile.mkdtemp(prefix="fedjax_pfl-scale-") if mapped else None
    try:
        timed = _timed(spec, method, client_data(n, samples, features, classes, folder), folder)
        return {**record, **timed, "peak_over_estimate": round(timed["peak_host_rss_bytes"] / est.host_bytes, 3)}
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _timed(spec, method, data, folder) -> dict:
    """The warm-up round and ``spec['rounds']`` timed rounds of one variant -> its times and peak memory."""
    import jax
    import numpy as np

    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.engine import host_clients
    from fedjax_pfl.runs import config as run_config
    from fedjax_pfl.runs.experiment import engine_config

    config = dataclasses.replace(engine_config(run_config.TrainConfig(client_mapping="vmap"), spec["cohort"]),
                                 stream_chunks=False)
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
        host = host_clients.HostClients(engine_lib.Engine(method, data, data, config), folder=folder)
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
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rounds_per_s": rounds / seconds, "compile_s": compile_s,
            "peak_device_bytes": int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None,
            "peak_host_rss_bytes": peak}


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
    p.add_argument("--store", choices=("auto", "memory", "memmap"), default="auto",
                   help="where the host variant keeps data and state (auto: memmap past half the free memory)")
    p.add_argument("--estimate-only", action="store_true", help="each record's estimate, without making its data")
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
                        "device_bytes": args.device_bytes, "store": args.store,
                        "estimate_only": args.estimate_only}
                proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                      text=True)
                if proc.returncode != 0:
                    sys.exit(f"{method} N={n} {variant} failed:\n{proc.stderr[-3000:]}")
                print(proc.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
