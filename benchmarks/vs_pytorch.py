"""fedjax_pfl against the usual PyTorch per-client loop, same clients, samples, steps and evaluation.

For each workload (method, model, batch size, partition) both sides get the
identical client arrays, made by fedjax_pfl's own partition and experiment
builder (Fashion-MNIST, 20 clients, Dirichlet 0.1 or iid, each client's pool
split 75/25 train/test). Every client trains every round (join ratio 1),
E local epochs of ceil(n_i/B) SGD steps, the last batch partial; then every
client is evaluated on its test set (batches of 256 on both sides). Each side
runs in its own child process.

- fedjax_pfl: a warm-up round and evaluation (compile time = their time minus
  the steady time), then ``--rounds`` timed rounds; ``Engine.round`` and
  ``Engine.evaluate`` each timed to completion. Padding efficiency is the
  real over executed client-steps the engine reports for the timed rounds.
- PyTorch (benchmarks/torch_loop.py, the `bench` extra): one warm-up step,
  then the same number of timed rounds. ``torch.set_num_threads`` is set to
  the machine's core count; XLA:CPU uses all cores by default.

One JSON line per workload: seconds per round for training and evaluation
(medians), compile seconds, samples/s, padding efficiency, final accuracy of
both sides (a sanity check, not a comparison: different initial values),
and ratios PyTorch time / fedjax_pfl time for training alone and end to end
(training + evaluation per round, compile excluded; compile is reported).
Without torch the PyTorch fields are null and ``torch_note`` says why.

    python benchmarks/vs_pytorch.py --quick     # < 5 min on 2 cores: FedAvg, FedAvgCNN B=10 and 32, MLP B=10, Dirichlet 0.1
    python benchmarks/vs_pytorch.py             # all 12 workloads, 3 timed rounds
    python benchmarks/vs_pytorch.py --tiny      # seconds: a mechanism check (tests)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from common import device_name, peak_memory_bytes  # noqa: E402 (benchmarks/ is on sys.path)

MODELS = {"fedavgcnn": None, "mlp": (100,)}  # model -> hidden sizes (MLP 784-100-10)


def workload_list(args) -> list[dict]:
    if args.tiny:
        return [dict(method="fedavg", model="mlp", batch=10, partition="dirichlet", clients=4, epochs=1,
                     lr=0.005, train_per_client=20, test_per_client=10)]
    out = []
    for partition in args.partitions.split(","):
        for method in args.methods.split(","):
            for model_batch in args.models.split(","):
                model, batch = model_batch.split(":")
                out.append(dict(method=method, model=model, batch=int(batch), partition=partition,
                                clients=args.clients, epochs=args.epochs, lr=args.lr))
    return out


def build(workload: dict):
    """The fedjax_pfl Experiment of a workload (Fashion-MNIST from FEDJAX_PFL_DATA_DIR or --data-dir)."""
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment

    hidden = MODELS[workload["model"]]
    overrides = [
        f"method_name={workload['method']}", "data.name=fmnist", f"partition.scheme={workload['partition']}",
        f"partition.num_clients={workload['clients']}", "partition.alpha=0.1", f"model.name={workload['model']}",
        f"train.batch_size={workload['batch']}", f"train.local_epochs={workload['epochs']}",
        f"train.lr={workload['lr']}", "train.join_ratio=1.0",
    ]
    if hidden:
        overrides.append(f"model.hidden={list(hidden)}")
    for key in ("train_per_client", "test_per_client"):
        if workload.get(key):
            overrides.append(f"partition.{key}={workload[key]}")
    cfg = config_lib.build(None, overrides)
    if workload.get("data_dir"):
        cfg.data.data_dir = workload["data_dir"]
    return build_experiment(cfg)


def measure_jax(workload: dict, rounds: int) -> dict:
    import jax
    import numpy as np

    from fedjax_pfl.engine.engine import round_keys, summarize_evaluation

    exp = build(workload)
    engine = exp.engine
    key = jax.random.key(0)
    server, clients = engine.init(key)
    train_s, eval_s, real, executed = [], [], 0, 0
    for t in range(rounds + 1):
        round_key, eval_key = round_keys(key, t)
        start = time.perf_counter()
        server, clients, metrics = engine.round(server, clients, round_key, t)
        jax.block_until_ready((server, clients, metrics))
        mid = time.perf_counter()
        evaluation = engine.evaluate(server, clients, eval_key)
        train_s.append(mid - start)
        eval_s.append(time.perf_counter() - mid)
        if t > 0:
            real += int(metrics["real_steps"])
            executed += int(metrics["executed_steps"])
    leaves = jax.tree.leaves((server, clients))
    if not all(bool(np.isfinite(np.asarray(a)).all()) for a in leaves if a.dtype.kind == "f"):
        raise RuntimeError(f"fedjax_pfl on {workload}: non-finite state")
    train, ev = statistics.median(train_s[1:]), statistics.median(eval_s[1:])
    samples = workload["epochs"] * int(np.asarray(exp.data.train.n).sum())
    return {
        "train_s_per_round": train, "eval_s_per_round": ev, "e2e_s_per_round": train + ev,
        "compile_s": max(0.0, train_s[0] - train) + max(0.0, eval_s[0] - ev),
        "samples_per_s": samples / train, "padding_efficiency": real / max(executed, 1),
        "real_client_steps": real, "executed_client_steps": executed, "client_mapping": engine.mapping,
        "accuracy": summarize_evaluation(evaluation)["accuracy"], "peak_memory_bytes": peak_memory_bytes(),
        "train_samples_per_round": samples, "jax": jax.__version__, "backend": jax.default_backend(),
    }


def client_arrays(exp):
    """Each client's real (x normalised NHWC float32, y) train and test arrays, padding removed."""
    from fedjax_pfl.data.client_data import unpad

    def split(data):
        out = []
        for i in range(data.num_clients):
            x, y = unpad(data, i)
            out.append((exp.dataset.normalize(x), y))
        return out

    return split(exp.data.train), split(exp.data.test)


