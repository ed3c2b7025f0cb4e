"""Where a FedAvgCNN SGD step spends its time on this device, against the same step in PyTorch.

One client, FedAvgCNN on 28x28x1 (vs_pytorch.py's CNN workload), ``--steps``
SGD steps of batch B inside one jitted `lax.scan` (no engine, no padding, no
data loading), after a warm-up call. Prints one JSON line per batch size:
samples/s of the JAX step, the milliseconds per step of each XLA op family
(from a jax.profiler trace; numbers stripped from op names) and, when torch
is installed, samples/s of the same model and step in PyTorch (one
``backward`` + ``optimizer.step`` per batch, as torch_loop.py).

    python benchmarks/cnn_step.py              # B = 10 and 32
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

from common import device_name  # noqa: E402 (benchmarks/ is on sys.path)

from fedjax_pfl import losses  # noqa: E402
from fedjax_pfl.models.networks import build_model  # noqa: E402

SHAPE = (28, 28, 1)


def jax_steps(batch: int, steps: int, top: int) -> dict:
    model = build_model("fedavgcnn", SHAPE, 10)
    variables = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (steps, batch, *SHAPE))
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


def torch_steps(batch: int, steps: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    import torch_loop

    threads = torch_loop.set_threads()
    model = torch_loop.build_model("fedavgcnn", SHAPE, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.005)
    x = torch.randn(steps, batch, SHAPE[2], SHAPE[0], SHAPE[1])
    y = torch.randint(0, 10, (steps, batch))

    def run():
        for i in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i]), y[i]).backward()
            opt.step()

    run()
    began = time.perf_counter()
    run()
    seconds = time.perf_counter() - began
    return {"samples_per_s": steps * batch / seconds, "ms_per_step": 1e3 * seconds / steps, "threads": threads,
            "torch": torch.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="10,32")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--top", type=int, default=10)
    args = p.parse_args(argv)
    for batch in map(int, args.batches.split(",")):
        ours, theirs = jax_steps(batch, args.steps, args.top), torch_steps(batch, args.steps)
        print(json.dumps({"benchmark": "cnn_step", "workload": {"model": "fedavgcnn", "input": SHAPE, "batch": batch,
                                                                 "steps": args.steps},
                          "device": device_name(), "jax": ours, "pytorch": theirs,
                          "ratio": theirs["ms_per_step"] / ours["ms_per_step"] if theirs else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
