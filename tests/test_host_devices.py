"""``devices.cpu`` (runs/host_devices.py): parsing, what auto chooses and keeps, and what a run records.

The training command in a fresh process (no device count given outside the
config) must run on one host device per core by default, and say so in
config.json and its log.
"""

import json
import os
import subprocess
import sys

import jax
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.commands import train as cli
from fedjax_pfl.runs import host_devices
from fedjax_pfl.runs import config as config_lib

TINY = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlp", "model.hidden=[8]", "--num-clients", "5",
        "--partition", "natural", "--local-epochs", "1", "--rounds", "1", "--batch-size", "16", 
        "--no-progress"]


@pytest.mark.parametrize("setting,count", [("auto", None), (" auto ", None), ("2", 2), (3, 3), ("1", 1)])
def test_parse(setting, count):
    assert host_devices.parse(setting) == count


@pytest.mark.parametrize("setting", ["0", "-1", "two", "1.5", True, "", "autos"])
def test_parse_refuses_what_is_not_auto_or_a_count(setting):
    with pytest.raises(UserError, match="devices.cpu must be 'auto' or a whole number"):
        host_devices.parse(setting)


def test_auto_is_one_device_per_core_unless_chosen_elsewhere():
    assert host_devices.wanted("auto", 4, None, False) == (4, "auto: one per core (4)")
    assert host_devices.wanted("auto", 4, "XLA_FLAGS x", False) == (None, "auto: kept XLA_FLAGS x")
    assert host_devices.wanted("auto", 4, None, True)[0] is None  # several processes: one device each
    assert host_devices.wanted("3", 4, "XLA_FLAGS x", True) == (3, "devices.cpu=3")  # a number wins
    assert host_devices.wanted("auto", 4, None, False, clients=3) == (3, "auto: one per client (3, fewer than the 4 "
                                                                          "cores)")  # never more devices than clients
    assert host_devices.wanted("auto", 4, None, False, clients=9) == (4, "auto: one per core (4)")


def test_a_count_chosen_outside_the_config_is_found():
    flag = "--xla_force_host_platform_device_count=4"
    assert host_devices.chosen_outside({"XLA_FLAGS": f"--foo=1 {flag}"}, -1) == f"XLA_FLAGS {flag}"
    assert "jax_num_cpu_devices=2" in host_devices.chosen_outside({"XLA_FLAGS": flag}, 2)
    assert host_devices.chosen_outside({"XLA_FLAGS": "--xla_backend_optimization_level=0"}, -1) is None
    assert host_devices.chosen_outside({}, -1) is None


def test_a_bad_setting_is_a_one_line_user_error(capsys):
    assert cli.main([*TINY, "--cpu-devices", "none", "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: devices.cpu must be 'auto' or a whole number"), err


def test_a_resumed_run_may_change_the_device_count():
    saved = config_lib.to_dict(config_lib.build(overrides=["devices.cpu=2"]))
    assert config_lib.resume_differences(saved, config_lib.to_dict(config_lib.build())) == []
    assert config_lib.resume_differences(saved, config_lib.to_dict(config_lib.build(overrides=["seed=1"])))


def test_an_in_process_run_records_the_devices_that_ran(tmp_path, capsys):
    jax.devices()  # JAX has started: the setting cannot act, the record says what ran
    out = tmp_path / "run"
    assert cli.main([*TINY, "--cpu-devices", "3", "--out", str(out)]) == 0
    resolved = json.loads((out / "config.json").read_text())["resolved"]["devices.cpu"]
    assert resolved["devices"] == jax.device_count() and resolved["backend"] == jax.default_backend()
    assert resolved["requested"] == "3" and resolved["why"].endswith("not applied: JAX had started before the run")
    assert f"devices: {jax.device_count()} {jax.default_backend()} (devices.cpu=3 not applied" in capsys.readouterr().out


def _fresh_run(args, out):
    """The training command in a fresh process with no device count set (the suite's conftest sets one)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(host_devices.FORCE_FLAG)]
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    proc = subprocess.run([sys.executable, "-m", "fedjax_pfl.train", *args, "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
    return proc.stdout, json.loads((out / "config.json").read_text())["resolved"]["devices.cpu"]


def test_the_training_command_runs_a_cnn_on_one_host_device_per_core_by_default(tmp_path):
    cores = os.cpu_count()
    cnn = ["--method", "fedavg", "--dataset", "fmnist", "--model", "fedavgcnn", "--num-clients", "4",
           "--partition", "dirichlet", "--alpha", "0.5", "--local-epochs", "1", "--rounds", "1", "--batch-size",
           "10", "--no-progress", "--client-mapping", "map", "partition.train_per_client=40",
           "partition.test_per_client=10"]
    stdout, resolved = _fresh_run(cnn, tmp_path / "cnn")
    devices, why = host_devices.wanted("auto", cores, None, False, clients=4)  # (a machine of more cores than clients)
    assert resolved == {"requested": "auto", "why": why, "backend": "cpu", "devices": devices}
    assert f"devices: {devices} cpu ({why})" in stdout, stdout


def test_the_training_command_runs_an_mlp_on_one_host_device_per_core_too(tmp_path):
    cores = os.cpu_count()
    stdout, resolved = _fresh_run(TINY, tmp_path / "mlp")
    devices, why = host_devices.wanted("auto", cores, None, False, clients=5)
    assert resolved == {"requested": "auto", "why": why, "backend": "cpu", "devices": devices}
