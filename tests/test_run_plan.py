"""Lease plans for tables: order, packing, estimates, the commands a lease runs and the records it brings back."""

import csv
import dataclasses
import json
import random
import shlex
import subprocess
import tarfile

import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import metrics_file, results_writer, run_folder
from fedjax_pfl.papers import reproduce, round_seconds, run_plan, run_records, table_spec
from fedjax_pfl.papers.run_plan import Margins, Step
from fedjax_pfl.runs import config as config_lib
from signal_after_round import signal_after
from test_reproduce import TINY as REPRODUCE_TINY

MARGINS = Margins(command_start=40, cell_start=25, stop=30, pack=10)

# test_reproduce's tiny table, with a paper number for both rows and the headline on the second
TINY = (REPRODUCE_TINY.replace("seeds: [0, 1, 2]", "seeds: [0, 1]")
        .replace("paper_results: {local: {synth: 55.5}}", "paper_results: {local: {synth: 55.5}, global: {synth: 60.0}}")
        + "headline: {row: global, settings: [synth]}\n")
assert "headline" in TINY and "global: {synth: 60.0}" in TINY

# a record whose one workload is the tiny table's: FedAvg at 2 s a round on the "kind" tiny-device
RECORD = {"kinds": {"tiny-device": {
    "machine": "cpu: nowhere", "command_limit_seconds": 600,
    "margins_seconds": {"command_start": 40, "cell_start": 25, "stop": 30, "pack": 10},
    "workloads": [{"config": {"model.name": "mlr", "partition.num_clients": 3, "train.batch_size": 16,
                              "train.local_epochs": 1, "train.join_ratio": 1.0, "train.client_mapping": "vmap"},
                   "seconds_per_round": {"fedavg": 2.0}, "source": {"fedavg": "made up"}}]}},
    "work": {"methods": {}}}


def _cell(name: str, seed: int = 0):
    spec = table_spec.find_table("fedas_table3")
    return next(c for c in spec.cells(seeds=[seed]) if c.group_name == name)


def _steps(seconds: list[float]) -> list[Step]:
    spec = table_spec.find_table("fedas_table3")
    cells = spec.cells(seeds=[0])
    return [Step((cells[i],), "new", 40, (s - MARGINS.cell_start) / 40, "test") for i, s in enumerate(seconds)]


@pytest.mark.parametrize("seed", range(30))
def test_packing_never_exceeds_its_budget_in_its_own_estimate(seed):
    rng = random.Random(seed)
    steps = _steps([rng.uniform(30, 900) for _ in range(rng.randint(1, 40))])
    lease = rng.uniform(200, 2000)
    plan = run_plan.pack(steps, lease, 600, MARGINS)
    assert all(c.seconds <= 600 for c in plan.commands) and sum(c.seconds for c in plan.commands) <= lease
    for command in plan.commands:
        assert command.estimate(MARGINS) <= command.seconds + 1e-9
        assert all(seconds > 0 for _, seconds in command.parts)
    for step in plan.planned:  # a step split over commands pays its start again in each later one
        parts = [s for c in plan.commands for st, s in c.parts if st is step]
        assert sum(parts) == pytest.approx(step.seconds(MARGINS) + MARGINS.cell_start * (len(parts) - 1))
    order = [steps.index(s) for s in plan.planned]
    assert order == sorted(order) and set(plan.planned) | set(plan.left) == set(steps)
    assert len(plan.planned) + len(plan.left) == len(steps)


def test_a_step_longer_than_a_command_continues_in_the_next_and_one_past_the_lease_waits():
    steps = _steps([700, 100])
    plan = run_plan.pack(steps, 1200, 600, MARGINS)  # two commands of 600, 510 s of room each
    assert [[round(s) for _, s in c.parts] for c in plan.commands] == [[510], [215, 100]]
    plan = run_plan.pack(_steps([2000, 100]), 1200, 600, MARGINS)
    assert [s.seconds(MARGINS) for s in plan.left] == [2000] and [round(s) for _, s in plan.commands[0].parts] == [100]


