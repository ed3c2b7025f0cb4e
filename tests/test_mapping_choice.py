"""client_mapping='auto' (engine/mapping_choice.py): it times the candidates, records its choice, keeps the
fastest, and the choice never changes the numbers (each candidate equals the per-client loop)."""

import jax
import pytest
import numpy as np

from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.engine import mapping_choice
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config
from test_engine import S, _assert_close, _data, _reference, _setup

MODEL = build_model("lenet", (16, 16, 1), 4, conv_impl="direct")
OPTIONS = [("map", None), ("vmap", None), ("chunked", 2)]


def _engine(mapping="auto"):
    x, y, idx = _data(MODEL.input_shape)
    train = stack_clients(x, y, idx)
    return engine_lib.Engine(get_method("fedavg")(_setup(MODEL)), train, train,
                             engine_config(S, client_mapping=mapping, chunk_size=2))


def _start(engine, key):
    init_key, key = jax.random.split(key)
    return (*engine.init(init_key), engine_lib.round_keys(key, 0)[0])


def test_each_candidate_equals_the_per_client_loop():
    key = jax.random.key(5)
    ref_server, _ = _reference("fedavg", MODEL, 1, key)
    base = _engine()
    for mapping, chunk in OPTIONS:
        engine = base.with_mapping(mapping, chunk)
        assert (str(engine.mapping), engine.config.chunk_size) == (mapping, chunk or 2)
        server, clients, round_key = _start(engine, key)
        server, _, _ = engine.round(server, clients, round_key, 0)
        _assert_close(server["variables"], ref_server, tol=2e-5)


def test_choice_is_timed_recorded_and_changes_nothing():
    engine = _engine()
    server, clients, round_key = _start(engine, jax.random.key(5))
    before = jax.device_get((server, clients))
    chosen, record = mapping_choice.choose_mapping(engine, server, clients, round_key, 0, options=OPTIONS)
    assert record["timed"] and record["requested"] == "auto" and record["seconds"] > 0
    assert set(record["candidates"]) == {"map", "vmap", "chunked:2"}
    seconds = {name: c["round_s"] for name, c in record["candidates"].items()}
    assert all(s > 0 and c["compile_s"] > 0 for s, c in zip(seconds.values(), record["candidates"].values()))
    assert record["chosen"] == min(seconds, key=seconds.get)
    assert mapping_choice.label(str(chosen.mapping), record["chunk_size"]) == record["chosen"]
    assert record["chosen"] in mapping_choice.describe(record)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get((server, clients)))):
        np.testing.assert_array_equal(a, b)  # timing read the state and changed nothing
    # the run goes on with the winner: exactly the numbers of an engine given that mapping
    direct = _engine(record["mapping"])
    got = chosen.round(server, clients, round_key, 0)
    server2, clients2, _ = _start(direct, jax.random.key(5))
    want = direct.round(server2, clients2, round_key, 0)
    for a, b in zip(jax.tree.leaves(got[:2]), jax.tree.leaves(want[:2])):
        np.testing.assert_array_equal(a, b)


def test_short_runs_and_tight_budgets_keep_the_default():
    engine = _engine()
    server, clients, round_key = _start(engine, jax.random.key(5))
    same, record = mapping_choice.choose_or_default(engine, "auto", mapping_choice.MIN_ROUNDS - 1, server, clients,
                                                    round_key, 0)
    assert same is engine and not record["timed"] and record["chosen"] == "map"
    assert "rounds to go" in record["why"] and "untimed" in mapping_choice.describe(record)
    _, given = mapping_choice.choose_or_default(engine.with_mapping("vmap"), "vmap", 100, server, clients, round_key, 0)
    assert not given["timed"] and given["chosen"] == "vmap" and "set by" in given["why"]
    _, record = mapping_choice.choose_mapping(engine, server, clients, round_key, 0, options=OPTIONS, rounds_left=1)
    assert list(record["candidates"]) == ["map"] and record["chosen"] == "map"
    assert "over 5%" in record["skipped"]


def test_candidates_per_backend_keep_chunks_below_the_client_count():
    assert mapping_choice.candidates(20, "cpu") == [("map", None), ("chunked", 4), ("vmap", None)]
    assert mapping_choice.candidates(4, "cpu") == [("map", None), ("vmap", None)]
    assert mapping_choice.candidates(1000, "gpu")[0] == ("vmap", None)
    assert ("chunked", 32) not in mapping_choice.candidates(20, "gpu")


