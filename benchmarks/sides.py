"""Two simulators timed on one workload, each in its own process and Python environment, taking turns.

The parent writes the workload's arrays once (`save_arrays`: an .npz that
each side reads with NumPy alone, so a peer needs none of fedjax_pfl's
packages), starts one child per side (`Side`: its own interpreter, so a peer
can live in a virtual environment of its own, `find_python`) and lets them
take turns block by block (`take_turns`): a child sends its setup record,
then runs a block each time it is told to go and sends that block's record,
and at the end one last record (its peak memory). A side never runs while
the other does. `summarize` makes a side's row: medians over the timed
blocks, block 0 being compile and warm-up.

This module imports only the standard library and NumPy: the peers' children
import it too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

MARK = "@@side "  # a child's protocol lines on stdout start with this
LAST = "peak_memory_bytes"  # the key of a child's last record


def send(record: dict) -> None:
    """A child's record to the parent."""
    print(MARK + json.dumps(record), flush=True)


def gate(record: dict) -> None:
    """A child sends ``record`` and, unless it is its last, waits until the parent says go (it stops when the
    parent is gone)."""
    send(record)
    if LAST not in record and not sys.stdin.readline():
        raise SystemExit(1)


def serve(benchmark: str, records, spec: dict) -> int:
    """A child's part: each record of ``records(spec)`` to the parent, in turn (`gate`); fedjax_pfl's one-line
    user error (a missing data file) as such, exit 2."""
    from fedjax_pfl.core.errors import UserError

    try:
        for record in records(spec):
            gate(record)
    except UserError as e:
        print(f"{benchmark}: {e}", file=sys.stderr)
        return 2
    return 0