def test_the_headline_column_comes_first_its_rivals_nearest_first_then_its_group_then_more_seeds():
    spec = table_spec.find_table("fedas_table3")
    ordered = run_plan.priority(spec, spec.cells(seeds=[0, 1, 2]))
    first = ordered[:10]
    assert {c.setting.name for c in first} == {"beta0.1_P0.6"} and {c.seed for c in first} == {0}
    # FedAS, then by distance of the paper's P0.6 number to FedAS's 90.81
    assert [c.method.name for c in first] == ["fedas", "fedala", "fedper", "lgfedavg", "fedpac", "fedbabu",
                                              "fedproto", "ditto", "fedavg_p", "fedprox_p"]
    assert [c.setting.name for c in ordered[10:40:10]] == ["beta0.1_P0.2", "beta0.1_P0.4", "beta0.1_P1"]
    assert {c.setting.group for c in ordered[:40]} == {"beta0.1"} and ordered[40].setting.group == "beta0.3"
    assert all(c.seed == 0 for c in ordered[:120]) and {c.seed for c in ordered[120:]} == {1, 2}
    assert [c.folder_name for c in ordered[120:122]] == ["fedas-beta0.1_P0.6/seed1", "fedas-beta0.1_P0.6/seed2"]
    plain = dataclasses.replace(spec, headline_row=None, headline_settings=())  # without one: column by column
    by_column = [c for s in spec.settings for c in spec.cells(settings=[s.name], seeds=[0])]
    assert run_plan.priority(plain, spec.cells(seeds=[0])) == by_column


def test_a_cells_further_seeds_are_one_step_when_they_share_a_program():
    cells = [_cell("fedas-beta0.1_P0.6", 0), _cell("fedas-beta0.1_P0.6", 1), _cell("fedas-beta0.1_P0.6", 2)]
    states = {c.folder_name: s for c, s in zip(cells, ("finished", "new", "new"))}
    estimate = {"fedas-beta0.1_P0.6": round_seconds.Estimate(2.0, "x")}
    steps = run_plan.plan_steps(cells, states, dict.fromkeys(states, 40), estimate, {"fedas-beta0.1_P0.6"})
    assert [s.label for s in steps] == ["fedas-beta0.1_P0.6 seeds 1,2"]
    assert steps[0].seconds(MARGINS) == MARGINS.cell_start + 2 * 40 * 2.0
    steps = run_plan.plan_steps(cells, states, dict.fromkeys(states, 40), estimate, set())
    assert [s.label for s in steps] == ["fedas-beta0.1_P0.6 seed 1", "fedas-beta0.1_P0.6 seed 2"]


def test_estimates_scale_the_measured_rows_by_the_work_of_a_round():
    record = round_seconds.load_record()
    kind = round_seconds.kind_record(record, "nvidia-h200")
    anchors = round_seconds.record_anchors(kind)
    config = lambda name: config_lib.to_dict(reproduce.build_config(  # noqa: E731
        reproduce.base_argv(_cell(name), ["train.client_mapping=vmap"])))
    fedas = round_seconds.estimate(config("fedas-beta0.1_P0.6"), [], anchors, record["work"])
    assert fedas.seconds_per_round == pytest.approx(2.92 * 12 / 20) and "fifth lease" in fedas.source
    # FedPer, never measured: FedAvg's 1.82 s for 20 clients x 5 epochs, times 12 x 5, with the prior's margin
    fedper = round_seconds.estimate(config("fedper-beta0.1_P0.6"), [], anchors, record["work"])
    assert fedper.seconds_per_round == pytest.approx(round_seconds.PRIOR_MARGIN * 1.82 / 100 * 60)
    # FedAvg-P fine-tunes every client 5 epochs at each evaluation
    assert round_seconds.round_work(config("fedavg_p-beta0.1_P0.2"), record["work"]) == 8 * 5 + 20 * 5
    assert round_seconds.steady_seconds([{"round": 1, "seconds": 9.0}, {"round": 2, "seconds": 9.0},
                                         {"round": 4, "seconds": 15.0}]) == pytest.approx(2.0)
    assert round_seconds.steady_seconds([{"round": 1, "seconds": 9.0}]) is None
    other = {**RECORD["kinds"]["tiny-device"], "workloads": []}
    unknown = round_seconds.estimate(config("fedas-beta0.1_P0.6"), [], round_seconds.record_anchors(other), {})
    assert unknown.seconds_per_round is None and unknown.source.startswith("unknown")


