"""Each run setting is declared once: runs/config.py's `setting(...)` holds its default, help and allowed values.

The records the engine and the methods read (`EngineConfig`, `LocalSetup`,
`LrSchedule`) carry no defaults of their own for settings; no class field or
function parameter in engine/, methods/ or kernels/ repeats a train setting's
declared default (a kernel takes drop_last, momentum and weight_decay from its caller); the client mappings' names are written once (engine/client_mapping.py)
and the setting shows that list; the values a grid may vary come from one
declaration (`Algorithm.hyperparameter_names`, `config.hyperparameter_name`).
"""

import ast
import dataclasses
from pathlib import Path

import pytest

from fedjax_pfl.core import declared
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.engine import client_mapping
from fedjax_pfl.engine.engine import EngineConfig
from fedjax_pfl.engine.lr_schedule import LrSchedule
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.base import LocalSetup, LocalTraining, RunFacts
from fedjax_pfl.runs import config

PACKAGE = Path(__file__).resolve().parent.parent / "fedjax_pfl"
SETTINGS = {f.name: f for f in dataclasses.fields(config.TrainConfig)}


def _has_default(field: dataclasses.Field) -> bool:
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


def test_engine_and_setup_records_carry_no_setting_defaults():
    for record in (LocalSetup, LocalTraining, RunFacts, LrSchedule):
        assert [f.name for f in dataclasses.fields(record) if _has_default(f)] == [], record.__name__
    settings_with_default = [f.name for f in dataclasses.fields(EngineConfig) if f.name in SETTINGS and _has_default(f)]
    assert settings_with_default == []
    # the setting-backed fields are there (the test would pass on a record that renamed them away)
    assert {"client_mapping", "chunk_size", "straggler_fraction", "drop_fraction", "all_clients_train"} <= {
        f.name for f in dataclasses.fields(EngineConfig)}


def _repeated_defaults(source: str, where: str) -> list[str]:
    """Class fields and function parameters of the module ``source`` (named ``where``) named like a train
    setting whose default is that setting's declared default."""
    found = []
    for node in ast.walk(ast.parse(source)):
        pairs = []
        if isinstance(node, ast.ClassDef):
            pairs = [(st.target.id, st.value) for st in node.body if isinstance(st, ast.AnnAssign)
                     and isinstance(st.target, ast.Name) and st.value is not None]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [(p.arg, d) for p, d in zip(positional[len(positional) - len(a.defaults):], a.defaults)]
            pairs += [(p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        for name, value in pairs:
            if name not in SETTINGS:
                continue
            try:
                literal = ast.literal_eval(value)
            except ValueError:
                continue
            if literal == SETTINGS[name].default:
                found.append(f"{where}:{value.lineno} {name}={literal!r}")
    return found


def test_no_setting_default_is_repeated_below_runs():
    found = [hit for folder in ("engine", "methods", "kernels") for path in sorted((PACKAGE / folder).glob("*.py"))
             for hit in _repeated_defaults(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert found == []


def test_the_scan_finds_a_repeated_default():
    source = "class R:\n    chunk_size: int = 8\n\ndef f(drop_last=False, lr=1.0):\n    pass\n"
    assert _repeated_defaults(source, "probe.py") == ["probe.py:2 chunk_size=8", "probe.py:4 drop_last=False"]


def test_client_mapping_names_have_one_source():
    spec = declared.spec_of(SETTINGS["client_mapping"])
    assert spec.allowed() == client_mapping.ALLOWED
    for name in client_mapping.MAPPINGS:
        assert name in client_mapping.ALLOWED
    with pytest.raises(UserError, match=client_mapping.ALLOWED.replace("(", r"\(").replace(")", r"\)")):
        client_mapping.parse("nosuch")
    written = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
               if "vmap, map, chunked" in p.read_text() or '"vmap", "map", "chunked"' in p.read_text()]
    assert written == ["engine/client_mapping.py"]


def test_grid_values_come_from_the_method_declaration():
    assert config.hyperparameter_name("train.lr") == "lr" == get_method("fedavg").hyperparameter_names[0]
    assert config.hyperparameter_name("method.mu") == "mu" and "mu" in get_method("fedprox").hyperparameter_names
    assert config.hyperparameter_name("train.momentum") is None
    sweep: dict = {}
    kept = config.take_sweep({"train": {"lr": [0.1, 0.2], "momentum": 0.5}, "method": {"mu": [0, 1]}}, sweep)
    assert sweep == {"train.lr": [0.1, 0.2], "method.mu": [0, 1]}
    assert kept == {"train": {"momentum": 0.5}, "method": {}}


# ---- every default is the declaration's: the command sets none behind it ------------------------------------
def test_the_command_adds_nothing_to_the_declared_defaults():
    """The training command's configuration without flags is the declared defaults, and with a flag just that
    key: it does not turn downloading on, nor switch a PFLlib folder's partition, behind the declarations."""
    from fedjax_pfl.commands import train as cli

    def from_command(argv):
        return config.to_dict(cli.config_from_args(*cli.parse_args(argv)))

    assert from_command([]) == config.to_dict(config.RunConfig())
    assert from_command(["--dataset", "pfllib"]) == config.to_dict(config.build(overrides=["data.name=pfllib"]))
    assert from_command(["--download"]) == config.to_dict(config.build(overrides=["data.allow_download=true"]))
    assert SETTINGS_OF["data"]["allow_download"].default is False


SETTINGS_OF = {section: {f.name: f for f in dataclasses.fields(type(getattr(config.RunConfig(), section)))}
               for section in config.SECTIONS}


def test_an_auto_partition_is_resolved_in_validation_and_recorded(tmp_path):
    """partition.scheme=auto (declared, with its rule in the help): natural for a PFLlib folder, else dirichlet;
    validate resolves it, in one place, and config.json records what it became."""
    from fedjax_pfl.runs.experiment import resolved_notes, validate
    from test_pfllib_source import write_by_hand

    assert SETTINGS_OF["partition"]["scheme"].default == "auto" and "pfllib" in declared.spec_of(
        SETTINGS_OF["partition"]["scheme"]).help
    write_by_hand(tmp_path / "d")
    folder = validate(config.build(overrides=["method_name=fedavg", "data.name=pfllib", f"data.data_dir={tmp_path / 'd'}",
                                              "model.name=mlp"])).checked
    files = validate(config.build(overrides=["method_name=fedavg", "data.name=synthetic", "model.name=mlp"])).checked
    assert (folder.partition.scheme, files.partition.scheme) == ("natural", "dirichlet")
    assert resolved_notes(folder)["partition.scheme"].startswith("natural (auto")
    chosen = validate(config.build(overrides=["method_name=fedavg", "data.name=pfllib", "partition.scheme=iid",
                                              f"data.data_dir={tmp_path / 'd'}", "model.name=mlp"])).checked
    assert chosen.partition.scheme == "iid" and "partition.scheme" not in resolved_notes(chosen)


def test_the_data_seed_falls_back_to_the_seed_in_one_place():
    """data_seed's empty value means seed (its declaration); one function says so, and every reader calls it."""
    assert declared.spec_of(config.RunConfig.__dataclass_fields__["data_seed"]).none == "seed"
    assert config.drawn_data_seed(3, None) == 3 and config.drawn_data_seed(3, 7) == 7
    coded = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
             if "data_seed is None" in p.read_text() or "data_seed if" in p.read_text()]
    assert coded == ["runs/config.py"]
    empty, given = (config.to_dict(config.build(overrides=["seed=2", *more])) for more in ([], ["data_seed=2"]))
    assert config.resume_differences(empty, given) == []  # the same run
