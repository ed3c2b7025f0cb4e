"""fedjax_pfl against the usual PyTorch per-client loop, same clients, samples, steps and evaluation.

For each workload (method, model, batch size, join ratio, partition) both
sides get the identical client arrays, made by fedjax_pfl's own partition
and experiment builder: Fashion-MNIST for ``fedavgcnn`` and ``mlp``;
CIFAR-10's shapes (random uint8 32x32x3 images, 10 labels: a step's time does
not depend on pixel values) for ``lenet`` and ``resnet8``. 20 clients,
Dirichlet 0.1 or iid, each client's pool split 75/25 train/test. The clients
of a round (all, or round(20 x join ratio) drawn by the engine's key schedule:
both sides train the same ones) train E local epochs of ceil(n_i/B) SGD steps,
the last batch partial; then every client is evaluated on its test set
(PyTorch: batches of 256, the last partial; fedjax_pfl: batches sized to the
test sets, at most 256, `client_mapping.pass_batch_size`). Each side runs in
its own child process.

- fedjax_pfl: the client mapping is the engine's ``auto`` choice as a run of
  ``--run-rounds`` rounds makes it (engine/mapping_choice.py: candidates
  timed on round 0 within 5% of that run; its cost reported as
  ``mapping_choice_s``), or ``--client-mapping``; then a warm-up
  round and evaluation (compile time = their time minus the steady time) and
  ``--rounds`` timed rounds; ``Engine.round`` and ``Engine.evaluate`` each
  timed to completion. Host devices: the training command's default
  (``devices.cpu=auto``, runs/host_devices.py: one per core), or
  ``--cpu-devices N``; the engine splits the clients over them, each device
  running its own (XLA:CPU runs one device's program mostly on one thread).
  ``--cpu-devices 1`` gives the single-device figure; the record's
  ``fedjax_pfl.devices`` says what ran. Padding efficiency is the real over
  executed client-steps the engine reports for the timed rounds.
- PyTorch (benchmarks/torch_loop.py, the `bench` extra): one warm-up step,
  then the same number of timed rounds. ``torch.set_num_threads`` is set to
  the machine's core count; XLA:CPU uses all cores by default.

FLOPs: XLA's count of one SGD step of the model (benchmarks/flops.py:
forward and both gradients, native convolutions) per sample, times the
samples trained; the same count for both sides. Each child also measures its
framework's float32 matmul peak (``--matmul-size``) and, for the CNNs, the
SGD step in isolation at batch B (the "conv step": 50 steps in one jitted
``lax.scan``; PyTorch: a loop of zero_grad/backward/step), so every record
holds achieved GFLOP/s next to the peak measured in the same run
(``peak_gflops`` = the larger of the two frameworks' peaks). On several JAX
devices the conv step is also timed as the engine runs it there, one client
per device side by side (``step_devices_*``: GFLOP/s of the whole machine;
PyTorch's one step at a time already uses all its threads).

One JSON line per workload: seconds per round for training and evaluation
(medians), compile seconds, samples/s, GFLOP/s, padding efficiency, final
accuracy of both sides (a sanity check, not a comparison: different initial
values), and ratios PyTorch time / fedjax_pfl time for training alone and
end to end (training + evaluation per round, compile and mapping choice
excluded; both reported). A markdown table of all workloads follows. Without
torch the PyTorch fields are null and ``torch_note`` says why.

    python benchmarks/vs_pytorch.py --quick     # FedAvg, Dirichlet 0.1: FedAvgCNN B=10, 32, B=10 with join ratio 0.5,
                                                # MLP B=10, LeNet and ResNet-8 B=32 on CIFAR-10 shapes; 1 timed round
    python benchmarks/vs_pytorch.py             # FedAvg and FedPer, Dirichlet 0.1 and iid, 3 timed rounds
    python benchmarks/vs_pytorch.py --tiny      # seconds: a mechanism check (tests; 2 of 4 clients per round)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import device_name, peak_memory_bytes, random_cifar_like, run_config  # noqa: E402 (benchmarks/ on path)

# model -> (data, MLP hidden sizes)
MODELS = {"fedavgcnn": ("fmnist", None), "mlp": ("fmnist", (100,)), "mlr": ("fmnist", None),
          "lenet": ("cifar_shapes", None), "resnet8": ("cifar_shapes", None)}
DENSE_MODELS = ("mlp", "mlr")  # no convolution: no conv-step timing
CIFAR_POOL = (6000, 2000)  # random CIFAR-shaped train + test images pooled and split over the clients
QUICK_MODELS = "fedavgcnn:10,fedavgcnn:32,fedavgcnn:10:0.5,mlp:10,lenet:32,resnet8:32"
CNN_STEP_STEPS = 50


def workload_list(args) -> list[dict]:
    """Workloads from ``--models`` (``model:B`` or ``model:B:join_ratio``) x methods x partitions."""
    if args.tiny:
        return [dict(method="fedavg", model="mlp", batch=10, join_ratio=0.5, partition="dirichlet", clients=4,
                     epochs=1, lr=0.005, train_per_client=20, test_per_client=10)]
    out = []
    for partition in args.partitions.split(","):
        for method in args.methods.split(","):
            for spec in args.models.split(","):
                model, batch, *join = spec.split(":")
                if model not in MODELS:
                    raise SystemExit(f"vs_pytorch: unknown model {model!r} in --models; choose from {sorted(MODELS)}")
                out.append(dict(method=method, model=model, batch=int(batch),
                                join_ratio=float(join[0]) if join else 1.0, partition=partition,
                                clients=args.clients, epochs=args.epochs, lr=args.lr))
    return out


def build(workload: dict):
    """The fedjax_pfl Experiment of a workload (Fashion-MNIST from FEDJAX_PFL_DATA_DIR, or CIFAR-10 shapes)."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    data, hidden = MODELS[workload["model"]]
    fields = {
        "method_name": workload["method"], "data.name": "fmnist" if data == "fmnist" else "cifar10",
        "partition.scheme": workload["partition"], "partition.num_clients": workload["clients"],
        "partition.alpha": 0.1, "model.name": workload["model"], "train.batch_size": workload["batch"],
        "train.local_epochs": workload["epochs"], "train.lr": workload["lr"],
        "train.join_ratio": workload.get("join_ratio", 1.0),
    }
    if workload.get("mapping"):
        fields["train.client_mapping"] = workload["mapping"]
    if hidden:
        fields["model.hidden"] = tuple(hidden)
    for key in ("train_per_client", "test_per_client"):
        if workload.get(key):
            fields[f"partition.{key}"] = workload[key]
    cfg = run_config(**fields)
    if workload.get("data_dir"):
        cfg.data.data_dir = workload["data_dir"]
    return build_experiment(validate(cfg), dataset=random_cifar_like(*CIFAR_POOL) if data == "cifar_shapes" else None)


