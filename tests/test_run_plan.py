"""Run plans for tables (--plan-for-seconds): order, packing, estimates, the commands a plan runs."""

import csv
import dataclasses
import json
import os
import random
import subprocess

import numpy as np
import pytest

from fedjax_pfl.outputs import results_writer, run_folder
from fedjax_pfl.engine import client_mapping
from fedjax_pfl.cells import plan_command, plan_log, reproduce, round_seconds, run_plan
from fedjax_pfl.papers import table_spec
from fedjax_pfl.cells.run_plan import Margins, Step
from fedjax_pfl.runs import config as config_lib
from test_reproduce import TINY as REPRODUCE_TINY

MARGINS = Margins(command_start=40, cell_start=25, stop=30, pack=10)

# test_reproduce's tiny table, with a paper number for both rows and the headline on the second
TINY = (REPRODUCE_TINY.replace("seeds: [0, 1, 2]", "seeds: [0, 1]")
        .replace("paper_results: {local: {synth: 55.5}}", "paper_results: {local: {synth: 55.5}, global: {synth: 60.0}}")
        + "headline: {row: global, settings: [synth]}\n")
assert "headline" in TINY and "global: {synth: 60.0}" in TINY

# a record for the "kind" tiny-device: a step of W lanes takes 0.05 + 0.01 W seconds
RECORD = {"kinds": {"tiny-device": {
    "machine": "cpu: nowhere", "command_limit_seconds": 600,
    "margins_seconds": {"command_start": 40, "cell_start": 25, "stop": 30, "pack": 10},
    "lane_step_seconds": {"fixed": 0.05, "per_lane": 0.01, "source": "made up"}}},
    "work": {"methods": {}}}


def _cell(name: str, seed: int = 0):
    spec = table_spec.find_table("fedas_table3")
    return next(c for c in spec.cells(seeds=[seed]) if c.group_name == name)


def _queues(rng) -> list[list]:
    """Random queues of fedas_table3's cells (a method's cells each, as the planner makes them)."""
    spec = table_spec.find_table("fedas_table3")
    by_method = [spec.cells([m.name], seeds=[0, 1]) for m in spec.methods]
    return [q[:rng.randint(1, len(q))] for q in rng.sample(by_method, rng.randint(1, len(by_method)))]


def _step_of(rng):
    """A program's Step: each cell its own made-up cost, k cells together 60% of their sum (a batching factor)."""
    cost = {}

    def step_of(cells):
        per_cell = [cost.setdefault(c.folder_name, rng.uniform(0.5, 12)) for c in cells]
        return Step(tuple(cells), "new", 40, sum(per_cell) * (1.0 if len(cells) == 1 else 0.6), "test")

    return step_of


@pytest.mark.parametrize("seed", range(30))
def test_packing_never_exceeds_its_budget_in_its_own_estimate(seed):
    rng = random.Random(seed)
    queues, step_of = _queues(rng), _step_of(rng)
    budget = rng.uniform(200, 2000)
    plan = run_plan.pack(queues, step_of, budget, 600, MARGINS)
    assert all(c.seconds <= 600 for c in plan.commands) and sum(c.seconds for c in plan.commands) <= budget
    for command in plan.commands:
        assert command.estimate(MARGINS) <= command.seconds + 1e-9
        assert all(seconds > 0 for _, seconds in command.parts)
    planned = [c for step in plan.planned for c in step.cells]
    left = [c for step in plan.left for c in step.cells]
    assert sorted(c.folder_name for c in planned + left) == sorted(c.folder_name for q in queues for c in q)
    for step in plan.planned + plan.left:  # one method's cells, in their queue's order
        queue = next(q for q in queues if step.cells[0] in q)
        at = queue.index(step.cells[0])
        assert list(step.cells) == queue[at:at + len(step.cells)]


