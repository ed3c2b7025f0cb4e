"""Memory of one compiled round: whole-gather vs chunk-by-chunk (streamed) rounds.

For each workload (method, clients, all selected) and each variant, compiles
one round (nothing runs: no timing, cheap) and prints XLA's
``memory_analysis()`` of it as one JSON record: temp, argument, output,
aliased (outputs that reuse donated arguments) and total = temp + argument +
output - aliased bytes, the client state's bytes, and bytes per selected
client (temp / S: what the round holds beyond its inputs). Variants:

- ``vmap``: every selected client at once;
- ``chunked-whole``: ``chunked`` gathering all S selected clients first
  (EngineConfig.stream_chunks=False; the behaviour before streaming);
- ``chunked``: gather, train and scatter chunk by chunk (the default).

Each record also gives its temp and total bytes as a ratio to ``chunked``'s
of the same workload. CIFAR shapes by default (FedAvgCNN, 32x32x3; the
samples per client only size the data).

    python benchmarks/memory.py --quick
    python benchmarks/memory.py --methods fedas,fedavg --clients 100,1000
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from common import device_name  # noqa: E402 (benchmarks/ is on sys.path)
from rounds_per_second import build

VARIANTS = {"vmap": ("vmap", True), "chunked-whole": ("chunked", False), "chunked": ("chunked", True)}


def round_memory(workload: dict, variant: str) -> dict:
    """memory_analysis() bytes of one compiled round of ``workload`` under ``variant``."""
    import jax
    import jax.numpy as jnp

    from fedjax_pfl.engine import engine as engine_lib

    mapping, stream = VARIANTS[variant]
    engine, _ = build(workload, mapping)
    engine = engine_lib.Engine(engine.method, engine.train, engine.test,
                               dataclasses.replace(engine.config, stream_chunks=stream))
    server, clients = jax.eval_shape(engine.init, jax.random.key(0))
    m = engine._round.lower(server, clients, engine.train, jax.random.key(1), jnp.int32(1), {}).compile()
    m = m.memory_analysis()
    out = {"temp_bytes": m.temp_size_in_bytes, "argument_bytes": m.argument_size_in_bytes,
           "output_bytes": m.output_size_in_bytes, "aliased_bytes": m.alias_size_in_bytes}
    out["total_bytes"] = out["temp_bytes"] + out["argument_bytes"] + out["output_bytes"] - out["aliased_bytes"]
    out["client_state_bytes"] = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(clients))
    out["temp_bytes_per_selected_client"] = out["temp_bytes"] / engine.config.clients_per_round
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default="fedas,fedavg")
    p.add_argument("--clients", default="100,1000")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--model", default="fedavgcnn")
    p.add_argument("--data", default="cifar", choices=["cifar", "mnist"])
    p.add_argument("--samples", type=int, default=8, help="per client (sizes only the data)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--chunk", type=int, default=8, help="train.chunk_size")
    p.add_argument("--quick", action="store_true", help="a tiny MLP, 6 clients, FedAS (for the tests)")
    a = p.parse_args(argv)
    if a.quick:
        a.methods, a.clients, a.model, a.chunk = "fedas", "6", "mlp", 2
    device = device_name()
    for method in a.methods.split(","):
        for clients in map(int, a.clients.split(",")):
            workload = {"method": method, "model": a.model, "data": a.data, "clients": clients, "samples": a.samples,
                        "batch": a.batch, "epochs": 1, "lr": 0.01, "join_ratio": 1.0, "chunk": a.chunk,
                        **({"hidden": [8]} if a.quick else {})}
            records = {v: round_memory(workload, v) for v in a.variants.split(",")}
            after = records.get("chunked")
            for variant, mem in records.items():
                ratios = {f"{k}_vs_chunked": mem[f"{k}_bytes"] / after[f"{k}_bytes"]
                          for k in ("temp", "total")} if after else {}
                print(json.dumps({"workload": workload, "variant": variant, "device": device, **mem, **ratios}),
                      flush=True)


if __name__ == "__main__":
    main()
