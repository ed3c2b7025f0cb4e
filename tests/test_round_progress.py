"""Progress inside a compiled round (engine/round_progress.py), its display (runs/progress.py) and Ctrl-C.

The callbacks must change no number, report every client once (a vmapped
batch as one event of its width), stay out of fused calls, and trace in
every method's local update; the display must show where a round is; Ctrl-C
must be acknowledged within a second and honoured on the last round.
"""

import json
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.core import tree_ops
from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.engine import round_progress
from fedjax_pfl.kernels.counted_loop import Loops
from fedjax_pfl.methods import method_names
from fedjax_pfl.methods.base import ClientRound
from fedjax_pfl.commands import train as cli
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs import progress as progress_lib
from fedjax_pfl.runs.experiment import build_experiment, validate
from engine_rows import rows_of
from signal_after_round import signal_after

EPOCHS, BATCH = 2, 8
SYNTHETIC = ["data.name=synthetic", "model.name=mlp", "model.hidden=[16]", "partition.scheme=natural",
             "partition.num_clients=6", f"train.local_epochs={EPOCHS}", f"train.batch_size={BATCH}",
             "train.join_ratio=0.5"]


@pytest.fixture(autouse=True)
def small_stride(monkeypatch):
    """A step event every 4 steps (read when a round is traced), so these small clients send some."""
    monkeypatch.setattr(round_progress, "STEP_STRIDE", 4)


def _experiment(method="fedavg", mapping="map", progress=True, extra=()):
    cfg = config_lib.build(overrides=[f"method_name={method}", *SYNTHETIC, f"train.client_mapping={mapping}", *extra])
    return build_experiment(validate(cfg), progress=progress)


def _one_call(exp, count=1, rounds=3):
    """(round outputs, events) of rounds 0..count-1 in one call."""
    events = []
    key = jax.random.key(0)
    server, clients = exp.engine.init(key)
    with exp.engine.progress.listening(events.append):
        out = exp.engine.run_rounds(server, clients, key, 0, count, rounds, 1)
        jax.effects_barrier()
    return out, events


def _same(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)))


def _client_events(total: int, width: int) -> list:
    """What a client (or ``width`` clients side by side) of ``total`` local steps reports: every STEP_STRIDE-th
    step in order, then the finished client(s)."""
    stride = round_progress.STEP_STRIDE
    return ([round_progress.Event("step", done, total, width) for done in range(stride, total + 1, stride)]
            + [round_progress.Event("client", 0, 0, width)])


