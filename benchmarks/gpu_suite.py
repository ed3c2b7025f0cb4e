"""The GPU suite: one command, one report (suite.md + suite.json in --out).

    PYTHONPATH=. python3 benchmarks/gpu_suite.py --out gpu_report          # on the GPU machine
    PYTHONPATH=. python3 benchmarks/gpu_suite.py --quick --out /tmp/suite  # tiny sizes, CPU, a minute
    PYTHONPATH=. python3 benchmarks/gpu_suite.py --sweep-width --out sweep  # one step at W lanes, W = 1..100

It needs only jax, flax (and the PyYAML flax imports), optax, chex and
numpy: what the lent GPU machine has. No tqdm or Pillow (the images are
random and need no files); torch is optional (PyTorch rows). Nothing is
installed: ``PYTHONPATH=.`` from the repository root is enough
(tests/test_benchmarks.py runs ``--quick`` so, with tqdm, Pillow and torch
unimportable).

What it measures, in order:

1. the device name and a measured matmul peak: a jitted loop of 10 square
   matmuls (``--matmul-size``, 8192 by default) in bf16 and in fp32 at JAX's
   default precision (what model training uses; on NVIDIA GPUs that may use
   TF32), best of 3, FLOPs = 2 n^3 per matmul; and its copy bandwidth, an
   elementwise pass over ``--copy-mib`` MiB of float32 (read and written);
2. FedAvg and FedAS with FedAvgCNN (``--models``: also ``resnet8``,
   ``lenet``) on CIFAR shapes (random uint8 32x32x3 images, 10 labels:
   timing does not depend on pixel values), ``--train-samples`` /
   ``--test-samples`` pooled and split over 20, 100 and 1000 clients by
   Dirichlet(0.1) on the labels, each client's pool 75/25 train/test
   (fedjax_pfl's own partition and experiment builder); B=16, E=5, every
   client every round; for each client mapping (``auto`` by default: the
   engine's timed choice, whose record keeps every candidate's compile and
   round seconds; or vmap / chunked / map, each a row with its own peak
   memory), convolution (native and direct by default; im2col, pallas),
   precision (``--precisions``: fp32; bf16) and XLA flag variant
   (``--xla-variants``, xla_variants.py: XLA's defaults; command buffers
   over loops and branches, Triton GEMMs for any matmul), in a
   child process of its own: a warm-up round (compile s = its
   time minus the steady time), then ``--rounds`` timed rounds: rounds/s,
   compile s, peak device memory (the child's), padding efficiency (real /
   executed client-steps), samples/s and achieved FLOP/s as a fraction of
   the fp32 peak. FLOPs are counted as (XLA cost_analysis FLOPs of ONE
   lowered SGD step of the model on a batch of B: benchmarks/flops.py) x
   (real client-steps of the round): the round's own cost_analysis cannot be
   used since it counts a while loop's body once. FedAS's extra passes
   (Fisher, class means, alignment) are not counted, so its fraction is a
   lower bound. Bytes moved (not on a CPU): XLA's count of one SGD step
   compiled for the device with the row's convolution and precision
   (flops.step_bytes) x executed client-steps, as GB/s and a share of the
   measured copy bandwidth (flops.copy_bandwidth).
   Each row also gives the round's sequential steps T (the steps its
   mapping takes one after another: ``map`` every client's, ``vmap`` the
   largest's, ``chunked`` each chunk's largest, ``packed`` the longest
   lane's load), ms per sequential step, us per executed client-step, the
   real TFLOP/s as a share of the measured fp32 and bf16 peaks, the latency
   floor (the largest client's steps x this row's seconds per sequential
   step: what the round would take if no lane ever waited on padding), its
   ratios to the ``chunked:32`` row and to the PyTorch loop of the same
   suite, and the largest difference of its final server parameters from
   the ``map`` row's (every row runs the same rounds with the same keys).
   ``--mappings`` takes ``packed`` (W from the data), ``packed:W`` and
   ``chunked:W`` (chunks of W) besides ``auto``, ``vmap``, ``chunked``
   (``--chunk``) and ``map``. A row's ``variant`` names its precision and
   XLA flags where they are not fp32 under XLA's defaults; ``--variants``
   takes chosen conv:precision:xla triples instead of the product;
3. the same FedAvg workload through the PyTorch per-client loop
   (benchmarks/torch_loop.py) on the same client arrays, when torch is
   installed (CUDA when available): training s/round and evaluation s/round.
   FedAS has no PyTorch twin here. ``--sides jax`` or ``--sides torch``
   keeps one side's rows.

``--sweep-width`` times instead one SGD step of W lanes (each lane its own
client's parameters and batch, vmapped: the ``packed`` mapping's step) at
W = 1, 8, 16, 24, 32, 64, 100 (``--widths``) for each model and convolution:
ms per step, us per client-step, TFLOP/s and their shares of the peaks; a
few minutes, one child per width, for each variant too.

The report's ratio table sets each JAX row against the PyTorch loop and
against its twin with one column at a baseline (native and direct
convolutions, fp32 under XLA's defaults, ``chunked:32`` and ``vmap``
mappings): what a variant must show before it becomes a default
(``conv_impl='auto'``, a precision, a flag, a mapping).

``--device-only`` measures step 1 alone into OUT/device.json; ``--device-json
FILE`` takes step 1 from such a file instead of measuring it again (a visit
that runs several suites measures the device once). The final server
parameters each row is compared by are kept in a temporary folder, never in
--out.

A configuration that fails or runs past ``--child-timeout`` is recorded with
its error and the suite goes on; the suite then exits with status 1 (the
report is still written). Records are appended to suite.jsonl as they
finish, so an interrupted suite keeps what it measured; ``--clients 20,100``
then ``--clients 1000`` split a long suite over several commands, and
``--budget-s`` stops starting configurations after that many seconds
(listing the rest as not run), so one command fits a lent machine's time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CIFAR_SHAPE, device_name, peak_memory_bytes, random_cifar_like, run_config  # noqa: E402
from flops import copy_bandwidth, matmul_peak, step_bytes, step_flops  # noqa: E402 (benchmarks/ is on sys.path)
from xla_variants import XLA_VARIANTS, variant_names, with_variant  # noqa: E402

LABEL = ("method", "model", "clients", "mapping", "conv", "variant")
MIN_CONFIG_S = 20.0  # under --budget-s, a configuration is started only with this much time left
REFERENCE_MAPPING = "chunked:32"  # each row's speed is also given as a ratio to this row's
SWEEP_WIDTHS = (1, 8, 16, 24, 32, 64, 100)
# each row's ratio columns: its twin with one label column at this value
RATIO_TWINS = (("conv", "native"), ("conv", "direct"), ("variant", ""), ("mapping", REFERENCE_MAPPING),
               ("mapping", "vmap"))


def mapping_settings(mapping: str, chunk: int) -> dict:
    """train.client_mapping and train.chunk_size of a --mappings entry ('chunked:32': chunks of 32)."""
    name, _, size = mapping.partition(":")
    if name == "chunked":
        return {"train.client_mapping": "chunked", "train.chunk_size": int(size) if size else chunk}
    return {"train.client_mapping": "auto" if mapping in ("loop", "auto") else mapping, "train.chunk_size": chunk}


def variant_label(precision: str, xla: str) -> str:
    """A row's ``variant`` column: its precision and XLA flag variant where they are not fp32 and XLA's defaults.

    >>> variant_label("fp32", "default"), variant_label("bf16", "command_buffer")
    ('', 'bf16+command_buffer')
    """
    return "+".join(v for v, base in ((precision, "fp32"), (xla, "default")) if v != base)


def configurations(base: dict, methods, models, clients, mappings, variants) -> list[tuple[str, dict]]:
    """The JAX rows of a suite: one spec per (method, model, clients, mapping, (conv, precision, xla) of
    ``variants``) on the workload ``base``; the precision a RunConfig setting on top of the workload's, the XLA
    flags the child's environment."""
    return [("jax", dict(base, method=m, model=md, clients=int(c), mapping=mp, conv=cv,
                         variant=variant_label(pr, xv), precision=pr, xla=xv, settings={"train.precision": pr}))
            for m, md, c, mp, (cv, pr, xv) in itertools.product(methods, models, clients, mappings, variants)]