def selected_per_round(engine, rounds: int) -> list[list[int]]:
    """The clients the engine trains in rounds 0..rounds (its own key schedule from key 0): PyTorch trains the same."""
    import jax
    import numpy as np

    from fedjax_pfl.engine.engine import round_keys, select_clients

    key = jax.random.key(0)
    count = engine.config.clients_per_round
    return [np.asarray(select_clients(jax.random.split(round_keys(key, t)[0], 3)[0], engine.num_clients, count))
            .tolist() for t in range(rounds + 1)]


def measure_jax(workload: dict, rounds: int, matmul_size: int, run_rounds: int = 100) -> dict:
    import jax
    import numpy as np

    from fedjax_pfl.runs import host_devices

    # before any backend starts, as the training command: the engine then splits the clients over the devices
    devices = host_devices.apply(workload.get("cpu_devices", host_devices.AUTO))

    import flops
    from fedjax_pfl.engine import mapping_choice
    from fedjax_pfl.engine.engine import round_keys, summarize_evaluation

    exp = build(workload)
    engine = exp.engine
    key = jax.random.key(0)
    server, clients = engine.init(key)
    engine, choice = mapping_choice.choose_or_default(engine, workload.get("mapping") or "auto", run_rounds, server,
                                                      clients, round_keys(key, 0)[0], 0)  # as a run would
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
    sizes = np.asarray(exp.data.train.n)
    samples = workload["epochs"] * float(np.mean([sizes[s].sum() for s in selected_per_round(engine, rounds)[1:]]))
    model, shape, classes = workload["model"], exp.dataset.input_shape, exp.dataset.num_classes
    hidden = MODELS[model][1]
    step_flops = flops.step_flops(model, shape, classes, workload["batch"], **({"hidden": hidden} if hidden else {}))
    flops_per_sample = step_flops / workload["batch"] if step_flops else None
    out = {
        "train_s_per_round": train, "eval_s_per_round": ev, "e2e_s_per_round": train + ev,
        "compile_s": max(0.0, train_s[0] - train) + max(0.0, eval_s[0] - ev),
        "samples_per_s": samples / train, "padding_efficiency": real / max(executed, 1),
        "real_client_steps": real, "executed_client_steps": executed, "client_mapping": str(engine.mapping),
        "chunk_size": engine.mapping.chunk_size,
        "mapping_choice": choice, "mapping_choice_s": choice.get("seconds", 0.0),
        "conv_impl": _conv_impl(), "flops_per_sample": flops_per_sample,
        "train_gflops": flops_per_sample * samples / train / 1e9 if flops_per_sample else None,
        "matmul_peak_gflops": flops.matmul_peak(matmul_size, "fp32", chain=4)["flops_per_s"] / 1e9,
        "accuracy": summarize_evaluation(evaluation)["accuracy"], "peak_memory_bytes": peak_memory_bytes(),
        "train_samples_per_round": samples, "jax": jax.__version__, "backend": jax.default_backend(),
        "devices": jax.device_count(), "devices_why": devices["why"],
    }
    if model not in DENSE_MODELS:
        out["step_s"] = flops.sgd_steps_seconds(model, shape, classes, workload["batch"], CNN_STEP_STEPS)
        out["step_gflops"] = step_flops / out["step_s"] / 1e9 if step_flops else None
        if jax.device_count() > 1:  # the step as the engine runs it here: one client per device, side by side
            out["step_devices_s"] = flops.sgd_steps_seconds(model, shape, classes, workload["batch"], CNN_STEP_STEPS,
                                                            devices=jax.device_count())
            out["step_devices_gflops"] = step_flops / out["step_devices_s"] / 1e9 if step_flops else None
    return out