def test_a_run_records_what_auto_became_in_config_json_and_the_log(tmp_path, capsys):
    import json

    from fedjax_pfl.commands import train as cli

    out = tmp_path / "run"
    args = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlp", "--rounds", str(mapping_choice.MIN_ROUNDS),
            "--out", str(out), "partition.num_clients=4", "model.hidden=[8]", "eval_every=10"]
    assert cli.main(args) == 0
    resolved = json.loads((out / "config.json").read_text())["resolved"]
    assert resolved["model.conv_impl"] == ("direct" if jax.default_backend() == "cpu" else "native")
    choice = resolved["train.client_mapping"]
    assert choice["requested"] == "auto" and choice["timed"] and choice["chosen"] in choice["candidates"]
    log = capsys.readouterr().out
    assert mapping_choice.describe(choice) in log
    # each timed candidate was announced before its compile, so a long choice is never silent
    for name in choice["candidates"]:
        assert f"client mapping auto: compiling and timing {name} (" in log


def test_a_rounds_fixed_cost_is_counted_once_not_scaled_with_its_steps():
    """Shortened rounds of 0.3 s whatever their steps plus 2 s for all steps: the estimate is 2.3 s (their time
    over their share alone says 0.34 / 0.02 = 17 s); noise that makes the longer round faster is no negative slope."""
    seconds = [0.3 + 2.0 * share for share in (0.01, 0.02)]
    assert np.allclose(mapping_choice.estimated_round(seconds, [0.01, 0.02]), (2.3, 0.3))
    assert mapping_choice.estimated_round([0.5, 0.4], [0.01, 0.02]) == (0.4, 0.4)
    assert mapping_choice.estimated_round([0.1, 0.5], [0.0, 1.0]) == (0.5, 0.1)  # the real round: its own time


def test_the_shortened_rounds_share_one_program_and_grow_with_their_share():
    engine = _engine()
    timing, rounds = mapping_choice.shortened(engine, "map", None)
    shares = [share for _, share in rounds]
    assert shares[0] == 0 and shares == sorted(shares) and len(set(shares)) == len(shares) and shares[-1] <= 1
    assert rounds[-1][0] is None  # the last: the timing engine's own (cut) data
    real = np.asarray(engine.train.n) > 0
    for train, _ in rounds[:-1]:  # the others: the same arrays, other sizes (no second compile)
        assert train.x is timing.train.x and train.y is timing.train.y
        assert (np.asarray(train.n) <= np.asarray(timing.train.n)).all()
    assert not np.asarray(rounds[0][0].n).any()  # the first trains no step
    assert all((np.asarray(train.n)[real] >= 1).all() for train, _ in rounds[1:-1])


class FakeClock:
    """A clock that moves only when a fake compiled round runs: each costs what the test says it costs."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def _fake_timing(monkeypatch, slopes: dict, jitter: float, fixed: float = 0.3):
    """choose_mapping on a fake clock: candidate ``name``'s round costs ``fixed + slopes[name] * share`` seconds
    (its estimate: fixed + slope), each shortened round with steps off by +-``jitter`` on alternate runs."""
    import itertools
    import types

    clock = FakeClock()
    monkeypatch.setattr(mapping_choice, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    signs = itertools.cycle([0.0, 1.0])
    rounds = [("none", 0.0), ("few", 0.02), (None, 1.0)]

    class Timing:
        def __init__(self, name):
            self.name = name

        def compiled_round(self, *args):
            def run(train=None):
                share = dict(rounds)[train]
                clock.now += fixed + slopes[self.name] * share + (jitter * next(signs) if share else 0.0)
                return np.zeros(())
            return run

    monkeypatch.setattr(mapping_choice, "shortened",
                        lambda engine, m, c: (Timing(mapping_choice.label(m, c)), rounds))


def test_a_padded_mapping_beats_a_padding_free_one_only_by_more_than_the_timings_noise(monkeypatch):
    """chunked:2 (padding on these ragged clients) estimated 2 s under map: chosen on a quiet clock; when the
    shortened rounds' repeats spread by 0.03 s (1.5 s at share 1 for each candidate), map is kept, and says why."""
    engine = _engine()
    server, clients, round_key = _start(engine, jax.random.key(5))
    options = [("map", None), ("chunked", 2)]
    assert mapping_choice.padding_free(engine, options, round_key, 0) == {"map"}
    slopes = {"map": 30.0, "chunked:2": 28.0}
    _fake_timing(monkeypatch, slopes, jitter=0.0)
    _, quiet = mapping_choice.choose_mapping(engine, server, clients, round_key, 0, options=options)
    assert quiet["chosen"] == "chunked:2" and "margin" not in quiet
    assert quiet["candidates"]["map"]["round_s"] == pytest.approx(30.3) and quiet["candidates"]["map"]["noise_s"] == 0
    _fake_timing(monkeypatch, slopes, jitter=0.03)
    chosen, busy = mapping_choice.choose_mapping(engine, server, clients, round_key, 0, options=options)
    assert busy["candidates"]["chunked:2"]["noise_s"] == pytest.approx(1.5)
    assert busy["chosen"] == "map" and str(chosen.mapping) == "map"
    assert "executes padding" in busy["margin"] and busy["margin"] in mapping_choice.describe(busy)
    # between padded mappings alone (or clients that all take as many steps), the fastest estimate wins
    assert mapping_choice.choose_with_margin(busy["candidates"], set())[0] == "chunked:2"