def build(spec: dict):
    from fedjax_pfl.runs.experiment import build_experiment, validate

    cfg = run_config(**{
        "method_name": spec["method"], "data.name": "cifar10", "partition.scheme": "dirichlet", "partition.alpha": 0.1,
        "partition.num_clients": spec["clients"], "partition.min_size": spec["min_size"],
        "model.name": spec["model"], "model.conv_impl": spec["conv"], "train.batch_size": spec["batch"],
        "train.local_epochs": spec["epochs"], "train.lr": spec["lr"], "train.join_ratio": spec["join_ratio"],
        **mapping_settings(spec["mapping"], spec["chunk"]), **spec.get("settings", {})})
    return build_experiment(validate(cfg), dataset=random_cifar_like(spec["train_samples"], spec["test_samples"]))


def row_step_bytes(spec: dict) -> float | None:
    """XLA's bytes of one SGD step compiled with the row's convolution and precision (flops.step_bytes); None on
    a CPU, where compiling one more step costs more than a --quick row and no row is held against bandwidth."""
    import jax

    if jax.default_backend() == "cpu":
        return None
    return step_bytes(spec["model"], CIFAR_SHAPE, 10, spec["batch"], conv_impl=spec["conv"],
                      precision=spec.get("precision", "fp32"))


def measure_jax(spec: dict) -> dict:
    import jax
    import numpy as np

    from fedjax_pfl.engine import mapping_choice
    from fedjax_pfl.engine.engine import round_keys
    from fedjax_pfl.kernels.local_training import real_steps

    exp = build(spec)
    engine = exp.engine
    key = jax.random.key(0)
    server, clients = engine.init(key)
    choice = None
    if spec["mapping"] == "auto":
        engine, choice = mapping_choice.choose_mapping(engine, server, clients, round_keys(key, 0)[0], 0)
    times, real, executed, sequential = [], 0, 0, 0
    for t in range(spec["rounds"] + 1):
        start = time.perf_counter()
        server, clients, metrics = engine.round(server, clients, round_keys(key, t)[0], t)
        jax.block_until_ready((server, clients, metrics))
        times.append(time.perf_counter() - start)
        if t > 0:
            real += int(metrics["real_steps"])
            executed += int(metrics["executed_steps"])
            sequential += int(metrics["sequential_steps"])
    if not all(bool(np.isfinite(np.asarray(a)).all()) for a in jax.tree.leaves((server, clients))
               if a.dtype.kind == "f"):
        raise RuntimeError("non-finite state")
    if spec.get("params_out"):  # for the largest difference from the map row's (`compare_with_map`)
        np.savez(spec["params_out"], *[np.asarray(a, np.float64) for a in jax.tree.leaves(server)])
    s = engine.method.setup
    largest = int(np.asarray(real_steps(np.asarray(exp.data.train.n), s.batch_size, s.local_epochs, s.drop_last)).max())
    steady = float(np.median(times[1:]))
    flops = step_flops(spec["model"], CIFAR_SHAPE, 10, spec["batch"])
    moved = row_step_bytes(spec)
    rounds = spec["rounds"]
    selected = engine.config.clients_per_round
    samples = spec["epochs"] * float(np.asarray(exp.data.train.n).mean()) * selected
    achieved = flops * real / rounds / steady if flops else None
    return {
        "rounds_per_s": 1.0 / steady, "s_per_round": steady, "compile_s": max(0.0, times[0] - steady),
        "peak_memory_bytes": peak_memory_bytes(), "padding_efficiency": real / max(executed, 1),
        "real_client_steps_per_round": real / rounds, "samples_per_s": samples / steady,
        "flops_per_step": flops, "achieved_flops_per_s": achieved, "client_mapping": str(engine.mapping),
        "executed_client_steps_per_round": executed / rounds, "sequential_steps_per_round": sequential / rounds,
        "largest_client_steps": largest, "bytes_per_step": moved,
        "achieved_bytes_per_s": moved * executed / rounds / steady if moved else None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "chunk_size": engine.mapping.chunk_size, "mapping_choice": choice,
    }


