"""A configuration is validated once, at one place (commands/train.py's `settle`): `validate` returns a frozen
`ValidRun`, and the entry points that run a configuration take only that record."""

import ast
import dataclasses
from pathlib import Path

import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import ValidRun, build_experiment, validate
from fedjax_pfl.runs.single_run import run_single
from fedjax_pfl.runs.sweep import run_federations, run_sweep

PACKAGE = Path(__file__).resolve().parents[1] / "fedjax_pfl"
SMALL = ["method_name=fedavg", "data.name=synthetic", "partition.num_clients=4", "model.name=mlr"]


def validate_calls(source: str) -> list[int]:
    """The lines of ``source`` that call a function named ``validate`` (``validate(...)`` or ``x.validate(...)``)."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name == "validate":
                calls.append(node.lineno)
    return calls


def test_the_library_calls_validate_in_one_place_only():
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := validate_calls(p.read_text()))}
    assert list(found) == ["commands/train.py"] and len(found["commands/train.py"]) == 1, found


def test_the_scan_finds_a_planted_call():
    planted = "from fedjax_pfl.runs import experiment\n\ndef f(cfg):\n    return experiment.validate(cfg)\n"
    assert validate_calls(planted) == [4]
    assert validate_calls("validate_values(cfg)\nvalidated = 1\n") == []


@pytest.mark.parametrize("entry", [build_experiment, run_single, run_sweep, lambda cfg: run_federations([cfg])],
                         ids=["build_experiment", "run_single", "run_sweep", "run_federations"])
def test_a_raw_config_is_refused(entry, tmp_path):
    cfg = config_lib.build(overrides=[*SMALL, f"out={tmp_path / 'run'}"])
    with pytest.raises(TypeError, match="ValidRun that validate"):
        entry(cfg)
    assert not (tmp_path / "run").exists()


def test_changing_a_config_after_validation_changes_nothing_that_runs():
    cfg = config_lib.build(overrides=[*SMALL, "train.lr=0.1", "data.name=auto", "model.name=auto"])
    run = validate(cfg)
    assert cfg.data.name == "auto" and cfg.out is None  # the given configuration is left as it was
    cfg.train.lr = -5.0  # (would be refused by validate)
    assert run.checked.train.lr == 0.1 and run.out.name.startswith("fedavg-")
    copy = run.config
    copy.train.lr = 7.0
    assert run.config.train.lr == 0.1 and run.checked.train.lr == 0.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.checked = copy


def test_a_sweeps_points_are_checked_and_held_by_validate(tmp_path):
    run = validate(config_lib.build(overrides=[*SMALL, "seeds=[0,1]", "train.lr=[0.05,0.1]",
                                               f"out={tmp_path / 'sweep'}"]))
    assert isinstance(run.points[0], ValidRun) and len(run.points) == 4 and not run.points[0].points
    assert {(p.checked.seed, p.values["lr"], p.grid_name) for p in run.points} == {
        (s, lr, f"lr{lr:g}") for s in (0, 1) for lr in (0.05, 0.1)}
    assert run.points[0].out == tmp_path / "sweep" / "lr0.05" / "seed0"
    with pytest.raises(UserError, match="lr"):  # a listed value is checked as its own run's value, before any data
        validate(config_lib.build(overrides=[*SMALL, "train.lr=[0.05,-1.0]"]))
    with pytest.raises(TypeError, match="run_single runs one"):
        run_sweep(validate(config_lib.build(overrides=SMALL)))