def _conv_impl() -> str:
    from fedjax_pfl.models.conv import resolve_conv_impl

    return resolve_conv_impl("auto")


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


def measure_torch(workload: dict, rounds: int, matmul_size: int, run_rounds: int = 100) -> dict:
    import numpy as np
    import torch

    import torch_loop
    from fedjax_pfl.engine.engine import summarize_evaluation

    threads = torch_loop.set_threads()
    exp = build(workload)
    train, test = client_arrays(exp)
    ds = exp.dataset
    model = torch_loop.build_model(workload["model"], ds.input_shape, ds.num_classes,
                                   hidden=MODELS[workload["model"]][1] or ())
    sim = torch_loop.Simulator(workload["method"], model, train, test, batch_size=workload["batch"],
                               local_epochs=workload["epochs"], lr=workload["lr"])
    selected = selected_per_round(exp.engine, rounds)[1:]  # the engine's rounds 1.. (round 0 was its warm-up)
    timed = torch_loop.time_rounds(sim, rounds, lambda t: selected[t])
    sizes = [len(y) for _, y in train]
    samples = workload["epochs"] * float(np.mean([sum(sizes[c] for c in s) for s in selected]))
    out = {
        "train_s_per_round": timed["train_s"], "eval_s_per_round": timed["eval_s"],
        "e2e_s_per_round": timed["train_s"] + timed["eval_s"], "samples_per_s": samples / timed["train_s"],
        "client_steps_per_round": float(np.mean([torch_loop.steps_per_round([sizes[c] for c in s], workload["batch"],
                                                                            workload["epochs"]) for s in selected])),
        "accuracy": summarize_evaluation(timed["evaluation"])["accuracy"], "torch": torch.__version__,
        "torch_threads": threads, "peak_memory_bytes": peak_memory_bytes(),
        "matmul_peak_gflops": torch_loop.matmul_peak(matmul_size, chain=4) / 1e9,
        "train_samples_per_round": samples, "finite": bool(np.isfinite(timed["train_s"])),
    }
    if workload["model"] not in DENSE_MODELS:
        out["step_s"] = torch_loop.sgd_steps_seconds(workload["model"], ds.input_shape, ds.num_classes,
                                                     workload["batch"], CNN_STEP_STEPS)
    return out


