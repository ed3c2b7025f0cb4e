"""A run's memory estimate (engine/memory_estimate.py): its parts, the changes a refusal names, and what runs
take: each change a refusal names, followed, runs within the memory it was refused on, its peak within 1.5x
of the estimate it prints."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data import client_limits
from fedjax_pfl.engine import memory_estimate as me

HERE = Path(__file__).parent
MB = 10**6
UNITS = {"bytes": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


def test_parts_count_copies_per_device_views_and_mapped_stores():
    shape = me.Shape(clients=1000, part_rows=(30, 10), row_bytes=244, pool_bytes=50 * MB, state_bytes=8 * MB)
    arrays = 1000 * 40 * 244
    one = me.estimate(shape, process=200 * MB)
    assert one.phase == "training" and one.host["client arrays"] == arrays and one.host["client state"] == 16 * MB
    assert one.host_bytes == 200 * MB + me.WORKSPACE + 1000 * me.PER_CLIENT + me.PER_RUN + 50 * MB + arrays + 16 * MB
    two = me.estimate(dataclasses.replace(shape, devices=2), 200 * MB)
    assert two.host["client arrays"] == 2 * arrays  # held whole by each host device
    odd = me.estimate(dataclasses.replace(shape, clients=999, devices=2), 200 * MB)
    assert odd.host["client arrays"] == 3 * 1000 * 40 * 244  # padded to 1000 rows, the original kept beside
    making = me.estimate(dataclasses.replace(shape, pool_bytes=2000 * MB, pool_copies=2), 200 * MB)
    assert making.phase == "making the data" and making.host["host copy"] == 1000 * 30 * 244
    assert me.estimate(dataclasses.replace(shape, pool_bytes=2000 * MB, pool_copies=2, in_place=True),
                       200 * MB).host["host copy"] == 0
    mapped = me.estimate(dataclasses.replace(shape, on_host=True, mapped=True, records=False), 200 * MB)
    assert mapped.host["client arrays"] == 0 and mapped.host["client state"] == 8 * MB
    sweep = me.estimate(dataclasses.replace(shape, runs=4, folders=200), 200 * MB)  # 4 runs' state in one program
    assert sweep.host["client state"] == 4 * 16 * MB
    assert sweep.host["client records"] == 200 * (1000 * me.PER_CLIENT + me.PER_RUN)
    accelerator = me.estimate(dataclasses.replace(shape, accelerator=True), 200 * MB)
    assert accelerator.device["client arrays"] == arrays and accelerator.device["client state"] == 16 * MB
    assert "client arrays" not in {k for k, v in accelerator.host.items() if v}


def _plan(**changes):
    plan = me.RunPlan(dataset="synthetic", partition="natural", num_clients=3000, data_seed=0,
                      samples_per_client=None, size_factor=1, client_state="auto", all_clients_train=False,
                      cpu_devices=1)
    return dataclasses.replace(plan, **changes)


def test_a_refusal_names_only_changes_that_fit_by_the_same_estimate(monkeypatch):
    monkeypatch.setattr(client_limits, "available_bytes", lambda: 2 * 10**9)
    memory = me.RunMemory(_plan(), process=200 * MB)
    with pytest.raises(UserError) as refused:  # lognormal sizes: the largest client pads every other
        memory.check_before_loading()
    message = str(refused.value)
    assert message.startswith("this run would take ") and "more than the 2 GB available" in message
    shape = memory.synthetic_shape(memory.plan)
    changes = memory.fitting_changes(shape, 2 * 10**9, None)
    assert [me.flags(c) for c, _ in changes][0] == "data.synthetic_samples_per_client=50"
    for change, est in changes:
        assert est.host_bytes <= me.SUGGESTED_SHARE * 2 * 10**9 and me.flags(change) in message
        again = me.RunMemory(dataclasses.replace(memory.plan, **change), process=200 * MB)
        assert again.synthetic_shape(again.plan).exact
        again.check_before_loading()  # followed: no refusal
    fewer = next(c for c, _ in changes if "num_clients" in c)["num_clients"]
    too_many = me.RunMemory(_plan(num_clients=fewer + 1), process=200 * MB)
    assert me.estimate(too_many.synthetic_shape(too_many.plan), 200 * MB).host_bytes > me.SUGGESTED_SHARE * 2e9


def test_another_partition_of_generated_data_is_refused_on_a_lower_bound_and_offered_the_natural_one(monkeypatch):
    monkeypatch.setattr(client_limits, "available_bytes", lambda: 10**9)
    memory = me.RunMemory(_plan(partition="dirichlet", num_clients=30000, samples_per_client=50), process=200 * MB)
    with pytest.raises(UserError, match=r"would take at least .* it fits with --partition natural"):
        memory.check_before_loading()


def _train(limit, *args, tmp: Path):
    """The command as a user runs it: XLA's own compile flags and no compilation cache (the suite's faster
    compiles take less memory than the workspace the estimate counts), one host device."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    proc = subprocess.run([sys.executable, str(HERE / "memory_limited_train.py"), str(limit), "--method", "fedavg",
                           "--dataset", "synthetic", "--model", "mlr", "--rounds", "1", "--local-epochs", "1",
                           "--join-ratio", "0.01", "--partition", "natural", "--no-progress",
                           "--out", str(tmp), *args], capture_output=True, text=True, timeout=600, env=env)
    peak = int(re.search(r"peak_rss_bytes=(\d+)", proc.stdout)[1])
    return proc, peak


def test_each_change_a_refusal_names_runs_within_the_memory_refused_and_its_estimate(tmp_path):
    """3,000 clients of FedProx's lognormal sizes on a machine of 1.2 GB: refused, naming a fixed client size and
    fewer clients; each followed runs (exit 0) on that machine, its peak under 1.2 GB and within 1.5x of the
    estimate it printed."""
    limit = 1_200_000_000
    refused, _ = _train(limit, "--num-clients", "3000", tmp=tmp_path / "refused")
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("error: this run would take ") and "; it fits with " in line
    suggestions = [re.sub(r" \(about [^)]*\)$", "", s) for s in line.split("; it fits with ", 1)[1].split("; or ")]
    assert len(suggestions) >= 2 and "data.synthetic_samples_per_client=50" in suggestions
    for i, suggestion in enumerate(suggestions):  # (a flag given again: the last one counts)
        followed, peak = _train(limit, "--num-clients", "3000", *suggestion.split(), tmp=tmp_path / f"followed{i}")
        assert followed.returncode == 0, (suggestion, followed.stderr[-2000:])
        estimate = _bytes(re.search(r"memory estimate: (\S+ \S+) of host memory", followed.stdout)[1])
        assert peak <= limit and estimate / 1.5 <= peak <= 1.5 * estimate, (suggestion, peak, estimate)


def test_the_generators_own_clients_of_one_size_are_estimated_as_views_of_the_samples():
    """--partition natural with data.synthetic_samples_per_client: the clients' arrays are the samples reshaped (no
    host copy while they are made), and the samples are freed once they are."""
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment, validate

    cfg = config_lib.build(overrides=["method_name=fedavg", "data.name=synthetic", "partition.scheme=natural",
                                      "partition.num_clients=40", "model.name=mlr",
                                      "data.synthetic_samples_per_client=40"])
    memory = build_experiment(validate(cfg)).data.memory
    assert memory.checked.in_place and not memory.checked.keeps_pool and memory.checked.part_rows == (30, 10)
    assert memory.estimate.line().startswith("memory estimate: ")