def measure_torch(spec: dict) -> dict:
    import torch

    import torch_loop
    from vs_pytorch import client_arrays

    threads = torch_loop.set_threads()
    exp = build(spec)
    train, test = client_arrays(exp)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch_loop.build_model(spec["model"], CIFAR_SHAPE, 10)
    sim = torch_loop.Simulator("fedavg", model, train, test, batch_size=spec["batch"], local_epochs=spec["epochs"],
                               lr=spec["lr"], device=device)
    everyone = list(range(len(train)))
    timed = torch_loop.time_rounds(sim, spec["rounds"], lambda t: everyone)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else peak_memory_bytes()
    return {"rounds_per_s": 1.0 / timed["train_s"], "s_per_round": timed["train_s"], "eval_s": timed["eval_s"],
            "peak_memory_bytes": int(peak), "torch": torch.__version__, "torch_device": device,
            "torch_threads": threads}


def measure_device(spec: dict) -> dict:
    """The device's name, JAX's version and backend, the measured matmul peaks (bf16, fp32) and copy bandwidth."""
    import jax

    return {"device": device_name(), "jax": jax.__version__, "backend": jax.default_backend(),
            "matmul_peak": [matmul_peak(spec["matmul_size"], d) for d in ("bf16", "fp32")],
            "copy_bandwidth": copy_bandwidth(spec["copy_mib"])}


def measure_sweep(spec: dict) -> dict:
    """One SGD step of ``spec['lanes']`` lanes (flops.sgd_steps_seconds): ms per step, us per client-step, FLOP/s
    and bytes/s (one lane's step bytes x lanes)."""
    from flops import sgd_steps_seconds

    lanes, options = spec["lanes"], {"conv_impl": spec["conv"], "precision": spec["precision"]}
    seconds = sgd_steps_seconds(spec["model"], CIFAR_SHAPE, 10, spec["batch"], spec["steps"], reps=3, lanes=lanes,
                                **options)
    flops = step_flops(spec["model"], CIFAR_SHAPE, 10, spec["batch"])
    moved = row_step_bytes(spec)
    return {"lanes": lanes, "s_per_step": seconds, "ms_per_step": 1e3 * seconds, "us_per_client_step": 1e6 * seconds / lanes,
            "flops_per_step": flops, "achieved_flops_per_s": flops * lanes / seconds if flops else None,
            "bytes_per_step": moved, "achieved_bytes_per_s": moved * lanes / seconds if moved else None,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "peak_memory_bytes": peak_memory_bytes()}


