"""Two processes on 127.0.0.1 (jax.distributed, gloo CPU collectives) give the numbers of one process;
only process 0 writes the run folder, both write the checkpoint's shards (restorable in one process). And the launcher detection / flag checks of distributed.py."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import method_sample
from forced_devices import cpu_devices_env

from fedjax_pfl.engine import checkpoint, distributed
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.core.errors import UserError

TINY = ["--dataset", "synthetic", "--model", "mlp", "model.hidden=[8]", "--num-clients", "5", "--partition", "natural",
        "--local-epochs", "1", "--rounds", "2", "--batch-size", "16", "--no-progress", "--offline",
        "--rounds-per-call", "2", "--checkpoint-every", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(method, out, extra=()):
    env = {**os.environ, **cpu_devices_env(1)}
    return subprocess.Popen([sys.executable, "-m", "fedjax_pfl.train", "--method", method, *TINY, "--out", str(out),
                             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# FedAS: shared body and private head, per-client state besides the model (FedAvg's plain averaging takes
# the same path; FEDJAX_PFL_EVERY_METHOD=1 runs it too)
@pytest.mark.parametrize("method", method_sample.sample(["fedavg", "fedas"], ["fedas"]))
def test_two_processes_equal_one_process(method, tmp_path):
    port = _free_port()
    procs = [_cli(method, tmp_path / "two", ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                             "--process-id", str(i)]) for i in range(2)]
    procs.append(_cli(method, tmp_path / "one"))  # the single-process run, alongside
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    two, one = _metrics(tmp_path / "two"), _metrics(tmp_path / "one")
    assert [r["round"] for r in two] == [r["round"] for r in one] == [1, 2]
    for a, b in zip(two, one):
        for k in ("accuracy", "accuracy_weighted", "loss", "train_loss"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), (k, a, b)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    shards = {p.name for p in checkpoint.checkpoint_path(tmp_path / "two").glob("*/state/ocdbt.process_*")}
    assert shards == {"ocdbt.process_0", "ocdbt.process_1"}  # each process wrote its own devices' rows
    two, one = _restored(tmp_path / "two"), _restored(tmp_path / "one")
    for a, b in zip(jax.tree.leaves(two), jax.tree.leaves(one)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def _restored(out):
    """The (server, clients) state of the run's checkpoint, restored here on one device."""
    from fedjax_pfl.runs.experiment import build_experiment

    saved = json.loads((out / "config.json").read_text())["config"]
    engine = build_experiment(config_lib.build(start=saved)).engine
    (server, clients), last, _ = checkpoint.restore(checkpoint.checkpoint_path(out), engine.init(jax.random.key(0)),
                                                    num_clients=engine.num_clients)
    assert last == 2  # named by the rounds done
    return server, clients


def test_launcher_detection():
    slurm = {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0"}
    assert distributed.detected_launcher(slurm) == "SLURM"
    assert distributed.detected_launcher({**slurm, "SLURM_NTASKS": "1"}) is None  # one task: nothing to join
    assert distributed.detected_launcher({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "4"}) == "Open MPI"
    assert distributed.detected_launcher({}) is None
    assert distributed.start(environ={}) is False  # nothing asked, no launcher: a plain single process


@pytest.mark.parametrize("kwargs", [{"requested": True}, {"coordinator": "127.0.0.1:1234"},
                                    {"coordinator": "h:1", "num_processes": 2, "process_id": 2}])
def test_incomplete_or_bad_flags_are_user_errors(kwargs):
    with pytest.raises(UserError, match="--"):
        distributed.start(environ={}, **kwargs)