@pytest.mark.parametrize("value, message", [
    ("abc", "invalid float value"), ("0", "at least"), ("-5", "at least"), ("nan", "at least"), ("inf", "at least"),
    ("100", "at least 175"),
])
def test_bad_plan_for_seconds_is_one_line_exit_2(value, message, tmp_path, capsys):
    assert reproduce.main(["fedas_table3", "--plan-for-seconds", value, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "o" / "lease_plan.sh").exists()


@pytest.mark.parametrize("args, message", [
    (["--plan-for-seconds", "700", "--dry-run"], "give one of them"),
    (["--cells", "fedas-beta0.1_P0.6/seed0", "--methods", "fedas"], "--cells names the cells itself"),
    (["--cells", "fedas-nowhere/seed0"], "is not a cell of fedas_table3"),
    (["--cells", "fedas-beta0.1_P0.6/seed0,fedas-beta0.1_P0.6/seed0"], "distinct cells"),
    (["--pack-records", "x.tar.gz"], "give --out WORK"),
    (["--plan-for-seconds", "700", "--device-kind", "tpu-v9"], "no measurements for device kind 'tpu-v9'"),
])
def test_bad_lease_options_are_one_line_exit_2(args, message, tmp_path, capsys):
    assert reproduce.main(["fedas_table3", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def _tiny(tmp_path, monkeypatch):
    table = tmp_path / "tiny.yaml"
    table.write_text(TINY)
    record = tmp_path / "record.json"
    record.write_text(json.dumps(RECORD))
    monkeypatch.setattr(round_seconds, "RECORD", record)
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)
    return table


def _accuracies(folder) -> list[float]:
    return [r["accuracy"] for r in run_folder.read_records(folder)]


def test_a_lease_cut_mid_cell_resumes_to_the_numbers_of_an_uninterrupted_run_and_lands_here(tmp_path, monkeypatch,
                                                                                            capsys):
    table = _tiny(tmp_path, monkeypatch)
    out = tmp_path / "table"
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--plan-for-seconds", "700",
                           "--device-kind", "tiny-device", "--seeds", "0"]) == 0
    plan = json.loads((out / "lease_plan.json").read_text())
    # the headline row (global) first, 25 s + 4 rounds x 2 s; one command holds both
    assert plan["run_list"] == ["global-synth/seed0", "local-synth/seed0"] and len(plan["commands"]) == 1
    local = 25 + 4 * 2.0 * round_seconds.PRIOR_MARGIN  # "local" never measured: FedAvg's rate, with the margin
    assert [s["seconds"] for s in plan["commands"][0]["steps"]] == pytest.approx([33.0, local])
    script = (out / "lease_plan.sh").read_text()
    assert "cells=global-synth/seed0,local-synth/seed0" in script
    assert subprocess.run(["bash", "-n", out / "lease_plan.sh"]).returncode == 0
    too_short = subprocess.run(["bash", out / "lease_plan.sh", "100"], capture_output=True, text=True)
    assert too_short.returncode == 2 and "SECONDS too small" in too_short.stdout
    assert "Next lease (tiny-device" in (out / "table.md").read_text()
    # the lease's commands, as the script runs them: the first cut after the first cell's round 2 (SIGINT)
    line = next(ln for ln in script.splitlines() if ln.startswith("timeout "))
    argv = shlex.split(line.split('"$python" -m fedjax_pfl.reproduce ', 1)[1].split(" 2>&1")[0])
    work = tmp_path / "work"
    argv = [a.replace("$work", str(work)).replace("$cells", ",".join(plan["run_list"])) for a in argv]
    assert reproduce.main(argv, observe=signal_after(2, "INT")) == 130
    assert json.loads((work / "runs/global-synth/seed0/summary.json").read_text())["status"] == "interrupted"
    assert reproduce.main(["--table-file", str(table), "--out", str(work), "--pack-records",
                           str(tmp_path / "first.tar.gz")]) == 0
    capsys.readouterr()
    assert reproduce.main(argv) == 0
    assert "global-synth/seed0: resume" in capsys.readouterr().out
    assert reproduce.main(["--table-file", str(table), "--out", str(work), "--pack-records",
                           str(tmp_path / "second.tar.gz")]) == 0
    with tarfile.open(tmp_path / "second.tar.gz") as tar:
        names = sorted(tar.getnames())
    compact = ("config.json", "summary.json", metrics_file.COMPACT)  # finished runs come back compact
    assert names == sorted(f"runs/{c}/{f}" for c in plan["run_list"] for f in compact)
    assert (work / "runs/global-synth/seed0/checkpoint").is_dir()  # left behind
    # the same cell run straight through, elsewhere
    straight = tmp_path / "straight"
    assert reproduce.main(["--table-file", str(table), "--out", str(straight), "--cells", "global-synth/seed0",
                           "--no-progress", "train.client_mapping=vmap"]) == 0
    assert _accuracies(work / "runs/global-synth/seed0") == _accuracies(straight / "runs/global-synth/seed0")
    capsys.readouterr()
    # here: the first archive holds the cut run (not landed), the second the finished ones
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--bring-back", str(tmp_path / "first.tar.gz"),
                           "--bring-back", str(tmp_path / "second.tar.gz")]) == 0
    printed = capsys.readouterr().out
    assert "landed 2 run(s)" in printed and "cut by the lease" not in printed  # (the second archive finished it)
    landed = out / "runs/global-synth/seed0"
    assert sorted(p.name for p in landed.iterdir()) == sorted(compact)
    assert _accuracies(landed) == _accuracies(straight / "runs/global-synth/seed0")
    rows = {r["method"]: r for r in csv.DictReader(open(out / "table.csv"))}
    assert rows["global"]["status"] == "1 finished, 1 not run" and float(rows["global"]["paper"]) == pytest.approx(0.6)
    replanned = json.loads((out / "lease_plan.json").read_text())  # planned again: all the seeds, seed 1 left
    assert replanned["run_list"] == ["global-synth/seed1", "local-synth/seed1"] and replanned["plan_for_seconds"] == 700
    assert "Expected to finish 2 cell(s): global-synth/seed1, local-synth/seed1" in (out / "table.md").read_text()
    # landing the same records again keeps what is here
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--bring-back",
                           str(tmp_path / "second.tar.gz")]) == 0
    assert "landed 0 run(s); 2 already here" in capsys.readouterr().out


