"""Seeds as federations of one program vs the same runs one after another, wall time including compilation.

For each method: ONE ``python -m fedjax_pfl.train ... --seeds 0,..,S-1`` process
(runs/sweep.py) against S ``python -m fedjax_pfl.train ... --seed s data_seed=0``
processes run one after another, what a user of a sequential simulator does.
Both sides are whole CLI processes (start-up, data, compilation, every round,
every evaluation, the run folders); per side: wall seconds, rounds/s (runs x
rounds / wall), the first call's seconds as the run itself logged them
(compilation included), the process's peak RSS. Then the ratio, and the
largest difference between a seed's final accuracy in the two modes (they
must agree to float tolerance).

    python benchmarks/seeds_batched.py                     # FedAvg and FedAS, FMNIST MLP, 20 clients, 5 seeds
    python benchmarks/seeds_batched.py --methods fedavg --seeds 3 --rounds 5
    python benchmarks/seeds_batched.py --quick             # synthetic data, 2 rounds (a test runs this)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name  # noqa: E402


def run_cli(args: list[str]) -> dict:
    """Wall seconds and peak RSS of one CLI process; exits 2 with its error line when it fails."""
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "fedjax_pfl.train", "--no-progress", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - began
    err = proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        print(f"seeds_batched: {err.strip().splitlines()[-1] if err.strip() else 'run failed'}", file=sys.stderr)
        sys.exit(2)
    return {"seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024}


def final_accuracy(folder: Path) -> float:
    return json.loads((folder / "summary.json").read_text())["last"]["accuracy"]


def first_call_seconds(folder: Path) -> float:
    return json.loads((folder / "metrics.jsonl").read_text().splitlines()[0])["seconds"]


def workload_args(args) -> list[str]:
    if args.quick:
        return ["--dataset", "synthetic", "--model", "mlr", "--num-clients", "6", "--partition", "natural",
                "--local-epochs", "1", "--batch-size", "8", "--rounds", "2"]
    return ["--dataset", "fmnist", "--model", "mlp", "model.hidden=[100]", "--num-clients", str(args.clients),
            "--partition", "dirichlet", "--alpha", "0.3", "--local-epochs", "1", "--batch-size", "32",
            "--lr", "0.05", "--join-ratio", "0.5", "--rounds", str(args.rounds)]


def compare(method: str, args, root: Path) -> dict:
    base = ["--method", method, *workload_args(args), "--seed", "0", "data_seed=0"]
    seeds = list(range(args.seeds))
    batched = run_cli([*base, "--seeds", ",".join(map(str, seeds)), "--out", str(root / method / "batched")])
    singles = [run_cli([*base, "--seed", str(s), "--out", str(root / method / f"single{s}")]) for s in seeds]
    rounds = 2 if args.quick else args.rounds
    single_s = sum(r["seconds"] for r in singles)
    diff = max(abs(final_accuracy(root / method / "batched" / f"seed{s}") - final_accuracy(root / method / f"single{s}"))
               for s in seeds)
    return {
        "workload": {"method": method, "args": workload_args(args), "seeds": len(seeds)},
        "device": device_name(),
        "batched": {"seconds": batched["seconds"], "rounds_per_s": len(seeds) * rounds / batched["seconds"],
                    "first_call_s": first_call_seconds(root / method / "batched" / "seed0"),
                    "peak_rss_bytes": batched["peak_rss_bytes"]},
        "one_after_another": {"seconds": single_s, "rounds_per_s": len(seeds) * rounds / single_s,
                              "first_call_s": first_call_seconds(root / method / "single0"),
                              "peak_rss_bytes": max(r["peak_rss_bytes"] for r in singles)},
        "speedup_batched_over_one_after_another": single_s / batched["seconds"],
        "max_final_accuracy_difference": diff,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="fedavg,fedas")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="synthetic data, 2 rounds (for tests)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            print(json.dumps(compare(method, args, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
