"""benchmarks/lease.sh, the lent GPU's one command, run end to end on the CPU in its tiny mode."""

import os
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = """
paper: "Tiny paper"
table: "Table 0"
metric: best
seeds: [0]
grid:
  overrides: [data.name=synthetic, partition.scheme=dirichlet, partition.num_clients=4, data_seed=3, model.name=mlr,
              train.rounds=2, train.local_epochs=1, train.batch_size=16]
  axes:
    - {name: a, key: partition.alpha, values: [0.3, 1.0]}
methods:
  - {name: global, method: fedavg}
"""
STEPS = ("(a) device and peaks", "(b) Pallas tests", "(c) GPU suite", "(d) scale rows", "(e) vs pfl-research",
         "(f) tiny cells")
RETURNED = {"summary.md", "lease.log", "device.json", "suite.md", "suite.json", "rows.jsonl", "table.md",
            "records.tar.gz"}


def _lease(tmp_path, env: dict, seconds: str = "60"):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "OUT": str(tmp_path / "out"),
           "LEASE_WORK": str(tmp_path / "work"), **env}
    return subprocess.run(["bash", "benchmarks/lease.sh", seconds], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def test_the_tiny_visit_runs_every_step_or_says_why_and_returns_what_the_device_would(tmp_path):
    table = tmp_path / "tiny.yaml"
    table.write_text(TABLE)
    proc = _lease(tmp_path, {"LEASE_TINY": "1", "LEASE_TABLE": str(table),
                             "LEASE_CELLS": "global-a0.3/seed0,global-a1.0/seed0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    files = {p.name for p in out.iterdir()}
    assert all(p.is_file() for p in out.iterdir()) and files <= RETURNED and len(files) <= 8, files
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in summary.splitlines() if line.startswith("| (")}
    assert list(rows) == list(STEPS), summary
    for label, line in rows.items():  # each step ran, or says why it did not
        assert "| ran |" in line or ("not run" in line and line.rstrip(" |").rsplit(" | ", 1)[-1].strip()) or (
            "exit" in line and line.rstrip(" |").rsplit(" | ", 1)[-1].strip()), line  # ran, or why not
        if "| ran |" in line:
            assert {"(a) device and peaks": "device.json", "(b) Pallas tests": "lease.log",
                    "(c) GPU suite": "suite.md", "(d) scale rows": "rows.jsonl",
                    "(f) tiny cells": "records.tar.gz"}[label] in files, (label, files)
    assert "(e) vs pfl-research | not run | 0 | tiny mode" in summary
    if "| ran |" in rows["(d) scale rows"]:  # both variants of the tiny workload, as the device would time them
        import json
        rows_back = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
        assert {r["variant"] for r in rows_back} == {"device", "host"}, rows_back
    if "records.tar.gz" in files:
        with tarfile.open(out / "records.tar.gz") as tar:
            names = tar.getnames()
        assert {n.split("/")[1] for n in names} <= {"global-a0.3", "global-a1.0"} and not any(
            "checkpoint" in n or n.endswith(".npz") for n in names), names
    assert "lease: done after" in (out / "lease.log").read_text()


def test_without_the_data_it_refuses_in_one_line_before_any_step(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = _lease(tmp_path, {"FEDJAX_PFL_DATA_DIR": str(tmp_path / "empty")}, "560")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), proc.stderr
    assert "cifar10" in err[0] and "mkdir -p .dev/data" in err[0] and "carry .dev/data" in err[0]
    assert not (tmp_path / "out" / "summary.md").exists() and not (tmp_path / "work" / "device").exists()


def test_bad_seconds_are_one_line_exit_2(tmp_path):
    proc = _lease(tmp_path, {}, "ten")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "SECONDS must be a whole number" in proc.stderr


def test_the_suite_takes_the_device_from_its_file_adds_rows_and_leaves_no_parameter_dumps(tmp_path):
    """A visit measures the device once (--device-only); its suite reads the peaks from that file
    (--device-json, here made up so it shows), runs --extra-rows after the product and keeps the final
    parameters it compares by out of --out."""
    import json
    import sys

    device = {"device": "cpu: made up", "jax": "0", "backend": "cpu", "copy_bandwidth": {"bytes_per_s": 7.0e9},
              "matmul_peak": [{"dtype": "bf16", "n": 1, "flops_per_s": 4.2e13}, {"dtype": "fp32", "n": 1,
                                                                                   "flops_per_s": 2.1e13}]}
    (tmp_path / "device.json").write_text(json.dumps(device))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--quick", "--methods", "fedavg", "--models",
                           "mlp", "--sides", "jax", "--mappings", "map", "--variants", "direct:fp32:default",
                           "--extra-rows", "packed:direct:fp32:default", "--device-json", str(tmp_path / "device.json"),
                           "--out", str(tmp_path / "suite")], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "suite" / "suite.json").read_text())
    assert report["device"] == "cpu: made up" and report["matmul_peak"] == device["matmul_peak"]
    assert [r["mapping"] for r in report["records"]] == ["map", "packed"]
    assert "| bf16 | 1 | 42 |" in (tmp_path / "suite" / "suite.md").read_text()
    assert sorted(p.name for p in (tmp_path / "suite").iterdir()) == ["suite.json", "suite.jsonl", "suite.md"]
