"""Where a CNN's SGD step spends its time on this device, against the same step in PyTorch.

One client, FedAvgCNN on 28x28x1 (vs_pytorch.py's CNN workload; ``--model``
and ``--shape`` for others), ``--steps`` SGD steps of batch B inside one
jitted `lax.scan` (no engine, no padding, no data loading), after a warm-up
call, with the default convolution (``--conv-impl`` for another). Prints one
JSON line per batch size: samples/s and GFLOP/s of the JAX step (XLA's FLOP
count, benchmarks/flops.py) against a float32 matmul peak measured in the
same run, the milliseconds per step of each XLA op family (from a
jax.profiler trace; numbers stripped from op names) and, when torch is
installed, the same model and step in PyTorch (one ``backward`` +
``optimizer.step`` per batch, as torch_loop.py).

    python benchmarks/cnn_step.py              # B = 10 and 32
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

import flops  # noqa: E402 (benchmarks/ is on sys.path)
from common import device_name  # noqa: E402

from fedjax_pfl import losses  # noqa: E402
from fedjax_pfl.models.networks import build_model  # noqa: E402

SHAPE = (28, 28, 1)


def jax_steps(name: str, shape, batch: int, steps: int, top: int, conv_impl: str = "auto") -> dict:
    model = build_model(name, shape, 10, conv_impl=conv_impl)
    variables = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (steps, batch, *shape))
    y = jax.random.randint(jax.random.key(2), (steps, batch), 0, 10)

    @jax.jit
    def run(params, x, y):
        def step(p, xy):
            loss = lambda q: losses.cross_entropy(model.apply({**variables, "params": q}, xy[0], train=True).logits,  # noqa: E731
                                                  xy[1])
            return jax.tree.map(lambda a, g: a - 0.005 * g, p, jax.grad(loss)(p)), None
        return jax.lax.scan(step, params, (x, y))[0]

    jax.block_until_ready(run(variables["params"], x, y))
    began = time.perf_counter()
    jax.block_until_ready(run(variables["params"], x, y))
    seconds = time.perf_counter() - began
    trace_dir = tempfile.mkdtemp()
    with jax.profiler.trace(trace_dir):
        jax.block_until_ready(run(variables["params"], x, y))
    path = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
    totals = collections.Counter()
    for event in json.load(gzip.open(path))["traceEvents"]:
        name = event.get("name", "")
        if event.get("ph") == "X" and "dur" in event and not name.startswith(("$", "ThunkExecutor")):
            totals[name.split(".")[0].rstrip("0123456789_")] += event["dur"] / 1e3 / steps
    return {"samples_per_s": steps * batch / seconds, "ms_per_step": 1e3 * seconds / steps,
            "xla_ms_per_step": {k: round(v, 3) for k, v in totals.most_common(top)}}


def torch_steps(name: str, shape, batch: int, steps: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    import torch_loop

    threads = torch_loop.set_threads()
    seconds = torch_loop.sgd_steps_seconds(name, shape, 10, batch, steps, reps=1)
    return {"samples_per_s": batch / seconds, "ms_per_step": 1e3 * seconds, "threads": threads,
            "torch": torch.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="fedavgcnn", help="fedavgcnn, lenet or resnet8")
    p.add_argument("--shape", default="28,28,1", help="input H,W,C")
    p.add_argument("--conv-impl", default="auto")
    p.add_argument("--batches", default="10,32")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--matmul-size", type=int, default=2048)
    args = p.parse_args(argv)
    shape = tuple(int(a) for a in args.shape.split(","))
    peak = flops.matmul_peak(args.matmul_size, "fp32", chain=4)["flops_per_s"]
    for batch in map(int, args.batches.split(",")):
        ours = jax_steps(args.model, shape, batch, args.steps, args.top, args.conv_impl)
        theirs = torch_steps(args.model, shape, batch, args.steps)
        step_flops = flops.step_flops(args.model, shape, 10, batch)
        for side in filter(None, (ours, theirs)):
            side["gflops"] = step_flops * 1e3 / side["ms_per_step"] / 1e9 if step_flops else None
            side["of_peak"] = side["gflops"] * 1e9 / peak if step_flops else None
        print(json.dumps({"benchmark": "cnn_step", "workload": {"model": args.model, "input": shape, "batch": batch,
                                                                 "steps": args.steps, "conv_impl": args.conv_impl},
                          "device": device_name(), "flops_per_step": step_flops, "matmul_peak_gflops": peak / 1e9,
                          "load_avg_1min": round(os.getloadavg()[0], 2), "jax": ours, "pytorch": theirs,
                          "ratio": theirs["ms_per_step"] / ours["ms_per_step"] if theirs else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