def test_a_records_archive_holding_anything_else_is_refused(tmp_path):
    bad = tmp_path / "records.tar.gz"
    (tmp_path / "ckpt").write_text("x")
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "ckpt", arcname="runs/fedas-beta0.1_P0.6/seed0/checkpoints/1/state")
    with pytest.raises(UserError, match="is not a run record"):
        run_records.land([tmp_path], tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_seeds_of_a_setting_with_a_fixed_data_seed_run_as_one_program_and_equal_one_by_one(tmp_path, monkeypatch,
                                                                                             capsys):
    table = tmp_path / "seeded.yaml"
    table.write_text(TINY.replace("train.rounds_per_call=1]", "train.rounds_per_call=1, data_seed=7]")
                     .replace("train.rounds=4", "train.rounds=2"))
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)
    for mode in ("together", "one_by_one"):
        argv = ["--table-file", str(table), "--out", str(tmp_path / mode), "--methods", "global", "--no-progress"]
        assert reproduce.main([*argv, *(["--one-by-one"] if mode == "one_by_one" else [])]) == 0
        assert ("global-synth seeds 0,1 (one program): new" in capsys.readouterr().out) == (mode == "together")
    for seed in (0, 1):
        together, alone = (_accuracies(tmp_path / m / f"runs/global-synth/seed{seed}") for m in ("together",
                                                                                                 "one_by_one"))
        assert together == pytest.approx(alone, abs=1e-5)
    configs = [json.loads((tmp_path / m / "runs/global-synth/seed1/config.json").read_text())["config"]
               for m in ("together", "one_by_one")]
    assert configs[0]["data_seed"] == configs[1]["data_seed"] == 7 and not configs[0]["vary_data_with_seed"]
