"""Every run setting is declared once (runs/config.py): the flags, `--help`, the checks and the reference page
are built from that one declaration and agree with it."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from test_docs import load_hooks

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.commands import train as cli
from fedjax_pfl.runs import config as config_lib

COMMAND_OPTIONS = {"help", "config", "resume", "start_over", "no_progress", "distributed", "coordinator",
                   "num_processes", "process_id", "heartbeat_timeout"}  # options of the command itself, not run settings


def _leaf_fields(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def test_every_config_field_is_one_declaration():
    keys = [key for key, _ in config_lib.declarations()]
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(_leaf_fields(config_lib.RunConfig))


def test_the_parser_offers_exactly_the_declared_flags_with_their_help():
    parser = cli.build_parser()
    by_dest = {a.dest: a for a in parser._actions}
    flags = cli.setting_flags()
    assert set(by_dest) == set(flags) | COMMAND_OPTIONS
    for flag, (key, info) in flags.items():
        action = by_dest[flag]
        assert action.option_strings == ["--" + flag.replace("_", "-")]
        assert info.help in action.help and key in action.help
        if info.allowed:
            assert info.allowed in action.help


def test_a_flag_sets_its_declared_key():
    args, overrides = cli.parse_args(["--num-clients", "7", "--partition", "iid", "--lr", "0.5", "--tensorboard",
                                      "--seeds", "1,2", "--method", "fedavg"])
    cfg = cli.config_from_args(args, overrides)
    assert (cfg.partition.num_clients, cfg.partition.scheme, cfg.train.lr, cfg.log.tensorboard, cfg.seeds,
            cfg.method_name) == (7, "iid", 0.5, True, (1, 2), "fedavg")


def test_the_reference_page_lists_every_setting_with_its_declared_default_and_allowed_values():
    from fedjax_pfl.core.declared import shown

    page = load_hooks().config_page()
    for key, info in config_lib.declarations():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, key
        assert f"`{shown(info.default)}`" in row
        assert info.help.replace("|", "\\|") in row


def _out_of_range(info):
    """A value the declaration refuses, or None where it declares no bound, choice or check."""
    spec = info.spec
    if info.type == "str" and (spec.choice_values() is not None or spec.check is not None):
        return "no-such-value"
    for bound, step in ((spec.at_least, -1), (spec.more_than, 0), (spec.at_most, 1), (spec.less_than, 0)):
        if bound is not None:
            return bound + step
    return None


CHECKED = [(key, info) for key, info in config_lib.declarations() if _out_of_range(info) is not None]


@pytest.mark.parametrize("key, info", CHECKED, ids=[k for k, _ in CHECKED])
def test_the_checks_follow_the_declaration(key, info):
    """A value outside a setting's declared range or choices is refused in one line naming the setting."""
    assert len(CHECKED) > 30
    bad = _out_of_range(info)
    value = [bad] if info.type.startswith("list") else bad
    cfg = config_lib.build(overrides=[f"{key}={value}"])
    with pytest.raises(UserError, match=key.replace(".", r"\.")) as err:
        config_lib.validate_values(cfg)
    assert "\n" not in str(err.value)


def test_the_default_config_passes_its_own_checks():
    config_lib.validate_values(config_lib.RunConfig())


@pytest.mark.parametrize("overrides, match", [
    (["partition.scheme=practical"], r"partition\.samples_per_client is needed by partition\.scheme=practical"),
    (["partition.scheme=iid", "partition.max_classes_per_client=2"],
     r"partition\.max_classes_per_client applies to partition\.scheme=dirichlet or client_dirichlet only"),
    (["partition.scheme=client_dirichlet"], r"partition\.size_range is needed by partition\.scheme=client_dirichlet"),
])
def test_partition_parameters_follow_the_schemes_signatures(overrides, match):
    with pytest.raises(UserError, match=match):
        config_lib.validate_values(config_lib.build(overrides=overrides))
