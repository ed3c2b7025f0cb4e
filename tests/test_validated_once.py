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


# ---- every check in validation: what methods refused when bound, or while their round was traced ----------
REFUSED = [  # (overrides, what the one line says); where each was refused before it moved to validation
    (["method_name=fedavg", "method.local_steps=3", "train.persistent_optimizer=true"],
     "starts each round's optimizer fresh"),  # inside client_update, as it was traced
    (["method_name=pfedme", "model.name=resnet8"], "without BatchNorm"),  # in init, as it was traced
    (["method_name=apple", "model.name=resnet8"], "without BatchNorm"),  # in init, as it was traced
    (["method_name=fedfomo", "method.num_federations=6"], "num_federations=6 needs more clients"),  # in init
    (["method_name=pfedme", "train.drop_last=true"], "drop_last does not apply"),  # when bound, after the data
    (["method_name=fedala", "method.layers=9"], "exceeds the 3 layers"),  # when bound
    (["method_name=fedrod", "model.name=pfakd_cnn"], "one Dense layer"),  # when bound
    (["method_name=pfakd_at", "model.name=mlp"], "conv maps"),  # when bound
    (["method_name=pfakd_at", "model.name=pfakd_cnn", "method.at_layers=5"], "out of range"),  # when bound
    (["method_name=fedper", "model.name=mlr"], "no body parameters"),  # after the data were read
    (["method_name=fedavg", "data.allow_download=true"], "downloads into the cache folder"),  # ignored silently
]


@pytest.mark.parametrize("overrides, message", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_validate_refuses_what_was_refused_while_running(overrides, message, tmp_path):
    """Refused by validate with one line, before any data are read: the data folder is empty."""
    cfg = config_lib.build(overrides=["data.name=fmnist", "model.name=mlp", "partition.num_clients=6",
                                      f"data.data_dir={tmp_path}", *overrides])
    with pytest.raises(UserError, match=message) as refused:
        validate(cfg)
    assert "\n" not in str(refused.value)


def test_validation_starts_no_jax_backend():
    """The method's checks see the model's shapes only: validate comes before the run sets JAX's devices."""
    import subprocess
    import sys

    code = ("from jax._src import xla_bridge\n"
            "from fedjax_pfl.runs import config, experiment\n"
            "for name, model in (('pfakd_at', 'pfakd_cnn'), ('fedala', 'resnet8'), ('fedrod', 'mlp')):\n"
            "    experiment.validate(config.build(overrides=[f'method_name={name}', f'model.name={model}',\n"
            "                                                'data.name=fmnist']))\n"
            "print(xla_bridge.backends_are_initialized())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr[-2000:]


def test_what_only_the_data_tell_is_checked_once_they_are_read(tmp_path):
    """A PFLlib folder decides its inputs: the method's checks on the model run when the folder is read."""
    from test_pfllib_source import write_by_hand

    write_by_hand(tmp_path / "d")
    cfg = config_lib.build(overrides=["method_name=fedala", "method.layers=9", "data.name=pfllib", "model.name=mlp",
                                      f"data.data_dir={tmp_path / 'd'}", "train.batch_size=4"])
    run = validate(cfg)  # the model's depth is not known yet
    with pytest.raises(UserError, match="exceeds the 3 layers"):
        build_experiment(run)