def test_a_program_too_long_for_any_command_waits_and_later_queues_fill_the_time():
    spec = table_spec.find_table("fedas_table3")
    long, short = spec.cells(["fedas"], seeds=[0])[:1], spec.cells(["fedper"], seeds=[0])[:2]

    def step_of(cells):  # fedas's one cell takes 2000 s, fedper's 1 s a round a cell
        return Step(tuple(cells), "new", 40, 50.0 if cells[0] in long else len(cells) * 1.0, "test")

    plan = run_plan.pack([long, short], step_of, 1200, 600, MARGINS)  # two commands of 600, 510 s of room each
    assert [[len(s.cells) for s, _ in c.parts] for c in plan.commands] == [[2]]
    assert [s.cells for s in plan.left] == [tuple(long)] and plan.planned[0].seconds(MARGINS) == 25 + 40 * 2.0


def test_the_headline_row_across_its_group_first_then_its_rivals_nearest_first_then_more_seeds():
    spec = table_spec.find_table("fedas_table3")
    ordered = run_plan.priority(spec, spec.cells(seeds=[0, 1, 2]))
    # the paper's own row across the headline's column block, the headline setting first
    assert [c.folder_name for c in ordered[:4]] == ["fedas-beta0.1_P0.6/seed0", "fedas-beta0.1_P0.2/seed0",
                                                     "fedas-beta0.1_P0.4/seed0", "fedas-beta0.1_P1/seed0"]
    rivals = ordered[4:13]
    assert {c.setting.name for c in rivals} == {"beta0.1_P0.6"} and {c.seed for c in rivals} == {0}
    # then by distance of the paper's P0.6 number to FedAS's 90.81
    assert [c.method.name for c in rivals] == ["fedala", "fedper", "lgfedavg", "fedpac", "fedbabu", "fedproto",
                                               "ditto", "fedavg_p", "fedprox_p"]
    assert [c.setting.name for c in ordered[13:40:9]] == ["beta0.1_P0.2", "beta0.1_P0.4", "beta0.1_P1"]
    assert {c.setting.group for c in ordered[:40]} == {"beta0.1"} and ordered[40].setting.group == "beta0.3"
    assert all(c.seed == 0 for c in ordered[:120]) and {c.seed for c in ordered[120:]} == {1, 2}
    assert [c.folder_name for c in ordered[120:122]] == ["fedas-beta0.1_P0.6/seed1", "fedas-beta0.1_P0.6/seed2"]
    plain = dataclasses.replace(spec, headline_row=None, headline_settings=())  # without one: column by column
    by_column = [c for s in spec.settings for c in spec.cells(settings=[s.name], seeds=[0])]
    assert run_plan.priority(plain, spec.cells(seeds=[0])) == by_column


