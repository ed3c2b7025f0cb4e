"""Every command written in the comments of a preset (configs/*.yaml) or a table file (configs/tables/*.yaml)
runs as written up to its first round: a train command through the train command's argument parsing and
validation, with its method bound to the preset's network (the method's own checks of its options against
the model, e.g. PFAKD+AT's conv maps); a reproduce command through a dry run, which builds every cell's
command and runs nothing (a planning command: its plan, written into a folder of the test's). A comment line ``... ARGS`` is the file's first command with ARGS added."""

import re
import shlex
from pathlib import Path

import pytest

from fedjax_pfl.commands import train
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.cells import reproduce
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs import experiment
from fedjax_pfl.methods import get_method

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*python -m fedjax_pfl\.(train|reproduce)\s+(.*)$")
# (input shape, classes) of each dataset a preset names: the method is bound without reading its files
SHAPES = {"mnist": ((28, 28, 1), 10), "fmnist": ((28, 28, 1), 10), "cifar10": ((32, 32, 3), 10),
          "cifar10_jpeg": ((32, 32, 3), 10), "cifar100": ((32, 32, 3), 100), "synthetic": ((60,), 10)}


def written_commands():
    """(where, 'train' or 'reproduce', argv) for each command line in the files' comments."""
    found = []
    for path in sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/tables/*.yaml")]):
        first = None
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.startswith("#"):
                continue
            text, where = line[1:].strip(), f"{path.relative_to(ROOT)}:{number}"
            match = COMMAND.match(text)
            if match:
                command = (match.group(1), shlex.split(match.group(2)))
                first = first or command
                found.append((where, *command))
            elif text.startswith("... "):
                assert first is not None, f"{where}: '...' continues no command written before it"
                found.append((where, first[0], first[1] + shlex.split(text[4:])))
    return found


COMMANDS = written_commands()


def test_the_comments_hold_commands():
    assert len(COMMANDS) >= 30
    assert {kind for _, kind, _ in COMMANDS} == {"train", "reproduce"}
    at = [argv for where, _, argv in COMMANDS if where.startswith("configs/pfakd_fmnist.yaml") and "pfakd_at" in argv]
    assert at, "the PFAKD Fashion-MNIST preset's +AT command"


def bind_method(cfg):
    """The run's method on its network (the method's checks against the model run here)."""
    shape, classes = SHAPES[cfg.data.name]
    model = build_model(cfg.model.name, shape, classes, init=cfg.model.init,
                        **({"hidden": cfg.model.hidden} if cfg.model.hidden else {}))
    algorithm = get_method(cfg.method_name)
    setup = experiment.local_setup(cfg.train, model, normalize=lambda x: x, eval_model=cfg.eval.model)
    return algorithm(setup, config_lib.method_options(algorithm.hparams_type, cfg.method))


@pytest.mark.parametrize("where,kind,argv", COMMANDS, ids=[f"{w} {k}" for w, k, _ in COMMANDS])
def test_written_command_parses(where, kind, argv, tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FEDJAX_PFL_DATA_DIR", str(data_dir))
    argv = [str(tmp_path) if a == "DIR" else a for a in argv]  # a folder the reader fills in
    if kind == "reproduce":  # a dry run, or a plan written into a folder of the test's
        planning = ["--work", str(tmp_path / "work")] if "--plan-for-seconds" in argv else ["--dry-run"]
        assert reproduce.main([*argv, *planning, "--out", str(tmp_path / "out")]) == 0, where
        return
    args, overrides = train.parse_args(argv)
    run = train.settle(train.config_from_args(args, overrides))
    for cfg in [point.config for point in run.points] or [run.config]:
        bind_method(cfg)


def test_a_command_whose_options_do_not_fit_the_network_fails(monkeypatch):
    """The check the written commands pass is not empty: a third conv map on the authors' two-map network."""
    from fedjax_pfl.core.errors import UserError

    monkeypatch.chdir(ROOT)
    args, overrides = train.parse_args(["--config", "configs/pfakd_fmnist.yaml", "--method", "pfakd_at",
                                        "method.at_layers=2"])
    with pytest.raises(UserError, match="at_layers"):  # refused where the run is settled, before any data load
        bind_method(train.settle(train.config_from_args(args, overrides)).config)
