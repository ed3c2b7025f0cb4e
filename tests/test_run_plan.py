"""Run plans for tables (--plan-for-seconds): order, packing, estimates, the commands a plan runs."""

import csv
import dataclasses
import json
import os
import random
import subprocess

import pytest

from fedjax_pfl.outputs import results_writer, run_folder
from fedjax_pfl.papers import reproduce, round_seconds, run_plan, table_spec
from fedjax_pfl.papers.run_plan import Margins, Step
from fedjax_pfl.runs import config as config_lib
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
    assert not (tmp_path / "o" / "run_plan.sh").exists()


@pytest.mark.parametrize("args, message", [
    (["--plan-for-seconds", "700", "--dry-run"], "give one of them"),
    (["--cells", "fedas-beta0.1_P0.6/seed0", "--methods", "fedas"], "--cells names the cells itself"),
    (["--cells", "fedas-nowhere/seed0"], "is not a cell of fedas_table3"),
    (["--cells", "fedas-beta0.1_P0.6/seed0,fedas-beta0.1_P0.6/seed0"], "distinct cells"),
    (["--plan-for-seconds", "700", "--device-kind", "tpu-v9"], "no measurements for device kind 'tpu-v9'"),
])
def test_bad_plan_options_are_one_line_exit_2(args, message, tmp_path, capsys):
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


def test_without_the_dataset_files_the_planner_refuses_and_keeps_the_plan_there(tmp_path, monkeypatch, capsys):
    """No FEDJAX_PFL_DATA_DIR with the files: one line, exit 2, and the plan already in OUT is not replaced by an
    empty one."""
    monkeypatch.setenv("FEDJAX_PFL_DATA_DIR", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    out = tmp_path / "o"
    out.mkdir()
    (out / "run_plan.sh").write_text("# the plan made before\n")
    assert reproduce.main(["fedas_table3", "--plan-for-seconds", "700", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to plan" in err[0] and "FEDJAX_PFL_DATA_DIR" in err[0], err
    assert (out / "run_plan.sh").read_text() == "# the plan made before\n"
    assert sorted(p.name for p in out.iterdir()) == ["run_plan.sh"]


def test_a_plan_script_runs_with_no_argument_and_refuses_missing_data_in_one_line(tmp_path, monkeypatch, data_dir):
    """run_plan.sh with no argument takes the planned command's seconds and the table's folder; without the
    dataset files there, the command it starts stops before training: one line, exit 2."""
    table = _tiny(tmp_path, monkeypatch)
    out = tmp_path / "table"
    cifar = table.read_text().replace("data.name=synthetic, partition.scheme=natural",
                                      "data.name=cifar10_jpeg, partition.scheme=iid")
    table.write_text(cifar)
    monkeypatch.setenv("FEDJAX_PFL_DATA_DIR", str(data_dir))
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--plan-for-seconds", "700",
                           "--device-kind", "tiny-device", "--seeds", "0"]) == 0
    env = {**os.environ, "FEDJAX_PFL_DATA_DIR": str(tmp_path / "nowhere")}
    proc = subprocess.run(["bash", out / "run_plan.sh"], capture_output=True, text=True, env=env, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: dataset files missing"), proc.stderr
    assert not (out / "runs").exists()


def test_cells_naming_some_rows_of_a_setting_write_the_table_of_their_rows_and_settings(tmp_path, monkeypatch):
    """--cells naming one row in one setting and both in another (a plan's run list cut mid-setting): the table
    is written (the rows x settings they span, the others not run), no KeyError."""
    table = _tiny(tmp_path, monkeypatch)
    text = table.read_text().replace("settings:\n  - name: synth\n", "settings:\n  - name: synth\n")
    second = text[text.index("  - name: synth"):text.index("methods:")].replace("name: synth", "name: synth2")
    table.write_text(text.replace("methods:", second + "methods:").replace("train.rounds=4", "train.rounds=1"))
    out = tmp_path / "o"
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--no-progress",
                           "--cells", "global-synth/seed0,local-synth/seed0,global-synth2/seed0"]) == 0
    rows = {(r["method"], r["setting"]): r["status"] for r in csv.DictReader(open(out / "table.csv"))}
    assert rows == {("local", "synth"): "1 finished", ("global", "synth"): "1 finished",
                    ("local", "synth2"): "1 not run", ("global", "synth2"): "1 finished"}