MEASURES = {"jax": measure_jax, "torch": measure_torch, "device": measure_device, "sweep": measure_sweep}


def child_env(side: str, xla: str = "default") -> dict:
    """The child's environment: a PyTorch child keeps JAX (which only builds its client arrays) on the CPU,
    so that JAX's allocator, which takes most of a GPU's memory when it starts, leaves the GPU to torch; a JAX
    child gets its XLA flag variant (xla_variants.py) in XLA_FLAGS."""
    if side == "torch":
        return {**os.environ, "JAX_PLATFORMS": "cpu"}
    return {**os.environ, "XLA_FLAGS": with_variant(os.environ.get("XLA_FLAGS", ""), xla)}


def run_child(side: str, spec: dict, in_process: bool, timeout: float) -> dict:
    """``MEASURES[side](spec)``, in a child process of its own unless ``in_process`` (errors propagate) and the
    spec needs no XLA flags of its own (flags are read when the backend starts: a variant runs in a child).

    Only children start a JAX backend: the suite's own process holds no device memory (on a GPU JAX's
    allocator takes 75% of it at start, and a parent holding that starves every child)."""
    xla = spec.get("xla", "default")
    if in_process and xla == "default":
        return MEASURES[side](spec)
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps({"side": side, "spec": spec})],
                          capture_output=True, text=True, timeout=timeout, env=child_env(side, xla))
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_spec(side: str, spec: dict, in_process: bool, timeout: float) -> dict:
    label = {k: spec.get(k, "") for k in LABEL}
    try:
        out = run_child(side, spec, in_process, timeout)
    except subprocess.TimeoutExpired:
        out = {"error": f"ran past its limit, {timeout:.0f} s (--child-timeout, or what --budget-s left)"}
    except Exception as e:  # noqa: BLE001 (a failed configuration is a result, the suite goes on)
        out = {"error": f"{type(e).__name__}: {e}"[:500]}
    return {"side": side, **label, **out}


def _share(value, bar):
    """``value / bar``, or None where either is missing."""
    return value / bar if value and bar else None


def _same_row(r: dict, mapping: str, conv: str | None = None):
    """The key of the JAX row like ``r`` (method, model, clients, variant) with ``mapping`` and ``conv``."""
    return (r["method"], r["model"], r["clients"], r.get("variant", ""), mapping, conv or r["conv"])


def derived(records: list, peaks: dict, bandwidth: float | None = None) -> None:
    """Add to each measured JAX row what follows from it and its neighbours in the suite (in place): ms per
    sequential step, us per executed client-step, the shares of the fp32 and bf16 peaks and of the copy
    bandwidth, the latency floor, the ratios to the ``chunked:32`` row and to the PyTorch loop (>1: this row is
    faster)."""
    done = [r for r in records if "error" not in r]
    seconds = {_same_row(r, r["mapping"]): r["s_per_round"] for r in done if r["side"] == "jax"}
    torch = {(r["model"], r["clients"]): r["s_per_round"] for r in done if r["side"] == "torch"}
    for r in done:
        if r["side"] != "jax":
            continue
        per_step = r["s_per_round"] / max(r.get("sequential_steps_per_round") or 0, 1)
        achieved = r.get("achieved_flops_per_s")
        reference = seconds.get(_same_row(r, REFERENCE_MAPPING))
        vs_torch = torch.get((r["model"], r["clients"])) if r["method"] == "fedavg" else None
        r.update({
            "ms_per_sequential_step": 1e3 * per_step,
            "us_per_executed_client_step": 1e6 * r["s_per_round"] / max(r.get("executed_client_steps_per_round", 1), 1),
            **{f"of_{d}_peak": _share(achieved, peaks.get(d)) for d in ("fp32", "bf16")},
            "of_copy_bandwidth": _share(r.get("achieved_bytes_per_s"), bandwidth),
            "latency_floor_s": r.get("largest_client_steps", 0) * per_step,
            "vs_chunked32": reference / r["s_per_round"] if reference else None,
            "vs_torch": vs_torch / r["s_per_round"] if vs_torch else None,
        })