def measure_torch(workload: dict, rounds: int) -> dict:
    import numpy as np
    import torch

    import torch_loop
    from fedjax_pfl.engine.engine import summarize_evaluation

    threads = torch_loop.set_threads()
    exp = build(workload)
    train, test = client_arrays(exp)
    ds = exp.dataset
    model = torch_loop.build_model(workload["model"], ds.input_shape, ds.num_classes,
                                   hidden=MODELS[workload["model"]] or ())
    sim = torch_loop.Simulator(workload["method"], model, train, test, batch_size=workload["batch"],
                               local_epochs=workload["epochs"], lr=workload["lr"])
    everyone = list(range(len(train)))
    timed = torch_loop.time_rounds(sim, rounds, lambda t: everyone)
    samples = workload["epochs"] * sum(len(y) for _, y in train)
    return {
        "train_s_per_round": timed["train_s"], "eval_s_per_round": timed["eval_s"],
        "e2e_s_per_round": timed["train_s"] + timed["eval_s"], "samples_per_s": samples / timed["train_s"],
        "client_steps_per_round": torch_loop.steps_per_round([len(y) for _, y in train], workload["batch"],
                                                             workload["epochs"]),
        "accuracy": summarize_evaluation(timed["evaluation"])["accuracy"], "torch": torch.__version__,
        "torch_threads": threads, "peak_memory_bytes": peak_memory_bytes(),
        "train_samples_per_round": samples, "finite": bool(np.isfinite(timed["train_s"])),
    }


def torch_available() -> str | None:
    """None when torch imports, else a note on how to get it."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed: pip install 'fedjax_pfl[bench]' (PyTorch CPU) to time the PyTorch loop"
    return None


def run_child(side: str, workload: dict, rounds: int, in_process: bool = False) -> dict:
    if in_process:  # --tiny: no second interpreter start (peak memory is then shared)
        return (measure_jax if side == "jax" else measure_torch)(workload, rounds)
    spec = json.dumps({"side": side, "workload": workload, "rounds": rounds})
    proc = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True)
    if proc.returncode == 2:  # the child's one-line user error (e.g. no Fashion-MNIST files)
        print(proc.stderr.strip().splitlines()[-1], file=sys.stderr)
        raise SystemExit(2)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"vs_pytorch: {side} side failed on {workload}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(workload: dict, rounds: int, with_torch: bool, note: str | None, in_process: bool = False) -> dict:
    ours = run_child("jax", workload, rounds, in_process)
    theirs = run_child("torch", workload, rounds, in_process) if with_torch else None
    ratio = lambda k: theirs[k] / ours[k] if theirs else None  # noqa: E731
    return {
        "benchmark": "vs_pytorch", "workload": {**workload, "dataset": "fmnist", "rounds_timed": rounds},
        "device": device_name(), "cpu_count": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2),
        "fedjax_pfl": ours, "pytorch": theirs,
        "ratio_train": ratio("train_s_per_round"), "ratio_e2e": ratio("e2e_s_per_round"),
        "torch_note": note,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="FedAvg on Dirichlet 0.1: FedAvgCNN B=10, B=32, MLP B=10; 1 timed round")
    p.add_argument("--tiny", action="store_true", help="4 clients x 20 samples, MLP, 1 round, both sides in this process: seconds (tests)")
    p.add_argument("--methods", default="fedavg,fedper")
    p.add_argument("--models", default="fedavgcnn:10,fedavgcnn:32,mlp:10", help="model:batch pairs")
    p.add_argument("--partitions", default="dirichlet,iid")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after fedjax_pfl's warm-up round)")
    p.add_argument("--no-torch", action="store_true", help="time fedjax_pfl only")
    p.add_argument("--out", help="also append the records to this JSONL file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        from fedjax_pfl.core.errors import UserError

        spec = json.loads(args.child)
        measure = measure_jax if spec["side"] == "jax" else measure_torch
        try:
            print(json.dumps(measure(spec["workload"], spec["rounds"])))
        except UserError as e:  # missing data, bad option: one line, exit 2
            print(f"vs_pytorch: {e}", file=sys.stderr)
            return 2
        return 0
    if args.quick:
        args.methods, args.partitions, args.rounds = "fedavg", "dirichlet", 1
    if args.tiny:
        args.rounds = 1
    note = "--no-torch given" if args.no_torch else torch_available()
    for workload in workload_list(args):
        record = compare(workload, args.rounds, note is None, note, in_process=args.tiny)
        print(json.dumps(record), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