class Side:
    """A side in its own process: ``python script *args``, its stderr in ``log_path``."""

    def __init__(self, name: str, python: str, script: str, args: list[str], env: dict, log_path: str):
        self.name, self.log = name, open(log_path, "w")
        self.proc = subprocess.Popen([python, script, *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)

    def next(self, go: bool = True) -> dict:
        """The child's next record (after telling it to go, unless ``go`` is False)."""
        if go:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        self.proc.wait()
        self.log.flush()
        with open(self.log.name) as f:
            sys.stderr.write(f.read()[-3000:])
        if self.proc.returncode == 2:  # the child's one-line user error is in the tail above
            raise SystemExit(2)
        raise SystemExit(f"the {self.name} side stopped (exit {self.proc.returncode}); its log: {self.log.name}")


def take_turns(sides: list[Side], blocks: int) -> tuple[dict, dict, dict]:
    """(setup, [block records], last record) of each side by name, the sides taking turns for block 0 and
    ``blocks`` timed blocks, which one goes first alternating block by block. A side that fails stops the
    others."""
    try:
        setups = {s.name: s.next(go=False) for s in sides}
        records = {s.name: [] for s in sides}
        for block in range(blocks + 1):
            for s in (sides if block % 2 == 0 else sides[::-1]):
                records[s.name].append(s.next())
        tails = {s.name: s.next() for s in sides}
        for s in sides:
            s.proc.wait()
    finally:
        for s in sides:
            if s.proc.poll() is None:
                s.proc.kill()
    return setups, records, tails


def summarize(name: str, setup: dict, blocks: list[dict], tail: dict) -> dict:
    """A side's row from its block records (``train_s``: each round's training seconds, ``eval_s``: the block's
    evaluations, ``accuracy`` after it, ``client_steps``, ``rounds`` [first, stop)): seconds per round end to
    end (the block's rounds and evaluations over its rounds) and for training alone, seconds of evaluation per
    block, medians over the timed blocks; the accuracy after each block."""
    timed = blocks[1:]
    per_round = lambda b: (sum(b["train_s"]) + b["eval_s"]) / len(b["train_s"])  # noqa: E731
    return {
        "side": name, **setup,
        "e2e_s_per_round": statistics.median(per_round(b) for b in timed),
        "train_s_per_round": statistics.median(sum(b["train_s"]) / len(b["train_s"]) for b in timed),
        "eval_s": statistics.median(b["eval_s"] for b in timed),
        "warmup_block_s": sum(blocks[0]["train_s"]) + blocks[0]["eval_s"],
        "rounds": timed[-1]["rounds"][1], "accuracy": timed[-1]["accuracy"],
        "accuracy_per_block": [round(b["accuracy"], 4) for b in blocks],
        "client_steps_per_round": timed[-1]["client_steps"] / len(timed[-1]["train_s"]),
        "block_e2e_s_per_round": [round(per_round(b), 4) for b in timed],
        **{k: v for b in blocks for k, v in b.items() if k == "mapping_check"}, **tail,
    }


def ratios(theirs: dict | None, ours: dict) -> dict:
    """Their seconds over ours, end to end, training alone and evaluation, and their training seconds per real
    client-step over ours (the sides may sample other clients of other sizes); None without their row."""
    keys = {"ratio_e2e": "e2e_s_per_round", "ratio_train": "train_s_per_round", "ratio_eval": "eval_s"}
    out = {r: (theirs[k] / ours[k] if theirs else None) for r, k in keys.items()}
    per_step = lambda row: row["train_s_per_round"] / row["client_steps_per_round"]  # noqa: E731
    return {**out, "ratio_train_per_client_step": per_step(theirs) / per_step(ours) if theirs else None}


def find_python(given: str | None, flag: str, variable: str, modules: list[str],
                install: str) -> tuple[str | None, str | None]:
    """(the interpreter that runs a peer, None) or (None, one line on why there is none): ``given`` (the option
    ``flag``), else the environment variable ``variable``, else this interpreter; it must import ``modules``.
    ``install``: how to make such an environment, said when there is none."""
    python = os.path.expanduser(given or os.environ.get(variable) or sys.executable)
    where = flag if given else (variable if os.environ.get(variable) else "this Python")
    if not os.path.exists(python):
        return None, f"{python} ({where}) does not exist; {install}"
    check = subprocess.run([python, "-c", f"import {', '.join(modules)}"], capture_output=True, text=True)
    if check.returncode != 0:
        missing = (check.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{python} ({where}) cannot import {', '.join(modules)} ({missing}); {install}"
    return python, None


def process_peak_bytes() -> int:
    """This process's peak resident memory (Linux counts KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def save_arrays(path: str, arrays: dict) -> str:
    """Writes ``arrays`` (name -> NumPy array) to ``path`` (.npz, uncompressed) for the sides to read."""
    np.savez(path, **arrays)
    return path


def load_arrays(path: str) -> dict:
    """The arrays `save_arrays` wrote, in memory."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def child_env(device: str) -> dict:
    """The environment of a side's process: on a CPU no accelerator is visible to JAX or PyTorch."""
    env = dict(os.environ)
    if device == "cpu":
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    else:
        env.update(XLA_PYTHON_CLIENT_MEM_FRACTION="0.6")  # both sides share the chip
    return env


def add_options(parser, python_flag: str, variable: str, peer: str) -> None:
    """The options every comparison takes: fedjax_pfl's host devices, client mapping and seed, the peer's
    Python (``python_flag``, default the environment variable ``variable``), --no-peer, the logs' folder, the
    rows' file, and the children's own."""
    import argparse

    parser.add_argument("--cpu-devices", default="auto", help="fedjax_pfl's host devices on a CPU (devices.cpu)")
    parser.add_argument("--client-mapping", default="auto",
                        help="fedjax_pfl's client mapping (default: its timed choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(python_flag, help=f"the Python that runs {peer} (default: ${variable}, else this one)")
    parser.add_argument("--no-peer", action="store_true", help="time fedjax_pfl only")
    parser.add_argument("--log-dir", default=None, help="the sides' logs and arrays (default: a temporary folder)")
    parser.add_argument("--out", help="also append the rows to this JSONL file")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)


def compare(benchmark: str, peer: str, found: tuple[str | None, str | None], spec: dict, log_dir: str | None,
            make_arrays, run, out: str | None) -> int:
    """The parent's part of ``benchmark``: says in one line why ``peer`` is not timed when ``found`` (its
    interpreter, or None and why: `find_python`) has none, writes ``make_arrays(spec)`` where the sides read
    them (``spec['arrays']``, in ``log_dir`` or a temporary folder), prints the rows ``run(spec, python, why,
    log_dir)`` returns as JSON lines (also appended to ``out``). A missing data file: one line, exit 2."""
    from fedjax_pfl.core.errors import UserError

    python, why = found
    if why:
        print(f"{benchmark}: {peer} not timed: {why}; timing fedjax_pfl alone", file=sys.stderr)
    log_dir = log_dir or tempfile.mkdtemp(prefix=f"{benchmark}_")
    try:
        spec["arrays"] = save_arrays(os.path.join(log_dir, "workload.npz"), make_arrays(spec))
    except UserError as e:
        print(f"{benchmark}: {e}", file=sys.stderr)
        return 2
    rows = run(spec, python, why, log_dir)
    for row in rows:
        print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0