def compare_with_map(records: list, params: dict) -> None:
    """Each JAX row's largest absolute difference of its final server parameters from the ``map`` row of the
    same method, model, clients, variant (and convolution, where there is such a row), in place."""
    import numpy as np

    maps = {}
    for i, r in enumerate(records):
        if r["side"] == "jax" and r["mapping"] == "map" and i in params and "error" not in r:
            maps.setdefault(_same_row(r, "map"), params[i])
            maps.setdefault(_same_row(r, "map", "any"), params[i])
    for i, r in enumerate(records):
        reference = maps.get(_same_row(r, "map")) or maps.get(_same_row(r, "map", "any"))
        if r["side"] != "jax" or "error" in r or i not in params or reference is None:
            continue
        with np.load(params[i]) as got, np.load(reference) as want:
            r["max_param_diff_from_map"] = max(float(np.max(np.abs(got[k] - want[k]))) for k in want.files)


def ratio_lines(records: list) -> list[str]:
    """The comparisons of one suite as ratios of seconds per round (>1: the JAX row is faster): each JAX row
    against the PyTorch loop on the same model and clients, and against the same row with one label column at a
    `RATIO_TWINS` value (native or direct convolutions, fp32 under XLA's defaults, ``chunked:32`` or ``vmap``)."""
    done = [r for r in records if "error" not in r]
    torch = {(r["model"], r["clients"]): r["s_per_round"] for r in done if r["side"] == "torch"}
    jax_rows = {tuple(r.get(k, "") for k in LABEL): r["s_per_round"] for r in done if r["side"] == "jax"}
    rows = []
    for r in done:
        if r["side"] != "jax":
            continue
        label = {k: r.get(k, "") for k in LABEL}
        ratios = [torch.get((r["model"], r["clients"])) if r["method"] == "fedavg" else None]
        ratios += [None if label[key] == base else jax_rows.get(tuple({**label, key: base}[k] for k in LABEL))
                   for key, base in RATIO_TWINS]
        if any(ratios):
            rows.append("| " + " | ".join(str(label[k]) for k in LABEL) + " | "
                        + " | ".join("-" if v is None else f"{v / r['s_per_round']:.2f}x" for v in ratios) + " |")
    if not rows:
        return []
    heads = ["vs PyTorch loop", *(f"vs {v or 'fp32 default'} {k}" for k, v in RATIO_TWINS)]
    return ["", "Ratios of seconds per round (>1: this JAX row is faster), within this suite:", "",
            "| " + " | ".join([*LABEL, *heads]) + " |", "|" + "---|" * (len(LABEL) + len(heads)), *rows]


def _fmt(v, spec=".3g"):
    return "-" if v is None else format(v, spec)


def row_lines(records: list, peak_fp32: float | None) -> list[str]:
    """The suite's main table: one line per configuration."""
    lines = ["", "| side | method | model | clients | mapping | conv | variant | rounds/s | s/round | compile s | "
             "peak MiB | T | ms/step | us/client-step | padding eff. | TFLOP/s | of fp32 | of bf16 | GB/s | of copy | "
             f"floor s | vs {REFERENCE_MAPPING} | vs PyTorch | max diff vs map |", "|" + "---|" * 24]
    for r in records:
        head = f"| {r['side']} | {r['method']} | {r['model']} | {r['clients']} | {r['mapping']} | {r['conv']} | "
        if "error" in r:
            lines.append(head + f"{r.get('variant', '')} | error: {r['error'][:120]} |" + " |" * 16)
            continue
        achieved = r.get("achieved_flops_per_s")
        chosen = (f" ({r['client_mapping']}{':' + str(r['chunk_size']) if r.get('chunk_size') else ''})"
                  if r["mapping"] == "auto" or r["mapping"] == "packed" else "")
        ratio = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
        lines.append(
            head.replace(f"| {r['mapping']} |", f"| {r['mapping']}{chosen} |") + f"{r.get('variant', '')} | "
            f"{_fmt(r['rounds_per_s'])} | {_fmt(r['s_per_round'])} | {_fmt(r.get('compile_s'))} | "
            f"{_fmt(r['peak_memory_bytes'] / 2**20, '.0f')} | {_fmt(r.get('sequential_steps_per_round'), '.0f')} | "
            f"{_fmt(r.get('ms_per_sequential_step'))} | {_fmt(r.get('us_per_executed_client_step'))} | "
            f"{_fmt(r.get('padding_efficiency'))} | {_fmt(achieved and achieved / 1e12)} | "
            f"{_fmt(r.get('of_fp32_peak', achieved / peak_fp32 if achieved and peak_fp32 else None), '.1%')} | "
            f"{_fmt(r.get('of_bf16_peak'), '.1%')} | {_fmt(_share(r.get('achieved_bytes_per_s'), 1e9))} | "
            f"{_fmt(r.get('of_copy_bandwidth'), '.1%')} | {_fmt(r.get('latency_floor_s'))} | {ratio(r.get('vs_chunked32'))} | "
            f"{ratio(r.get('vs_torch'))} | {_fmt(r.get('max_param_diff_from_map'), '.2g')} |")
    return lines


