"""Two processes on 127.0.0.1 (jax.distributed, gloo CPU collectives) give the numbers of one process;
only process 0 writes the run folder, both write the checkpoint's shards (restorable in one process). A
process killed mid-run stops the other with one line naming it, and --resume continues to the records of an
uninterrupted run. And the launcher detection / flag checks of distributed.py."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import method_sample
from forced_devices import cpu_devices_env

from fedjax_pfl.engine import checkpoint, distributed
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.core.errors import UserError

TINY = ["--dataset", "synthetic", "--model", "mlp", "model.hidden=[8]", "--num-clients", "5", "--partition", "natural",
        "--local-epochs", "1", "--rounds", "2", "--batch-size", "16", "--no-progress", 
        "--rounds-per-call", "2", "--checkpoint-every", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(method, out, extra=(), tiny=TINY):
    env = {**os.environ, **cpu_devices_env(1)}
    return subprocess.Popen([sys.executable, "-m", "fedjax_pfl.train", "--method", method, *tiny, "--out", str(out),
                             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _two_processes(method, out, extra=(), tiny=TINY):
    port = _free_port()
    return [_cli(method, out, ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id",
                                 str(i), *extra], tiny) for i in range(2)]


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# FedAS: shared body and private head, per-client state besides the model (FedAvg's plain averaging takes
# the same path; FEDJAX_PFL_EVERY_METHOD=1 runs it too)
@pytest.mark.parametrize("method", method_sample.sample(["fedavg", "fedas"], ["fedas"]))
def test_two_processes_equal_one_process(method, tmp_path):
    procs = _two_processes(method, tmp_path / "two")
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


def test_a_killed_process_stops_the_other_with_one_line_and_resume_continues(tmp_path):
    tiny = [*TINY[:TINY.index("--rounds")], "--rounds", "8", "--batch-size", "16", "--no-progress", 
            "--rounds-per-call", "1", "--checkpoint-every", "1", "--heartbeat-timeout", "10"]
    cut, whole = (_two_processes("fedavg", tmp_path / name, tiny=tiny) for name in ("cut", "whole"))
    saved, deadline = checkpoint.checkpoint_path(tmp_path / "cut"), time.monotonic() + 600
    while checkpoint.latest_round(saved) is None:  # the first round's checkpoint, with its digests
        assert cut[0].poll() is None and time.monotonic() < deadline, "no checkpoint: " + cut[0].communicate()[1]
        time.sleep(0.05)
    cut[1].send_signal(signal.SIGKILL)
    _, err = cut[0].communicate(timeout=120)  # bounded: the heartbeat timeout is 10 s
    assert cut[0].returncode == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "process 1 of 2 stopped answering" in errors[0], err[-3000:]
    assert "--resume" in errors[0] and "Traceback" not in err and "internal error" not in err
    stopped_after = len(_metrics(tmp_path / "cut"))
    assert 1 <= stopped_after < 8  # killed mid-run
    for p in [*whole, *_two_processes("fedavg", tmp_path / "cut", ["--resume"], tiny)]:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    resumed, uninterrupted = _metrics(tmp_path / "cut"), _metrics(tmp_path / "whole")
    assert [r["round"] for r in resumed] == [r["round"] for r in uninterrupted] == list(range(1, 9))
    keys = ("accuracy", "accuracy_weighted", "loss", "train_loss")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in uninterrupted]


def _restored(out):
    """The (server, clients) state of the run's checkpoint, restored here on one device."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    saved = json.loads((out / "config.json").read_text())["config"]
    engine = build_experiment(validate(config_lib.build(start=saved))).engine
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
                                    {"coordinator": "h:1", "num_processes": 2, "process_id": 2},
                                    {"coordinator": "h:1", "num_processes": 2, "process_id": 0,
                                     "heartbeat_timeout_s": 0}])
def test_incomplete_or_bad_flags_are_user_errors(kwargs):
    with pytest.raises(UserError, match="--"):
        distributed.start(environ={}, **kwargs)


def test_a_lost_process_is_recognised_only_in_a_multi_process_run():
    closed = RuntimeError("Gloo AllGather failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:61622")
    assert distributed.is_lost_process(closed) is False  # one process: no peer to lose, so it stays a bug
    line = str(distributed.LostProcessError([1]))
    assert "process 1 of" in line and "--resume" in line and "\n" not in line
    assert "another of the" in str(distributed.LostProcessError([]))  # the service did not say which