@pytest.mark.parametrize("mapping", ["map", "vmap", "chunked"])
def test_progress_changes_no_number_and_reports_every_client_and_step_in_order(mapping):
    """Every client trains (join ratio 1): under ``map`` each reports its own steps (EPOCHS x ceil(n / B))
    and then itself, one client after another; side by side (``vmap``, one ``chunked`` chunk) the six report
    as one, up to the largest client's steps."""
    every = ["train.join_ratio=1.0"]
    plain, none = _one_call(_experiment(mapping=mapping, progress=False, extra=every))
    exp = _experiment(mapping=mapping, extra=every)
    reported, events = _one_call(exp)
    assert not none and _same(plain, reported)
    steps = [EPOCHS * -(-int(n) // BATCH) for n in np.asarray(exp.engine.train.n)]  # each client's local steps
    assert len(steps) == 6 and min(steps) >= round_progress.STEP_STRIDE
    if mapping == "map":  # one client at a time, in the round's order of clients: split at each "client" event
        ends = [i + 1 for i, e in enumerate(events) if e.kind == "client"]
        blocks = [events[a:b] for a, b in zip([0, *ends], ends)]
        assert len(blocks) == 6 and ends[-1] == len(events)
        assert sorted(block[0].total for block in blocks) == sorted(steps)
        assert all(block == _client_events(block[0].total, 1) for block in blocks)
    else:  # clients trained side by side report together, not once each
        assert events == _client_events(max(steps), 6)


def test_fedas_round_with_progress_equals_the_round_without():
    (plain, _), (reported, events) = (_one_call(_experiment("fedas", progress=p)) for p in (False, True))
    assert _same(plain, reported) and sum(e.width for e in events if e.kind == "client") == 3
    assert {"step", "pass"} <= {e.kind for e in events}  # local training, then the Fisher trace's pass


def test_fused_calls_carry_no_callbacks():
    _, events = _one_call(_experiment(), count=2)
    assert events == []


def test_federations_report_their_rows_as_one_batch():
    """Two seeds as federations (engine/rows.py), their 3 + 3 training rows vmapped: events 6 wide."""
    pool = rows_of(_experiment(mapping="vmap").engine, 2)
    keys = jnp.stack([jax.random.key(s) for s in (0, 1)])
    servers, clients = pool.init(keys)
    events = []
    with pool.progress.listening(events.append):
        pool.run_rounds(servers, clients, keys, 0, 1, 2, 1)
        jax.effects_barrier()
    assert {e.width for e in events} == {6} and sum(e.width for e in events if e.kind == "client") == 6


# Methods whose local update runs its own step loop instead of local_training's (their progress shows the
# finished clients only); a method that gains step reports leaves this set.
NO_STEP_REPORTS = {"perfedavg", "pfedhn", "pfedkd", "pfedme"}


@pytest.mark.parametrize("method", method_names())
def test_every_methods_local_update_traces_with_progress_and_reports_its_steps(method):
    """Each method's client update, vmapped over two clients as the engine maps them, traces with the
    step and client reports in place (their custom batching and conditionals), and its local training
    reports its steps (every method outside `NO_STEP_REPORTS`), as the engine's round does."""
    extra = {"pfakd_at": ["data.name=fmnist", "model.name=pfakd_cnn", "model.hidden=", "partition.scheme=iid",
                          "partition.train_per_client=8", "partition.test_per_client=4"]}.get(method, [])
    try:
        exp = _experiment(method, extra=extra, progress=False)
    except config_lib.UserError as e:  # a method that needs another model or data: named, not skipped
        pytest.fail(f"{method}: {e}")
    engine, key = exp.engine, jax.random.key(0)
    server, clients = engine.init(key)
    selected = jnp.arange(2)
    chosen = engine.method.prepare(server, tree_ops.gather(clients, selected), selected)
    data = tuple(tree_ops.gather(engine.train, selected))

    traced = []  # the kinds of the reports the update's loops place, while tracing

    def report_step(kind, done, total, value):
        traced.append(kind)
        engine.progress.report_step(kind, done, total, value)

    def one_client(client, data_i, key_i):
        info = ClientRound(jnp.int32(0), jnp.int32(engine.method.setup.local_epochs))
        method = engine.method.with_loops(Loops(report=report_step))
        out = method.client_update(server, client, ClientData(*data_i), key_i, info)
        return engine.progress.report_client(out)

    jax.eval_shape(jax.vmap(one_client), chosen, data, jax.random.split(key, 2))
    assert set(traced) <= {"step", "pass"}
    assert ("step" in traced) == (method not in NO_STEP_REPORTS), (method, traced)


# ------------------------------------------------------------------ the display


def test_the_display_follows_clients_and_steps_and_times_the_compile(monkeypatch, capsys):
    monkeypatch.setattr(progress_lib, "LOG_INTERVAL", 0.0)
    monkeypatch.setattr(progress_lib, "TERMINAL_INTERVAL", 0.0)
    display = progress_lib.RunProgress(total=40, done=2, clients=12, enabled=True)
    display.call_starts(2, 3, compiling=True, count=1)
    display.compile_seconds = 41.0  # as jax.monitoring would have summed them
    display.event(round_progress.Event("client", 0, 0, 4))
    display.event(round_progress.Event("step", 120, 240, 4))
    assert display.bar.n == pytest.approx(2 + (4 + 4 * 0.5) / 12)
    assert display.postfix == "round 3/40: 4/12 clients, local step 120/240"
    display.call_done(3, 0.5)
    display.close()
    printed = capsys.readouterr()
    assert "compiling 1 round per call on " in printed.out and "compiled in 41.0 s" in printed.out
    assert "round 3/40: 4/12 clients, local step 120/240" in printed.err


def test_a_run_with_its_bar_says_what_compiles_and_for_how_long(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedjax_pfl.train", "--method", "fedavg", "--dataset", "synthetic",
                           "--model", "mlr", "--num-clients", "6", "--partition", "natural", "--rounds", "2",
                           "--local-epochs", "1", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("loading synthetic") for line in lines)
    assert any(line.startswith("loaded and partitioned in ") for line in lines)
    assert any(line.startswith("compiling 1 round per call on ") for line in lines)
    assert any(line.startswith("compiled in ") for line in lines)
    assert "rounds: 100%" in proc.stderr


# ------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_is_acknowledged_within_a_second_and_stops_after_the_round(tmp_path):
    """A real SIGINT while a long round computes: the acknowledgement line comes at once, the run stops
    after that round (checkpoint, summary 'interrupted') and exits 130."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "fedjax_pfl.train", "--method", "fedavg", "--dataset", "synthetic", "--model",
         "mlp", "model.hidden=[64]", "--num-clients", "6", "--partition", "natural", "--rounds", "3",
         "--local-epochs", "1000", "--batch-size", "4", "--rounds-per-call", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # wait until the round's program runs
            if line.startswith("compiled in"):
                break
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        acknowledged = None
        for line in iter(proc.stderr.readline, ""):
            if line.startswith("Ctrl-C: stopping after round 1 of 3"):
                acknowledged = time.monotonic() - sent
                break
        assert acknowledged is not None and acknowledged < 1.0, acknowledged
        assert proc.wait(timeout=300) == 130
    finally:
        proc.kill()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["after_round"] == 1
    assert (out / "checkpoint" / "1").is_dir()


def test_ctrl_c_during_the_last_round_is_honoured(tmp_path, capsys):
    """The run finishes the round in flight (its last), is complete, and the command exits 130."""
    out = tmp_path / "run"
    argv = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlr", "--num-clients", "6", "--partition",
            "natural", "--rounds", "2", "--local-epochs", "1", "--no-progress", "--out", str(out)]
    assert cli.main(argv, observe=signal_after(2, "INT")) == 130
    err = capsys.readouterr().err
    assert "Ctrl-C: round 2 is the last; stopping once it is done" in err
    assert "stopped by Ctrl-C during the last round, after finishing it" in err
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