def sweep_lines(records: list, peaks: dict, bandwidth: float | None) -> list[str]:
    """The --sweep-width table: one line per (model, conv, variant, lanes)."""
    lines = ["", "| model | conv | variant | lanes | ms/step | us/client-step | TFLOP/s | of fp32 | of bf16 | GB/s | "
             "of copy | peak MiB |", "|" + "---|" * 12]
    for r in records:
        head = f"| {r['model']} | {r['conv']} | {r.get('variant', '')} | "
        if "error" in r:
            lines.append(head + f"{r['mapping']} | error: {r['error'][:120]} |" + " |" * 7)
            continue
        achieved, moved = r.get("achieved_flops_per_s"), r.get("achieved_bytes_per_s")
        lines.append(head + f"{r['lanes']} | {_fmt(r['ms_per_step'])} | "
                     f"{_fmt(r['us_per_client_step'])} | {_fmt(achieved and achieved / 1e12)} | "
                     f"{_fmt(_share(achieved, peaks.get('fp32')), '.1%')} | "
                     f"{_fmt(_share(achieved, peaks.get('bf16')), '.1%')} | {_fmt(_share(moved, 1e9))} | "
                     f"{_fmt(_share(moved, bandwidth), '.1%')} | {_fmt(r['peak_memory_bytes'] / 2**20, '.0f')} |")
    return lines


def markdown(report: dict) -> str:
    lines = [f"# GPU suite: {report['device']}", "",
             f"jax {report['jax']}, backend {report['backend']}, python {report['python']}, "
             f"load average {report['load_avg_1min']}", "", f"Workload: {report['workload']}", "",
             "| matmul | n | TFLOP/s |", "|---|---|---|"]
    for p in report["matmul_peak"]:
        lines.append(f"| {p['dtype']} | {p['n']} | {_fmt(p['flops_per_s'] / 1e12)} |")
    peaks = {p["dtype"]: p["flops_per_s"] for p in report["matmul_peak"]}
    bandwidth = report.get("copy_bandwidth", {}).get("bytes_per_s")
    lines += ["", f"Copy bandwidth (an elementwise pass over float32): {_fmt(_share(bandwidth, 1e9))} GB/s."]
    if report.get("sweep"):
        lines += sweep_lines(report["records"], peaks, bandwidth)
        lines += ["", "One SGD step of W lanes, each its own client's parameters and batch of B (vmapped: the packed "
                  "mapping's step), best of 3 jitted scans; FLOPs are XLA's count of one B-sample step x W, bytes "
                  "XLA's count of one lane's compiled step x W."]
    else:
        lines += row_lines(report["records"], peaks.get("fp32"))
        lines += ratio_lines(report["records"])
        lines += ["", "FLOP/s count one SGD step's XLA FLOPs x real client-steps (FedAS extras not counted). T: "
                  "sequential local steps per round (the mapping's one-after-another steps); ms/step: s/round / T; "
                  "GB/s: XLA's bytes of one compiled step (the row's conv and precision) x executed client-steps; "
                  "us/client-step: s/round / executed client-steps; floor: the largest client's steps x ms/step. "
                  "PyTorch rows: FedAvg through the per-client loop; peak memory is torch.cuda.max_memory_allocated "
                  "on CUDA, process RSS on CPU. `auto` and `packed` rows: the mapping the engine chose (every "
                  "candidate's time is in suite.json's mapping_choice)."]
    failed = sum("error" in r for r in report["records"])
    lines += ["", f"{failed} of {len(report['records'])} configurations failed." if failed else
              f"All {len(report['records'])} configurations completed.", ""]
    if report.get("not_run"):
        lines += [f"Not run ({report['budget_note']}): " + "; ".join(
            " ".join(str(v) for v in row.values() if v != "") for row in report["not_run"]) + ".", ""]
    return "\n".join(lines)


def chosen_variants(args) -> list[tuple[str, str, str]]:
    """The (conv, precision, xla) of each row: ``--variants``, else the product of ``--convs``, ``--precisions``
    and ``--xla-variants``; ValueError for an unknown XLA variant or a malformed triple.

    >>> chosen_variants(argparse.Namespace(variants="pallas:bf16:default", convs="", precisions="", xla_variants=""))
    [('pallas', 'bf16', 'default')]
    """
    if args.variants is None:
        return list(itertools.product(args.convs.split(","), args.precisions.split(","),
                                      variant_names(args.xla_variants)))
    triples = [tuple(v.split(":")) for v in args.variants.split(",") if v]
    if not triples or any(len(t) != 3 for t in triples):
        raise ValueError(f"--variants takes conv:precision:xla triples, not {args.variants!r}")
    variant_names(",".join(t[2] for t in triples))
    return triples