def test_a_run_times_its_mapping_again_when_it_ran_past_its_estimate(monkeypatch):
    """The chosen chunked:2 (estimated 28.3 s) ran 1.2x that: kept without timing; 1.4x: every candidate is
    timed again, and now that chunked:2 costs 40 s the run switches to map and says so, once."""
    engine = _engine()
    server, clients, round_key = _start(engine, jax.random.key(5))
    options = [("map", None), ("chunked", 2)]
    monkeypatch.setattr(mapping_choice, "candidates", lambda *a, **k: options)
    _fake_timing(monkeypatch, {"map": 30.0, "chunked:2": 28.0}, jitter=0.0)
    chosen, record = mapping_choice.choose_mapping(engine, server, clients, round_key, 0)
    assert record["chosen"] == "chunked:2"
    same = mapping_choice.retime(chosen, record, 1.2 * 28.3, server, clients, round_key, 1, 100)
    assert same[0] is chosen and same[1] == {**record, "checked": pytest.approx(1.2 * 28.3)}
    assert not mapping_choice.ran_slower(same[1], 100.0)  # checked once: the run goes on with it
    _fake_timing(monkeypatch, {"map": 30.0, "chunked:2": 40.0}, jitter=0.0)
    heard = []
    again, retimed = mapping_choice.retime(chosen, record, 1.4 * 28.3, server, clients, round_key, 1, 100,
                                           report=heard.append)
    assert str(again.mapping) == "map" and retimed["chosen"] == "map"
    assert retimed["retimed"] == {"was": "chunked:2", "ran_s": pytest.approx(1.4 * 28.3), "estimate_s": 28.3,
                                  "round": 1}
    assert "1.40x its estimate" in heard[0] and heard[-1].endswith("switching from chunked:2 to map")
    assert not mapping_choice.ran_slower(retimed, 100.0)  # a run times its mapping again once
    # too few rounds left: the slow mapping stays, untimed; an untimed record stays as it is
    assert mapping_choice.retime(chosen, record, 2 * 28.3, server, clients, round_key, 1, 3)[0] is chosen
    untimed = mapping_choice.untimed(chosen, "auto", "why")
    assert mapping_choice.retime(chosen, untimed, 9.9, server, clients, round_key, 1, 100) == (chosen, untimed)


def test_the_training_command_checks_its_mapping_after_its_first_timed_round(tmp_path, capsys, monkeypatch):
    """The run loop hands the first call without compiling to the mapping's check: with any slowdown counted as
    too slow, the run times its candidates again and says what it keeps."""
    from fedjax_pfl.commands import train as cli

    monkeypatch.setattr(mapping_choice, "RETIME_OVER", 0.0)
    args = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlp", "--rounds",
            str(mapping_choice.MIN_ROUNDS + 2), "--out", str(tmp_path / "run"), "partition.num_clients=4",
            "model.hidden=[8]", "eval_every=10"]
    assert cli.main(args) == 0
    log = capsys.readouterr().out
    assert log.count("timing the candidates again") == 1
    assert "keeping" in log or "switching from" in log
