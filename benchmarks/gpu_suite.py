"""The GPU suite: one command, one report (suite.md + suite.json in --out).

    python benchmarks/gpu_suite.py --out gpu_report          # on the GPU machine, once
    python benchmarks/gpu_suite.py --quick --out /tmp/suite  # tiny sizes, CPU, seconds

What it measures, in order:

1. the device name and a measured matmul peak: a jitted loop of 10 square
   matmuls (``--matmul-size``, 8192 by default) in bf16 and in fp32 at JAX's
   default precision (what model training uses; on NVIDIA GPUs that may use
   TF32), best of 3, FLOPs = 2 n^3 per matmul;
2. FedAvg and FedAS with FedAvgCNN on CIFAR shapes (random uint8 32x32x3
   images, 10 labels, no files needed: timing does not depend on pixel
   values), ``--train-samples``/``--test-samples`` pooled and split over 20, 100
   and 1000 clients by Dirichlet(0.1) on the labels, each client's pool 75/25
   train/test (fedjax_pfl's own partition and experiment builder); B=16, E=5,
   every client every round; for each client mapping (vmap / chunked / map)
   and convolution (native / im2col), in a child process of its own: a
   warm-up round (compile s = its time minus the steady time), then
   ``--rounds`` timed rounds: rounds/s, compile s, peak device memory (the
   child's), padding efficiency (real / executed client-steps), samples/s and
   achieved FLOP/s as a fraction of the fp32 peak. FLOPs are counted as
   (XLA cost_analysis FLOPs of ONE lowered SGD step of the model on a batch
   of B) x (real client-steps of the round): the round's own cost_analysis
   cannot be used since it counts a while loop's body once. FedAS's extra
   passes (Fisher, class means, alignment) are not counted, so its fraction is
   a lower bound;
3. the same FedAvg workload through the PyTorch per-client loop
   (benchmarks/torch_loop.py) on the same client arrays, when torch is
   installed (CUDA when available): training s/round and evaluation s/round.
   FedAS has no PyTorch twin here.

A configuration that fails or runs past ``--child-timeout`` is recorded with
its error and the suite goes on. Records are appended to suite.jsonl as they
finish, so an interrupted suite keeps what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from common import device_name, peak_memory_bytes  # noqa: E402 (benchmarks/ is on sys.path)

SHAPE = (32, 32, 3)


def random_cifar_like(train_samples: int, test_samples: int, seed: int = 0):
    """A Dataset of random uint8 32x32x3 images with uniform labels over 10 classes."""
    import numpy as np

    from fedjax_pfl.data.dataset import Dataset

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (train_samples + test_samples, *SHAPE), dtype=np.uint8)
    y = rng.integers(0, 10, train_samples + test_samples).astype(np.int32)
    return Dataset("random_cifar_shapes", x[:train_samples], y[:train_samples], x[train_samples:],
                   y[train_samples:], 10, (0.5,) * 3, (0.25,) * 3)


def build(spec: dict):
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment

    overrides = [
        f"method_name={spec['method']}", "data.name=cifar10", "partition.scheme=dirichlet", "partition.alpha=0.1",
        f"partition.num_clients={spec['clients']}", f"partition.min_size={spec['min_size']}",
        "model.name=fedavgcnn", f"model.conv_impl={spec['conv']}", f"train.batch_size={spec['batch']}",
        f"train.local_epochs={spec['epochs']}", f"train.lr={spec['lr']}", f"train.join_ratio={spec['join_ratio']}",
        f"train.client_mapping={'map' if spec['mapping'] == 'loop' else spec['mapping']}",
        f"train.chunk_size={spec['chunk']}",
    ]
    cfg = config_lib.build(None, overrides)
    return build_experiment(cfg, dataset=random_cifar_like(spec["train_samples"], spec["test_samples"]))


def step_flops(model, batch: int, lr: float) -> float | None:
    """XLA's FLOP count of one SGD step (forward, backward, update) on a batch, or None.

    The HLO cost analysis of the lowered (not compiled) step: backend-independent
    and costs no compile (within 0.4% of the compiled CPU count for FedAvgCNN).
    """
    import jax
    import jax.numpy as jnp

    from fedjax_pfl import losses

    def step(params, x, y):
        grads = jax.grad(lambda p: losses.cross_entropy(model.apply({"params": p}, x, train=True).logits, y))(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads)

    params = model.init(jax.random.key(0))["params"]
    x = jnp.zeros((batch, *model.input_shape), jnp.float32)
    y = jnp.zeros((batch,), jnp.int32)
    try:
        cost = jax.jit(step).lower(params, x, y).cost_analysis()
    except Exception:  # noqa: BLE001 (some backends have no cost model)
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def measure_jax(spec: dict) -> dict:
    import jax
    import numpy as np

    from fedjax_pfl.engine.engine import round_keys

    exp = build(spec)
    engine = exp.engine
    key = jax.random.key(0)
    server, clients = engine.init(key)
    times, real, executed = [], 0, 0
    for t in range(spec["rounds"] + 1):
        start = time.perf_counter()
        server, clients, metrics = engine.round(server, clients, round_keys(key, t)[0], t)
        jax.block_until_ready((server, clients, metrics))
        times.append(time.perf_counter() - start)
        if t > 0:
            real += int(metrics["real_steps"])
            executed += int(metrics["executed_steps"])
    if not all(bool(np.isfinite(np.asarray(a)).all()) for a in jax.tree.leaves((server, clients))
               if a.dtype.kind == "f"):
        raise RuntimeError("non-finite state")
    steady = float(np.median(times[1:]))
    flops = step_flops(engine.method.model, spec["batch"], spec["lr"])
    rounds = spec["rounds"]
    selected = engine.config.clients_per_round
    samples = spec["epochs"] * float(np.asarray(exp.data.train.n).mean()) * selected
    achieved = flops * real / rounds / steady if flops else None
    return {
        "rounds_per_s": 1.0 / steady, "s_per_round": steady, "compile_s": max(0.0, times[0] - steady),
        "peak_memory_bytes": peak_memory_bytes(), "padding_efficiency": real / max(executed, 1),
        "real_client_steps_per_round": real / rounds, "samples_per_s": samples / steady,
        "flops_per_step": flops, "achieved_flops_per_s": achieved, "client_mapping": engine.mapping,
    }


def measure_torch(spec: dict) -> dict:
    import torch

    import torch_loop
    from vs_pytorch import client_arrays

    threads = torch_loop.set_threads()
    exp = build(spec)
    train, test = client_arrays(exp)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch_loop.build_model("fedavgcnn", SHAPE, 10)
    sim = torch_loop.Simulator("fedavg", model, train, test, batch_size=spec["batch"], local_epochs=spec["epochs"],
                               lr=spec["lr"], device=device)
    everyone = list(range(len(train)))
    timed = torch_loop.time_rounds(sim, spec["rounds"], lambda t: everyone)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else peak_memory_bytes()
    return {"rounds_per_s": 1.0 / timed["train_s"], "s_per_round": timed["train_s"], "eval_s": timed["eval_s"],
            "peak_memory_bytes": int(peak), "torch": torch.__version__, "torch_device": device,
            "torch_threads": threads}


def matmul_peak(n: int, dtype_name: str, reps: int = 3, chain: int = 10) -> dict:
    """Best FLOP/s of a jitted chain of ``chain`` n x n matmuls in ``dtype_name``."""
    import jax
    import jax.numpy as jnp

    dtype = {"bf16": jnp.bfloat16, "fp32": jnp.float32}[dtype_name]
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), dtype)
    b = (jax.random.normal(kb, (n, n), jnp.float32) / n ** 0.5).astype(dtype)

    @jax.jit
    def run(a, b):
        return jax.lax.fori_loop(0, chain, lambda i, c: c @ b, a)

    jax.block_until_ready(run(a, b))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(run(a, b))
        best = min(best, time.perf_counter() - start)
    return {"dtype": dtype_name, "n": n, "seconds": best, "flops_per_s": 2.0 * n ** 3 * chain / best}


def run_spec(side: str, spec: dict, in_process: bool, timeout: float) -> dict:
    label = {k: spec[k] for k in ("method", "clients", "mapping", "conv")}
    try:
        if in_process:
            out = (measure_jax if side == "jax" else measure_torch)(spec)
        else:
            child = json.dumps({"side": side, "spec": spec})
            proc = subprocess.run([sys.executable, __file__, "--child", child], capture_output=True, text=True,
                                  timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        out = {"error": f"ran past --child-timeout {timeout:g} s"}
    except Exception as e:  # noqa: BLE001 (a failed configuration is a result, the suite goes on)
        out = {"error": f"{type(e).__name__}: {e}"[:500]}
    return {"side": side, **label, **out}


def markdown(report: dict) -> str:
    fmt = lambda v, spec=".3g": "-" if v is None else format(v, spec)  # noqa: E731
    lines = [f"# GPU suite: {report['device']}", "",
             f"jax {report['jax']}, backend {report['backend']}, python {report['python']}, "
             f"load average {report['load_avg_1min']}", "", f"Workload: {report['workload']}", "",
             "| matmul | n | TFLOP/s |", "|---|---|---|"]
    for p in report["matmul_peak"]:
        lines.append(f"| {p['dtype']} | {p['n']} | {fmt(p['flops_per_s'] / 1e12)} |")
    lines += ["", "| side | method | clients | mapping | conv | rounds/s | s/round | compile s | peak MiB | "
              "padding eff. | samples/s | TFLOP/s | of fp32 peak |", "|" + "---|" * 13]
    peak = next((p["flops_per_s"] for p in report["matmul_peak"] if p["dtype"] == "fp32"), None)
    for r in report["records"]:
        if "error" in r:
            lines.append(f"| {r['side']} | {r['method']} | {r['clients']} | {r['mapping']} | {r['conv']} | "
                         f"error: {r['error'][:120]} |" + " |" * 8)
            continue
        achieved = r.get("achieved_flops_per_s")
        frac = achieved / peak if achieved and peak else None
        lines.append(
            f"| {r['side']} | {r['method']} | {r['clients']} | {r['mapping']} | {r['conv']} | "
            f"{fmt(r['rounds_per_s'])} | {fmt(r['s_per_round'])} | {fmt(r.get('compile_s'))} | "
            f"{fmt(r['peak_memory_bytes'] / 2**20, '.0f')} | {fmt(r.get('padding_efficiency'))} | "
            f"{fmt(r.get('samples_per_s'), '.0f')} | {fmt(achieved and achieved / 1e12)} | {fmt(frac, '.1%')} |")
    lines += ["", "FLOP/s count one SGD step's XLA FLOPs x real client-steps (FedAS extras not counted). "
              "PyTorch rows: FedAvg through the per-client loop; peak memory is torch.cuda.max_memory_allocated "
              "on CUDA, process RSS on CPU.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu_suite_report", help="folder for suite.md, suite.json, suite.jsonl")
    p.add_argument("--quick", action="store_true", help="tiny sizes, in one process: a CPU check in seconds")
    p.add_argument("--methods", default="fedavg,fedas")
    p.add_argument("--clients", default="20,100,1000")
    p.add_argument("--mappings", default="vmap,chunked,map")
    p.add_argument("--convs", default="native,im2col")
    p.add_argument("--train-samples", type=int, default=45000)
    p.add_argument("--test-samples", type=int, default=15000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--join-ratio", type=float, default=1.0)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up round")
    p.add_argument("--matmul-size", type=int, default=8192)
    p.add_argument("--child-timeout", type=float, default=900.0)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        print(json.dumps((measure_jax if job["side"] == "jax" else measure_torch)(job["spec"])))
        return 0
    if args.quick:
        args.clients, args.train_samples, args.test_samples = "4", 96, 32
        args.epochs, args.rounds, args.matmul_size = 1, 1, 128
        if args.convs == p.get_default("convs"):
            args.convs = "im2col"
        if args.mappings == p.get_default("mappings"):
            args.mappings = "vmap,map"

    import jax

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "suite.jsonl"
    jsonl.unlink(missing_ok=True)
    base = dict(batch=args.batch, epochs=args.epochs, lr=args.lr, join_ratio=args.join_ratio, chunk=args.chunk,
                train_samples=args.train_samples, test_samples=args.test_samples, rounds=args.rounds)
    report = {
        "benchmark": "gpu_suite", "device": device_name(), "jax": jax.__version__, "backend": jax.default_backend(),
        "python": platform.python_version(), "load_avg_1min": round(os.getloadavg()[0], 2),
        "workload": (f"FedAvgCNN 32x32x3 random images, Dirichlet 0.1 over {args.train_samples}+{args.test_samples} "
                     f"samples, B={args.batch}, E={args.epochs}, join ratio {args.join_ratio}, lr {args.lr}, "
                     f"{args.rounds} timed rounds after a warm-up round"),
        "matmul_peak": [matmul_peak(args.matmul_size, d) for d in ("bf16", "fp32")], "records": [],
    }
    jobs = [("jax", dict(base, method=m, clients=int(c), mapping=mp, conv=cv))
            for m, c, mp, cv in itertools.product(args.methods.split(","), args.clients.split(","),
                                                  args.mappings.split(","), args.convs.split(","))]
    has_torch = False
    if args.no_torch:
        report["torch_note"] = "--no-torch given: no PyTorch rows"
    else:
        try:
            import torch  # noqa: F401
            has_torch = True
        except ImportError:
            report["torch_note"] = "torch is not installed (pip install 'fedjax_pfl[bench]'): no PyTorch rows"
    if has_torch and "fedavg" in args.methods.split(","):
        jobs += [("torch", dict(base, method="fedavg", clients=int(c), mapping="loop", conv="native"))
                 for c in args.clients.split(",")]
    for side, spec in jobs:
        spec["min_size"] = max(1, min(10, args.train_samples // (4 * spec["clients"])))
        record = run_spec(side, spec, args.quick, args.child_timeout)
        report["records"].append(record)
        with open(jsonl, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    (out / "suite.json").write_text(json.dumps(report, indent=1))
    (out / "suite.md").write_text(markdown(report))
    print(f"wrote {out / 'suite.md'} and {out / 'suite.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
