"""The suite sets only the fast-compile XLA flags this jaxlib accepts (tests/xla_flags.py)."""

import os

from xla_flags import accepted, starts_with

UNKNOWN = "--xla_no_such_flag_in_any_jaxlib=true"  # as --xla_cpu_use_fusion_emitters is to jaxlib 0.11.2


def test_an_unknown_flag_is_left_out_and_the_known_ones_kept():
    known = ["--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"]
    assert not starts_with([UNKNOWN])  # XLA aborts the process: what the suite must never set
    assert accepted([known[0], UNKNOWN, known[1]]) == known


def test_the_flags_the_suite_runs_under_start_a_fresh_process():
    flags = os.environ["XLA_FLAGS"].split()
    assert "--xla_backend_optimization_level=0" in flags and starts_with(flags)