def sweep_jobs(args, variants) -> list[tuple[str, dict]]:
    """The --sweep-width rows: one step of each width for each model and (conv, precision, xla)."""
    return [("sweep", {"method": "sgd step", "model": md, "clients": "-", "mapping": f"{w} lanes", "conv": cv,
                       "variant": variant_label(pr, xv), "precision": pr, "xla": xv, "lanes": w, "batch": args.batch,
                       "steps": args.sweep_steps})
            for md, (cv, pr, xv), w in itertools.product(args.models.split(","), variants, args.widths)]


def suite_jobs(args, variants, base: dict, sides: set, report: dict) -> list[tuple[str, dict]]:
    """The JAX rows (`configurations`) and, when torch is there, the PyTorch rows of a suite."""
    models, clients = args.models.split(","), args.clients.split(",")
    jobs = configurations(base, args.methods.split(","), models, clients, args.mappings.split(","),
                          variants) if "jax" in sides else []
    for row in [r for r in (args.extra_rows or "").split(",") if r] if "jax" in sides else []:
        mapping, *variant = row.rsplit(":", 3)  # (a mapping may hold a colon itself: chunked:32)
        jobs += configurations(base, args.methods.split(","), models, clients, [mapping], [tuple(variant)])
    has_torch = False
    if args.no_torch or "torch" not in sides:
        report["torch_note"] = "--no-torch or --sides jax given: no PyTorch rows"
    else:
        try:
            import torch  # noqa: F401
            has_torch = True
        except ImportError:
            report["torch_note"] = "torch is not installed (pip install 'fedjax_pfl[bench]'): no PyTorch rows"
    if has_torch and "fedavg" in args.methods.split(","):
        jobs += [("torch", dict(base, method="fedavg", model=md, clients=int(c), mapping="loop", conv="native"))
                 for md, c in itertools.product(models, clients)]
    return jobs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu_suite_report", help="folder for suite.md, suite.json, suite.jsonl")
    p.add_argument("--quick", action="store_true", help="tiny sizes, in one process: a CPU check in a minute")
    p.add_argument("--methods", default="fedavg,fedas")
    p.add_argument("--models", default="fedavgcnn", help="fedavgcnn, resnet8, lenet (comma-separated)")
    p.add_argument("--clients", default="20,100,1000")
    p.add_argument("--mappings", default="auto", help="auto (times vmap, chunked:8/32, packed:W*, map; keeps the "
                   "fastest), or any of vmap, chunked, chunked:W, packed, packed:W, map for each one's own row and "
                   "peak memory")
    p.add_argument("--convs", default="native,direct", help="native, direct, im2col, pallas")
    p.add_argument("--precisions", default="fp32", help="fp32, bf16 (train.precision): each a row")
    p.add_argument("--xla-variants", default="default", help="XLA flag variants (xla_variants.py): "
                   f"{', '.join(XLA_VARIANTS)}; each a row, measured in a child process of its own")
    p.add_argument("--variants", default=None, help="conv:precision:xla triples (comma-separated), e.g. "
                   "direct:fp32:default,pallas:bf16:default: these rows instead of the product of --convs, "
                   "--precisions and --xla-variants (a lent machine's time fits a chosen few)")
    p.add_argument("--extra-rows", default=None, help="more rows after those, each mapping:conv:precision:xla "
                   "(comma-separated), e.g. packed:direct:fp32:command_buffer for one row of a variant")
    p.add_argument("--train-samples", type=int, default=45000)
    p.add_argument("--test-samples", type=int, default=15000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--join-ratio", type=float, default=1.0)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up round")
    p.add_argument("--matmul-size", type=int, default=8192)
    p.add_argument("--copy-mib", type=int, default=1024, help="MiB of float32 the copy bandwidth streams")
    p.add_argument("--child-timeout", type=float, default=900.0)
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no configuration after this many seconds (and cut the last one there): the rest "
                        "are listed as not run, so a suite fits a lent machine's time and still writes its report")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--sides", default="jax,torch", help="jax, torch or both: split a suite over several commands "
                   "without repeating rows (torch rows still need torch and fedavg in --methods)")
    p.add_argument("--sweep-width", action="store_true", help="time one SGD step of W lanes at each of --widths "
                   "instead of rounds (the packed mapping's step: how its cost grows with W)")
    p.add_argument("--widths", default=",".join(map(str, SWEEP_WIDTHS)), help="lanes of --sweep-width")
    p.add_argument("--sweep-steps", type=int, default=50, help="steps per timed scan of --sweep-width")
    p.add_argument("--device-only", action="store_true", help="measure the device (name, versions, matmul and "
                   "copy peaks) into OUT/device.json and stop")
    p.add_argument("--device-json", help="the device.json of an earlier --device-only: its peaks, not measured again")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    started = time.monotonic()
    if args.child:
        job = json.loads(args.child)
        print(json.dumps(MEASURES[job["side"]](job["spec"])))
        return 0
    if args.quick:
        args.clients, args.train_samples, args.test_samples = "4", 96, 32
        args.epochs, args.rounds, args.matmul_size, args.copy_mib = 1, 1, 128, 8
        args.sweep_steps = 3
        if args.convs == p.get_default("convs"):
            args.convs = "direct"
        if args.widths == p.get_default("widths"):
            args.widths = "1,2"
    args.widths = [int(w) for w in args.widths.split(",")]

    sides = set(args.sides.split(","))
    if not sides <= {"jax", "torch"}:
        p.error(f"--sides takes jax, torch or jax,torch, not {args.sides!r}")
    try:
        variants = chosen_variants(args)
    except ValueError as e:
        p.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.device_json:
        device = json.loads(Path(args.device_json).read_text())
    else:
        device = run_child("device", {"matmul_size": args.matmul_size, "copy_mib": args.copy_mib}, args.quick,
                           args.child_timeout)
    if args.device_only:
        (out / "device.json").write_text(json.dumps({**device, "python": platform.python_version()}, indent=1))
        peaks = ", ".join(f"{p['dtype']} {p['flops_per_s'] / 1e12:.3g} TFLOP/s" for p in device["matmul_peak"])
        print(f"{device['device']}, jax {device['jax']} ({device['backend']}): matmul {peaks}, copy "
              f"{device['copy_bandwidth']['bytes_per_s'] / 1e9:.3g} GB/s; wrote {out / 'device.json'}")
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu_suite-params-") as params_dir:
        return run_suite(args, variants, sides, out, device, Path(params_dir), started)