def torch_available() -> str | None:
    """None when torch imports, else a note on how to get it."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed: pip install 'fedjax_pfl[bench]' (PyTorch CPU) to time the PyTorch loop"
    return None


def run_child(side: str, workload: dict, rounds: int, matmul_size: int, run_rounds: int,
              in_process: bool = False) -> dict:
    if in_process:  # --tiny: no second interpreter start (peak memory is then shared)
        return (measure_jax if side == "jax" else measure_torch)(workload, rounds, matmul_size, run_rounds)
    spec = json.dumps({"side": side, "workload": workload, "rounds": rounds, "matmul_size": matmul_size,
                       "run_rounds": run_rounds})
    proc = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True)
    if proc.returncode == 2:  # the child's one-line user error (e.g. no Fashion-MNIST files)
        print(proc.stderr.strip().splitlines()[-1], file=sys.stderr)
        raise SystemExit(2)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"vs_pytorch: {side} side failed on {workload}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(workload: dict, rounds: int, with_torch: bool, note: str | None, matmul_size: int, run_rounds: int,
            in_process: bool = False) -> dict:
    ours = run_child("jax", workload, rounds, matmul_size, run_rounds, in_process)
    theirs = run_child("torch", workload, rounds, matmul_size, run_rounds, in_process) if with_torch else None
    ratio = lambda k: theirs[k] / ours[k] if theirs else None  # noqa: E731
    peak = max(ours["matmul_peak_gflops"], theirs["matmul_peak_gflops"] if theirs else 0.0)
    per_sample = ours["flops_per_sample"]
    if theirs and per_sample:
        theirs["train_gflops"] = per_sample * theirs["train_samples_per_round"] / theirs["train_s_per_round"] / 1e9
        if "step_s" in theirs:
            theirs["step_gflops"] = per_sample * workload["batch"] / theirs["step_s"] / 1e9
    for side in filter(None, (ours, theirs)):
        for k in ("train_gflops", "step_gflops", "step_devices_gflops"):
            if side.get(k):
                side[k.replace("gflops", "of_peak")] = side[k] / peak
    return {
        "benchmark": "vs_pytorch", "workload": {**workload, "dataset": MODELS[workload["model"]][0],
                                                "rounds_timed": rounds},
        "device": device_name(), "cpu_count": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2),
        "fedjax_pfl": ours, "pytorch": theirs, "peak_gflops": peak,
        "ratio_train": ratio("train_s_per_round"), "ratio_e2e": ratio("e2e_s_per_round"),
        "ratio_step": ratio("step_s") if theirs and "step_s" in theirs else None,
        "torch_note": note,
    }


def markdown(records: list[dict]) -> str:
    """The records as one table: ratios, GFLOP/s against the peak, padding efficiency, mapping chosen."""
    fmt = lambda v, spec=".3g": "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| model, B, join | fedjax_pfl train / eval s | PyTorch train / eval s | ratio train | ratio e2e | "
             "step GFLOP/s ours / PyTorch (of peak) | step GFLOP/s ours on all devices (of peak) | "
             "train GFLOP/s ours / PyTorch | padding eff. | mapping, devices | choice s | load |", "|" + "---|" * 12]
    for r in records:
        w, a, b = r["workload"], r["fedjax_pfl"], r["pytorch"] or {}
        step = (f"{fmt(a.get('step_gflops'), '.0f')} / {fmt(b.get('step_gflops'), '.0f')} "
                f"({fmt(a.get('step_of_peak'), '.0%')} / {fmt(b.get('step_of_peak'), '.0%')})"
                if "step_s" in a else "-")
        step_all = (f"{fmt(a.get('step_devices_gflops'), '.0f')} ({fmt(a.get('step_devices_of_peak'), '.0%')})"
                    if "step_devices_s" in a else "-")
        mapping = a["client_mapping"] + (f":{a['chunk_size']}" if a.get("chunk_size") else "")
        mapping += f", {a['devices']}" if "devices" in a else ""
        lines.append(
            f"| {w['model']}, {w['batch']}, {w['join_ratio']:g} | {fmt(a['train_s_per_round'])} / "
            f"{fmt(a['eval_s_per_round'])} | {fmt(b.get('train_s_per_round'))} / {fmt(b.get('eval_s_per_round'))} | "
            f"{fmt(r['ratio_train'])} | **{fmt(r['ratio_e2e'])}** | {step} | {step_all} | "
            f"{fmt(a.get('train_gflops'), '.0f')} / "
            f"{fmt(b.get('train_gflops'), '.0f')} | {fmt(a['padding_efficiency'], '.3f')} | {mapping} | "
            f"{fmt(a['mapping_choice_s'], '.0f')} | {r['load_avg_1min']} |")
    peak = records[0]["peak_gflops"] if records else None
    lines.append(f"\nmatmul peak (float32, measured in each run's children, the larger framework's): "
                 f"{fmt(peak, '.0f')} GFLOP/s; device {records[0]['device'] if records else '-'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"FedAvg on Dirichlet 0.1, {QUICK_MODELS}; 1 timed round")
    p.add_argument("--tiny", action="store_true",
                   help="4 clients x 20 samples, 2 per round, MLP, 1 round, both sides in this process (tests)")
    p.add_argument("--methods", default="fedavg,fedper")
    p.add_argument("--models", default=QUICK_MODELS, help="model:B or model:B:join_ratio, comma-separated")
    p.add_argument("--partitions", default="dirichlet,iid")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after fedjax_pfl's warm-up round)")
    p.add_argument("--client-mapping", help="the engine's mapping (default: its timed auto choice)")
    p.add_argument("--run-rounds", type=int, default=100,
                   help="the run length the auto choice budgets its timing for (5%% of it; --tiny: no budget)")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n float32 matmuls of the peak")
    p.add_argument("--cpu-devices", default="auto",
                   help="JAX side: host devices, the clients split over them: auto (the training command's "
                   "default, devices.cpu) or a number (1: one device)")
    p.add_argument("--no-torch", action="store_true", help="time fedjax_pfl only")
    p.add_argument("--out", help="also append the records to this JSONL file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        from fedjax_pfl.core.errors import UserError

        spec = json.loads(args.child)
        measure = measure_jax if spec["side"] == "jax" else measure_torch
        try:
            print(json.dumps(measure(spec["workload"], spec["rounds"], spec["matmul_size"], spec["run_rounds"])))
        except UserError as e:  # missing data, bad option: one line, exit 2
            print(f"vs_pytorch: {e}", file=sys.stderr)
            return 2
        return 0
    if args.quick:
        args.methods, args.partitions, args.rounds = "fedavg", "dirichlet", 1
    if args.tiny:
        args.rounds, args.matmul_size, args.run_rounds = 1, 256, 10 ** 6
    from fedjax_pfl.core.errors import UserError
    from fedjax_pfl.runs.host_devices import parse as parse_devices  # (no JAX backend starts here)

    try:
        parse_devices(args.cpu_devices)
    except UserError as e:
        raise SystemExit(f"vs_pytorch: --cpu-devices: {e}") from None
    note = "--no-torch given" if args.no_torch else torch_available()
    records = []
    for workload in workload_list(args):
        if args.client_mapping:
            workload["mapping"] = args.client_mapping
        workload["cpu_devices"] = args.cpu_devices
        record = compare(workload, args.rounds, note is None, note, args.matmul_size, args.run_rounds,
                         in_process=args.tiny)
        records.append(record)
        print(json.dumps(record), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
