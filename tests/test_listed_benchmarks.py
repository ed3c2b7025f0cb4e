"""Every benchmark command docs/benchmarks/index.md lists runs: each listed script in its smallest mode.

A script listed there either runs here with the smallest sizes its options
allow (the code paths of the listed command, small), or is run by the test
named for it, which must exist. A listed script with neither fails, so a
new listing comes with its smallest run.
"""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks" / "index.md"

# script -> the smallest run of what its listed command runs
SMALLEST = {
    # --quick adds the loop-per-batch variant: the variants, tiny
    "rounds_per_second.py": ["--models", "mlp", "--clients", "3", "--samples", "20", "--batch", "8", "--rounds", "1",
                             "--variants", "engine-map,loop-per-batch"],
    "fused_rounds.py": ["--clients", "3", "--batch", "8", "--k", "2", "--rounds", "2", "--eval-every", "2",
                        "--train-per-client", "20", "--mapping", "map"],
    "conv_impl.py": ["--steps", "2", "--batch", "2", "--clients", "2", "--reps", "1", "--modes", "seq"],
    "diversifed_kernel.py": ["--quick", "--ns", "4", "--sizes", "1000", "--repeats", "1", "--naive-budget-s", "0.1",
                             "--no-round"],
    "apple_mix.py": ["--quick", "--repeats", "1"],
    "profile_round.py": ["--workload", "0", "--mappings", "map", "--top", "3"],
    "fedas_round_split.py": ["--quick"],  # its five variants of a tiny synthetic cell
}
# script -> the test that runs it small (file::name)
COVERED = {
    "vs_pytorch.py": "test_benchmarks.py::test_vs_pytorch_tiny_reports_both_sides_or_says_why_not",
    "vs_pfl.py": "test_benchmarks.py::test_vs_pfl_tiny_runs_pfl_researchs_counts_and_says_why_when_the_peer_is_absent",
    "vs_fedjax.py": "test_benchmarks.py::test_vs_fedjax_tiny_runs_fedjaxs_round_and_says_why_when_fedjax_is_absent",
    "seeds_batched.py": "test_benchmarks.py::test_seeds_batched_quick_compares_both_modes_and_they_agree",
    "memory.py": "test_benchmarks.py::test_memory_quick_streamed_chunks_hold_less_than_the_whole_gather",
    "cnn_step.py": "test_benchmarks.py::test_cnn_step_reports_the_step_and_its_op_families",
    "padding_efficiency.py": "test_benchmarks.py::test_padding_efficiency_counts_every_mapping_and_packed_stays_above_097",
    "gpu_suite.py": "test_benchmarks.py::test_gpu_suite_quick_runs_with_only_the_core_packages_and_writes_markdown_and_json",
    "lease.sh": "test_lease_script.py::test_the_tiny_visit_runs_every_step_or_says_why_and_returns_what_the_device_would",
}


def listed_scripts() -> list[str]:
    """The benchmarks/ scripts the page's commands run (``python``, ``python3`` or ``bash``), in order."""
    found = re.findall(r"(?:python3?|bash) benchmarks/([a-z_]+\.(?:py|sh))", PAGE.read_text())
    return list(dict.fromkeys(found))


def test_every_listed_benchmark_has_a_smallest_run():
    listed = listed_scripts()
    assert "rounds_per_second.py" in listed and "vs_fedjax.py" in listed
    assert not [s for s in listed if s not in SMALLEST and s not in COVERED], "listed without a smallest run"
    for script in listed:
        assert (ROOT / "benchmarks" / script).is_file(), script
    for covered in COVERED.values():  # the named tests exist
        file, name = covered.split("::")
        tree = ast.parse((ROOT / "tests" / file).read_text())
        assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, covered


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_a_listed_benchmark_runs_in_its_smallest_mode(script, data_dir):
    env = {**os.environ, "FEDJAX_PFL_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *SMALLEST[script]],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json_records(proc.stdout), proc.stdout[-2000:]


def json_records(out: str) -> list[dict]:
    """The JSON records a benchmark printed: one a line, or one indented document."""
    if out.lstrip().startswith("{") and not out.lstrip().splitlines()[0].rstrip().endswith("}"):
        return [json.loads(out[out.index("{"):])]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