def run_suite(args, variants, sides: set, out: Path, device: dict, params_dir: Path, started: float) -> int:
    """The suite's rows after the device's (``device``): records, suite.jsonl as they finish, suite.json and
    suite.md; the rows' final server parameters in ``params_dir``; --budget-s counted from ``started``."""
    deadline = None if args.budget_s is None else started + args.budget_s
    jsonl = out / "suite.jsonl"
    jsonl.unlink(missing_ok=True)
    base = dict(batch=args.batch, epochs=args.epochs, lr=args.lr, join_ratio=args.join_ratio, chunk=args.chunk,
                train_samples=args.train_samples, test_samples=args.test_samples, rounds=args.rounds)
    workload = (f"one SGD step of {args.models} at B={args.batch} on 32x32x3 random images, W lanes" if args.sweep_width
                else f"{args.models} on 32x32x3 random images, Dirichlet 0.1 over {args.train_samples}+"
                     f"{args.test_samples} samples, B={args.batch}, E={args.epochs}, join ratio {args.join_ratio}, "
                     f"lr {args.lr}, {args.rounds} timed rounds after a warm-up round")
    report = {
        "benchmark": "gpu_suite", "python": platform.python_version(), "sweep": args.sweep_width,
        "load_avg_1min": round(os.getloadavg()[0], 2), "workload": workload,
        **{k: v for k, v in device.items() if k != "python"}, "records": [],
    }
    jobs = sweep_jobs(args, variants) if args.sweep_width else suite_jobs(args, variants, base, sides, report)
    report["not_run"], report["budget_note"] = [], f"--budget-s {args.budget_s:g} reached" if deadline else None
    params = {}
    for side, spec in jobs:
        if side != "sweep":
            spec["min_size"] = max(1, min(10, args.train_samples // (4 * spec["clients"])))
        if side == "jax":
            params[len(report["records"])] = spec["params_out"] = str(params_dir / f"{len(report['records'])}.npz")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < MIN_CONFIG_S:
            report["not_run"].append({"side": side, **{k: spec.get(k, "") for k in LABEL}})
            continue
        record = run_spec(side, spec, args.quick, args.child_timeout if left is None else min(args.child_timeout, left))
        report["records"].append(record)
        with open(jsonl, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    peaks = {p["dtype"]: p["flops_per_s"] for p in report["matmul_peak"]}
    derived(report["records"], peaks, report["copy_bandwidth"]["bytes_per_s"])
    compare_with_map(report["records"], {i: path for i, path in params.items() if Path(path).is_file()})
    (out / "suite.json").write_text(json.dumps(report, indent=1))
    (out / "suite.md").write_text(markdown(report))
    failed = [r for r in report["records"] if "error" in r]
    print(f"wrote {out / 'suite.md'} and {out / 'suite.json'}; "
          f"{len(failed)} of {len(report['records'])} configurations failed" if failed else
          f"wrote {out / 'suite.md'} and {out / 'suite.json'}; all {len(report['records'])} configurations completed"
          + (f", {len(report['not_run'])} not run ({report['budget_note']})" if report["not_run"] else ""))
    return 1 if failed or not report["records"] else 0


if __name__ == "__main__":
    sys.exit(main())