def test_a_methods_new_cells_are_one_queue_and_a_program_costs_less_than_its_cells_alone(tmp_path, monkeypatch):
    """The planner's queues (a method's new cells together; finished cells out; --one-by-one: a cell each) and its
    model: a program of k cells as rows takes about max(largest client, all steps / W) steps of W lanes, fewer
    seconds than the k cells one by one (the batching factor), and calibration scales by measured programs."""
    import types

    table = _tiny(tmp_path, monkeypatch)
    table.write_text(table.read_text().replace("seeds: [0, 1]", "seeds: [0, 1, 2]"))
    spec = table_spec.load_table(table)
    cells = run_plan.priority(spec, spec.cells())
    out = tmp_path / "o"
    record = json.loads(round_seconds.RECORD.read_text())
    kind = record["kinds"]["tiny-device"]
    rounds = {"synth": (4, 4)}
    args = types.SimpleNamespace(data_dir=None, one_by_one=False, device_kind="tiny-device")
    queues, states, step_of = plan_command.program_queues(cells, out, rounds, [], args, {}, {}, kind, record)
    assert [[c.folder_name for c in q] for q in queues] == [
        ["global-synth/seed0", "global-synth/seed1", "global-synth/seed2"],
        ["local-synth/seed0", "local-synth/seed1", "local-synth/seed2"]]
    args.one_by_one = True
    assert [len(q) for q in plan_command.program_queues(cells, out, rounds, [], args, {}, {}, kind, record)[0]] == [1] * 6
    law, sizes = round_seconds.lane_law(kind), round_seconds.ClientSizes()
    cfgs = [reproduce.build_config(reproduce.cell_argv(c, out / "runs" / c.folder_name, 4)).config for c in queues[0]]
    steps = np.concatenate([cfg.train.local_epochs * -(-sizes(cfg) // cfg.train.batch_size) for cfg in cfgs])
    lanes = client_mapping.packed_width(steps, len(steps), backend="gpu")
    want = max(steps.max(), steps.sum() / lanes) * law.step(lanes)
    assert round_seconds.program_seconds(cfgs, law, record["work"], sizes) == pytest.approx(want)
    assert step_of(queues[0]).seconds_per_round == pytest.approx(want)
    alone = sum(round_seconds.program_seconds([cfg], law, record["work"], sizes) for cfg in cfgs)
    assert alone > want  # the batching factor: three cells as rows take less than three programs
    factor, source = round_seconds.calibration([(cfgs, 3 * want), (cfgs[:1], 2 * alone / 3)], law, record["work"],
                                               sizes)
    assert factor == pytest.approx(2.5) and "calibrated on 2 measured program(s)" in source
    factor, source = round_seconds.calibration([], law, record["work"], sizes)
    assert factor == 1.0 and source.startswith("modelled, no measurement of a program of cells on this kind yet")


def test_the_work_model_and_the_measured_seconds_of_a_run():
    record = round_seconds.load_record()
    config = lambda name: config_lib.to_dict(reproduce.build_config(reproduce.base_argv(_cell(name))).config)  # noqa: E731
    # FedAvg-P fine-tunes every client 5 epochs at each evaluation; FedAS aligns and takes a Fisher pass
    assert round_seconds.round_work(config("fedavg_p-beta0.1_P0.2"), record["work"]) == 4 * 5 + 20 * 5
    assert round_seconds.round_work(config("fedas-beta0.1_P1"), record["work"]) == pytest.approx(20 * (5 + 1 + 1.33))
    assert round_seconds.steady_seconds([{"round": 1, "seconds": 9.0}, {"round": 2, "seconds": 9.0},
                                         {"round": 4, "seconds": 15.0}]) == pytest.approx(2.0)
    assert round_seconds.steady_seconds([{"round": 1, "seconds": 9.0}]) is None
    assert round_seconds.lane_law({}) is None


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
    (["--plan-for-seconds", "700", "--device-record", "/nowhere/record.json"],
     "cannot read the seconds-per-round record /nowhere/record.json"),
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
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--plan-for-seconds", "1200",
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


def test_fedas_table3_plans_at_least_thirty_cells_for_540_seconds_and_says_its_seconds_are_modelled(tmp_path,
                                                                                                    data_dir):
    """One device command of a short window: 540 s hold 30 cells or more, as rows of
    programs, from modelled seconds where no program was measured (and the plan says so)."""
    out = tmp_path / "fedas_table3"
    assert reproduce.main(["fedas_table3", "--plan-for-seconds", "540", "--out", str(out), "--data-dir",
                           str(data_dir)]) == 0
    plan = json.loads((out / "run_plan.json").read_text())
    planned = [c for command in plan["commands"] for step in command["steps"] for c in step["cells"]]
    assert len(planned) >= 30 and len(plan["commands"]) == 1, planned
    assert all(step["estimate_from"].startswith("modelled") for c in plan["commands"] for step in c["steps"])
    assert "modelled, no measurement of a program of cells on this kind yet" in (out / "run_plan.md").read_text()
    assert plan["commands"][0]["estimate"] <= 540


# a background kind (the CPU's form): one cell a program, map, its cells in a work folder outside the table's
BACKGROUND = {"machine": "cpu: nowhere", "command_limit_seconds": 43200, "client_mapping": "map",
              "overrides": ["devices.cpu=1"], "cells_per_program": 1, "background": {"nice": 19, "cores": 1},
              "margins_seconds": {"command_start": 30, "cell_start": 40, "stop": 300, "pack": 30},
              "lane_step_seconds": {"fixed": 0.5, "per_lane": 0.0, "source": "made up"}}


def _background_table(tmp_path, monkeypatch):
    table = _tiny(tmp_path, monkeypatch)
    record = json.loads(round_seconds.RECORD.read_text())
    record["kinds"]["tiny-cpu"] = BACKGROUND
    round_seconds.RECORD.write_text(json.dumps(record))
    return table


def test_a_background_plan_resumes_cut_cells_first_one_cell_a_program_and_reads_its_log(tmp_path, monkeypatch,
                                                                                       capsys):
    """--device-kind of a background kind (the CPU's): the work folder outside the table's, the cell cut there
    first, then the headline row, one cell a program in the script (';'), the kind's mapping and core; a cell the
    log saw reach round 2 whose run is gone starts again, and the plan says so; a cell finished in the table's
    folder is not planned; the cell cut by the budget's end is named in the table's note."""
    from signal_after_round import signal_after

    table = _background_table(tmp_path, monkeypatch)
    work, out = tmp_path / "work", tmp_path / "table"
    base = ["--table-file", str(table), "--no-progress"]
    assert reproduce.main([*base, "--out", str(work), "--cells", "local-synth/seed1"],
                          observe=signal_after(1, "INT")) == 130
    assert reproduce.main([*base, "--out", str(out), "--cells", "local-synth/seed0"]) == 0  # finished in the table
    plan_log.append(work, "global-synth/seed1", "stopped", 2)  # ran before, its folder since removed
    capsys.readouterr()
    argv = [*base, "--out", str(out), "--plan-for-seconds", "3600", "--device-kind", "tiny-cpu", "--work", str(work)]
    assert reproduce.main(argv) == 0
    plan = json.loads((out / "run_plan.json").read_text())
    assert plan["background"] and plan["work"] == str(work)
    assert plan["run_list"] == ["local-synth/seed1", "global-synth/seed0", "global-synth/seed1"]
    steps = [step for command in plan["commands"] for step in command["steps"]]
    assert [s["state"] for s in steps] == ["resume", "new", "new"] and all(len(s["cells"]) == 1 for s in steps)
    assert steps[0]["rounds"] == 3 and steps[0]["seconds_per_round"] > 0
    assert plan["restarted"] == [plan_log.gone_note("global-synth/seed1", plan_log.started_cells(work)[
        "global-synth/seed1"])]
    assert "global-synth/seed1 starts again" in (out / "run_plan.md").read_text()
    script = (out / "run_plan.sh").read_text()
    assert "cells='local-synth/seed1;global-synth/seed0;global-synth/seed1'" in script
    assert "nohup nice -n 19" in script and f"--collect-into {out}" in script
    assert "train.client_mapping=map devices.cpu=1" in script
    # a budget that cuts the second cell: the table's note names it as cut, to resume
    assert reproduce.main([*base, "--out", str(out), "--plan-for-seconds", "560", "--device-kind", "tiny-cpu",
                           "--work", str(work)]) == 0
    note = (out / "table.md").read_text()
    assert "cut by the budget's end, to resume: global-synth/seed0" in note, note


def test_collect_into_copies_each_finished_cell_as_a_compact_record_and_writes_the_table(tmp_path, monkeypatch):
    table = _background_table(tmp_path, monkeypatch)
    work, out = tmp_path / "work", tmp_path / "table"
    argv = ["--table-file", str(table), "--no-progress", "--out", str(work), "--collect-into", str(out),
            "--cells", "global-synth/seed0;local-synth/seed0"]
    assert reproduce.main(argv) == 0
    for cell in ("global-synth/seed0", "local-synth/seed0"):
        kept = out / "runs" / cell
        assert sorted(p.name for p in kept.iterdir()) == ["config.json", "metrics.jsonl.xz", "summary.json"]
        assert run_folder.read_records(kept) and (work / "runs" / cell / "metrics.jsonl").is_file()
    rows = {(r["method"], r["setting"]): r["status"] for r in csv.DictReader(open(out / "table.csv"))}
    assert rows[("global", "synth")].startswith("1 finished") and rows[("local", "synth")].startswith("1 finished")
    events = [(e["cell"], e["event"]) for e in plan_log.read(work)]
    assert events == [("global-synth/seed0", "started"), ("global-synth/seed0", "finished"),
                      ("global-synth/seed0", "collected"), ("local-synth/seed0", "started"),
                      ("local-synth/seed0", "finished"), ("local-synth/seed0", "collected")]
    assert reproduce.main(argv) == 0  # again: both skipped, nothing collected twice
    assert len(plan_log.read(work)) == 6
    assert reproduce.main([*argv[:4], "--out", str(out), "--collect-into", str(out), "--cells",
                           "local-synth/seed0"]) == 2
    assert "Command: `python -m fedjax_pfl.reproduce --table-file" in (out / "table.md").read_text()


def test_collecting_a_slice_of_cells_keeps_the_table_its_command_records(tmp_path, monkeypatch):
    """A plan runs a slice of the table's cells; collecting one writes the table again as its table.md's
    recorded command writes it (every seed and row it names), not only the slice."""
    table = _background_table(tmp_path, monkeypatch)
    work, out = tmp_path / "work", tmp_path / "table"
    assert reproduce.main(["--table-file", str(table), "--no-progress", "--out", str(out), "--seeds", "0,1",
                           "--table-only"]) == 0
    before = {(r["method"], r["setting"]) for r in csv.DictReader(open(out / "table.csv"))}
    assert reproduce.main(["--table-file", str(table), "--no-progress", "--out", str(work), "--collect-into",
                           str(out), "--cells", "local-synth/seed0"]) == 0
    rows = {(r["method"], r["setting"]): r for r in csv.DictReader(open(out / "table.csv"))}
    assert set(rows) == before and len(before) > 1
    assert rows[("local", "synth")]["status"] == "1 finished, 1 not run"
    assert "--seeds 0,1" in (out / "table.md").read_text()


def test_a_background_plan_script_starts_its_runner_and_returns_and_refuses_a_second(tmp_path, monkeypatch):
    """run_plan.sh of a background plan: returns at once, its runner trains the cell in WORK at nice 19 and copies
    it into the table's folder; a second start while one runs is refused in one line (exit 2)."""
    import time

    table = _background_table(tmp_path, monkeypatch)
    work, out = tmp_path / "work", tmp_path / "table"
    assert reproduce.main(["--table-file", str(table), "--no-progress", "--out", str(out), "--plan-for-seconds",
                           "900", "--device-kind", "tiny-cpu", "--work", str(work), "--methods", "global",
                           "--seeds", "0"]) == 0
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    started = subprocess.run(["bash", out / "run_plan.sh", "900", work], capture_output=True, text=True, env=env,
                             timeout=120)
    assert started.returncode == 0 and "started" in started.stdout, started.stderr
    pid = int((work / "runner.pid").read_text())
    again = subprocess.run(["bash", out / "run_plan.sh", "900", work], capture_output=True, text=True, env=env,
                           timeout=120)
    err = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(err) == 1 and "a plan already runs" in err[0], again.stderr
    deadline = time.time() + 240
    while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(1)
    assert not os.path.exists(f"/proc/{pid}"), "the runner did not finish"
    assert (out / "runs/global-synth/seed0/metrics.jsonl.xz").is_file(), (work / "plan.log").read_text()
    assert "collected global-synth/seed0" in (work / "plan.log").read_text()
