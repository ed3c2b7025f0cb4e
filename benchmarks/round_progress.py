"""In-round progress (engine/round_progress.py) on and off: does it cost anything when rounds are short?

Two measurements, each a JSON record with the load average before and after:

1. ``single_round_calls`` (the worst case): each workload built twice
   (EngineConfig.progress off and on: the same numbers,
   tests/test_round_progress.py), both compiled by a warm-up call, then
   timed in alternating blocks of single-round calls, the only calls that
   carry the callbacks, so load on a shared machine hits both alike. The
   events go to the training command's own display (runs/progress.py),
   drawing to /dev/null. Seconds per round of each (median over blocks),
   their ratio, events per round.
2. ``training_command`` (what a user runs): ``python -m fedjax_pfl.train``
   with its bar (stderr a pipe) and with ``--no-progress``, alternated; the
   default ``train.rounds_per_call=0`` times the first single-round calls
   and then fuses short rounds into calls without callbacks. Wall seconds of
   the round loop (metrics.jsonl's last ``seconds``) and seconds per round
   after the first two rounds, median over repetitions, and their ratios.

    python benchmarks/round_progress.py            # both, tiny synthetic MLR and FMNIST MLP rounds
    python benchmarks/round_progress.py --quick    # fewer blocks and repetitions
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name  # noqa: E402

from fedjax_pfl.runs import config as config_lib  # noqa: E402
from fedjax_pfl.runs.experiment import build_experiment, validate  # noqa: E402
from fedjax_pfl.runs.progress import RunProgress  # noqa: E402

WORKLOADS = {
    "synthetic_mlr_6_clients": ["data.name=synthetic", "model.name=mlr", "partition.scheme=natural",
                                "partition.num_clients=6", "train.local_epochs=1", "train.batch_size=32"],
    "fmnist_mlp100_20_clients": ["data.name=fmnist", "model.name=mlp", "model.hidden=[100]",
                                 "partition.scheme=dirichlet", "partition.alpha=0.1", "partition.num_clients=20",
                                 "train.local_epochs=1", "train.batch_size=32", "train.join_ratio=1.0"],
}


def experiment(overrides: list[str], progress: bool):
    cfg = config_lib.build(overrides=["method_name=fedavg", "train.lr=0.05", *overrides])
    cfg.data.allow_download = False
    return build_experiment(validate(cfg), progress=progress)


def time_block(state: dict, calls: int) -> float:
    """Seconds per round of ``calls`` single-round calls continuing ``state``."""
    engine, key = state["engine"], state["key"]
    began = time.perf_counter()
    for _ in range(calls):
        t = state["round"]
        state["server"], state["clients"], _, _ = engine.run_rounds(state["server"], state["clients"], key, t, 1,
                                                                     10**6, 10**6)
        state["round"] = t + 1
    jax.block_until_ready(state["server"])
    jax.effects_barrier()
    return (time.perf_counter() - began) / calls


def measure(name: str, overrides: list[str], blocks: int, calls: int) -> dict:
    load_before = os.getloadavg()
    states, events = {}, []
    for progress in (False, True):
        exp = experiment(overrides, progress)
        key = jax.random.key(0)
        server, clients = exp.engine.init(key)
        states[progress] = {"engine": exp.engine, "key": key, "server": server, "clients": clients, "round": 0}
    selected = states[True]["engine"].config.clients_per_round
    display = RunProgress(total=10**6, done=0, clients=selected, enabled=True)
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink), \
            states[True]["engine"].progress.listening(lambda e: (events.append(e), display.event(e))):
        display.bar.fp = sink
        for state in states.values():
            time_block(state, 1)  # compiles
        counted = len(events)
        seconds = {False: [], True: []}
        for _ in range(blocks):
            for progress in (False, True):
                seconds[progress].append(time_block(states[progress], calls))
        display.close()
    off, on = float(np.median(seconds[False])), float(np.median(seconds[True]))
    return {"benchmark": "round_progress", "measure": "single_round_calls", "workload": name, "device": device_name(), "jax": jax.__version__,
            "method": "fedavg", "client_mapping": str(states[True]["engine"].mapping), "clients_per_round": selected,
            "blocks": blocks, "calls_per_block": calls,
            "s_per_round_progress_off": off, "s_per_round_progress_on": on, "ratio_on_over_off": on / off,
            "rounds_per_s_off": 1 / off, "rounds_per_s_on": 1 / on,
            "events_per_round": (len(events) - counted) / (blocks * calls),
            "block_ratios": [b / a for a, b in zip(seconds[False], seconds[True])],
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def command_run(overrides: list[str], rounds: int, progress: bool) -> dict:
    """One training command in a subprocess -> its round-loop seconds and seconds per round after round 2."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "fedjax_pfl.train", "--method", "fedavg", "--out", f"{tmp}/run",
                "train.lr=0.05", f"train.rounds={rounds}", *overrides, *([] if progress else ["--no-progress"])]
        subprocess.run(argv, check=True, capture_output=True, text=True)
        records = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in records]
    return {"loop_s": seconds[-1], "s_per_round_after_2": (seconds[-1] - seconds[1]) / (len(seconds) - 2)}


def measure_command(name: str, overrides: list[str], repetitions: int, rounds: int) -> dict:
    load_before = os.getloadavg()
    runs = {False: [], True: []}
    for _ in range(repetitions):
        for progress in (False, True):
            runs[progress].append(command_run(overrides, rounds, progress))
    median = lambda progress, key: float(np.median([r[key] for r in runs[progress]]))  # noqa: E731
    return {"benchmark": "round_progress", "measure": "training_command", "workload": name, "device": device_name(),
            "jax": jax.__version__, "method": "fedavg", "rounds": rounds, "repetitions": repetitions,
            "loop_s_progress_off": median(False, "loop_s"), "loop_s_progress_on": median(True, "loop_s"),
            "loop_ratio_on_over_off": median(True, "loop_s") / median(False, "loop_s"),
            "s_per_round_after_2_off": median(False, "s_per_round_after_2"),
            "s_per_round_after_2_on": median(True, "s_per_round_after_2"),
            "per_round_ratio_on_over_off": median(True, "s_per_round_after_2") / median(False, "s_per_round_after_2"),
            "runs": {"off": runs[False], "on": runs[True]},
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 blocks and 1 repetition instead of 7 and 3")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of: " + ", ".join(WORKLOADS))
    p.add_argument("--measures", default="single_round_calls,training_command")
    args = p.parse_args(argv)
    blocks, repetitions = (3, 1) if args.quick else (7, 3)
    for name in args.workloads.split(","):
        small = name.startswith("synthetic")
        if "single_round_calls" in args.measures:
            print(json.dumps(measure(name, WORKLOADS[name], blocks, 200 if small else 10)), flush=True)
        if "training_command" in args.measures:
            print(json.dumps(measure_command(name, WORKLOADS[name], repetitions, 300 if small else 30)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
