"""``train.client_mapping=auto``: time the candidate client mappings on the run's first round, keep the fastest.

Which mapping is fastest depends on the machine, the model and the client
count (benchmarks/RESULTS.md: on a 2-core CPU ``vmap`` wins for an MLP and
loses 3-8x for a CNN; on a GPU ``vmap`` fills the device until memory runs
out), so ``auto`` measures instead of guessing. The program timed is the one
that runs: a lone run's `Engine`, or the `FederationRows` of a sweep's or a
table's runs (engine/rows.py; the same calls: ``with_mapping``,
``compiled_round``, ``round_padding``, ``packed_width``, ``training_rows``).
`choose_mapping` compiles the round of each candidate (`candidates`: on CPU
``map``, ``chunked`` by 4, ``vmap``; elsewhere ``vmap``, ``chunked`` by 8 and 32, ``packed:W*`` with W*
from the data (`Engine.packed_width`), ``map``; chunk sizes only below the
number of clients each device maps, `clients_per_device`) on
the engine's own devices and runs it on the run's real state for the
round about to run, shortened (`shortened`: one program; first with no step,
then with every client keeping the same share of its samples, the largest
1, 2, 4, ... batches an epoch (`TIMED_BATCHES`), until the steps take
`MEASURABLE_S`, so each client takes a few steps, costing what they cost in
the real round); the candidate's round is estimated from the line through the
two times against the shares of client-steps they took under that mapping
(sizes keep their proportions, so padding counts as it will), at share 1
(`estimated_round`): what a round costs whatever its steps (gathers, the
server step) is counted once, not scaled up with the steps. The first candidate's estimate is the run's first estimate of its
time, reported at once. Each shortened round runs `REPEATS` times (the
candidates within 25% of the best once more): the fastest is its time and
the spread its noise, carried to the estimate (`estimate_noise`). The
fastest estimate wins, except that a mapping which executes padding this
round beats a padding-free one (``map``; any mapping where every client
takes as many steps) only by more than the two estimates' noise
(`choose_with_margin`): on a busy machine a shortened round of a few steps
per client misleads, and padding is work the padding-free mapping never
does. A candidate that fails (out of memory) is recorded with its error and
left out.

A run then checks the estimate (`retime`): when its first rounds after
compiling ran more than `RETIME_OVER` times the chosen mapping's estimate,
it times the candidates again on its state, switches to the new choice if
it differs, and says so.

The numbers do not depend on the choice: the timed rounds run on copies
that are thrown away, then the run goes on from the same state with the
winner, so its results are exactly those of a run given the winning mapping
(and every mapping computes the same per-client numbers:
tests/test_mapping_choice.py, tests/test_engine.py). The cost is one compile
and a few shortened rounds per candidate, once per run (or per resumed
run), and it is bounded: the backend's default (client_mapping.default_mapping)
is timed first, and the others only when their estimated cost (each: a compile
as long as the default's and `SLOWER` of its shortened rounds) is at most `BUDGET` of
the run's remaining time at the default's speed, and only while the time
spent stays within that budget; the record says what it cost and what it
left untimed. Runs with fewer than `MIN_ROUNDS` rounds left, and
multi-process runs (whose processes must run one program), keep the default
untimed.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.engine import client_mapping, sharding
from fedjax_pfl.kernels import local_training
from fedjax_pfl.outputs.wall_time import clock

CPU_CANDIDATES = (("map", None), ("chunked", 4), ("vmap", None))
ACCELERATOR_CANDIDATES = (("vmap", None), ("chunked", 8), ("chunked", 32), ("map", None))
RETIME_WITHIN = 1.25  # candidates this close to the best run a second time
MIN_ROUNDS = 20  # timing costs a few rounds: shorter runs keep the default
BUDGET = 0.05  # the other candidates are timed only if that costs at most this share of the run
SLOWER = 3.0  # a candidate's round is budgeted as this many of the default's (vmap of a CNN on CPU: 3-8)
RETIME_OVER = 1.3  # a run whose chosen mapping ran this many times its estimate times the candidates again


def worth_timing(rounds_left: int) -> bool:
    """Whether a run with ``rounds_left`` rounds to go times the candidates (one process, enough rounds)."""
    return rounds_left >= MIN_ROUNDS and jax.process_count() == 1


def candidates(training_clients: int, backend: str | None = None,
               packed_width: int | None = None) -> list[tuple[str, int | None]]:
    """(mapping, chunk size or None) pairs to time for ``training_clients`` clients per round; on an
    accelerator ``packed:<packed_width>`` too, when given (before ``map``, the slowest there)."""
    cpu = (backend or jax.default_backend()) == "cpu"
    base = CPU_CANDIDATES if cpu else ACCELERATOR_CANDIDATES
    out = [(m, c) for m, c in base if m != "chunked" or c < training_clients]
    if not cpu and packed_width is not None:
        out.insert(len(out) - 1 if out[-1][0] == "map" else len(out), (f"packed:{packed_width}", None))
    return out


def label(mapping: str, chunk_size: int | None) -> str:
    """'map', 'vmap', 'packed:<lanes>' or 'chunked:<size>'."""
    return f"{mapping}:{chunk_size}" if mapping == "chunked" else mapping


def clients_per_device(engine) -> int:
    """Training clients each device maps in a round (the engine deals them evenly over its mesh)."""
    return -(-engine.training_rows() // sharding.mesh_size(engine.mesh))


TIMED_BATCHES = (1, 2, 4, 8, 16)  # the shortened rounds: the largest client keeps this many batches per epoch
MEASURABLE_S = 0.5  # a shortened round is long enough once its steps take this long (timer noise: ~0.1 s)
REPEATS = 2  # each shortened round runs this many times after its warm-up: the fastest counts, the spread is noise


def _cut(data, sizes):
    """``data`` (ClientData) with each client's first ``sizes`` samples."""
    cut = max(int(np.max(sizes)), 1)
    return type(data)(data.x[:, :cut], data.y[:, :cut], jnp.asarray(sizes, data.n.dtype))


def _with_sizes(data, sizes):
    """``data`` whose clients count only their first ``sizes`` samples (the arrays and their placement kept;
    clients past ``len(sizes)``, a mesh's empty ones, count none)."""
    n = np.zeros(data.n.shape[0], np.int64)
    n[:len(sizes)] = sizes
    return type(data)(data.x, data.y, jax.device_put(jnp.asarray(n, data.n.dtype), data.n.sharding))


def shortened(engine, mapping: str, chunk: int | None):
    """(an engine like ``engine`` mapped by ``mapping`` whose clients keep a share of their samples, its rounds
    from short to long as [(client data to run it on, or None for its own; the share of the real round's
    client-steps it takes under that mapping)]). The first round trains no step (what a
    round costs whatever its steps); in the others the largest client keeps `TIMED_BATCHES` batches per epoch
    and every client the same fraction of its samples (at least one), so the clients' sizes keep their
    proportions and a mapping's padding stays what it is; where that is every sample, the last round is the
    real one (share 1). All run one compiled program: the arrays cut once, only the sizes differ. A client's
    steps cost what they cost in the real round (same batch)."""
    train = engine.client_data[0]
    setup = engine.method.setup
    n = np.asarray(train.n).astype(np.int64)
    sizes = []
    for batches in TIMED_BATCHES:
        fraction = batches * setup.batch_size / max(int(n.max(initial=0)), 1)
        sizes.append(n if fraction >= 1 else np.where(n > 0, np.maximum(1, np.ceil(fraction * n)), 0).astype(np.int64))
        if fraction >= 1:
            break
    whole = sizes[-1] is n
    timing = engine.with_mapping(mapping, chunk, None if whole else _cut(train, sizes[-1]))
    devices = sharding.mesh_size(timing.mesh)

    def sequential(counts):
        steps = np.sort(np.asarray(local_training.real_steps(counts, setup.batch_size, setup.local_epochs,
                                                             setup.drop_last)))[::-1]
        return max(int(client_mapping.step_counts(jnp.asarray(steps), timing.mapping, devices)[0]), 1)

    rounds = [(_with_sizes(timing.train, 0 * n), 0.0)]
    rounds += [(_with_sizes(timing.train, counts), sequential(counts) / sequential(n)) for counts in sizes[:-1]]
    rounds.append((None, 1.0 if whole else sequential(sizes[-1]) / sequential(n)))
    return timing, rounds


def estimated_round(seconds: list[float], shares: list[float]) -> tuple[float, float]:
    """(a whole round's seconds, the seconds a round costs whatever its steps) from shortened rounds that took
    ``seconds`` for ``shares`` of the round's client-steps (the first: a round without steps): the line through
    the two points at share 1, its slope and intercept kept at or above 0.

    Examples:
        >>> estimated_round([0.28, 0.34], [0.0, 0.03])  # 0.28 s whatever the steps, 2 s for all of them
        (2.28, 0.28)
    """
    slope = max((seconds[1] - seconds[0]) / (shares[1] - shares[0]), 0.0)
    fixed = max(seconds[1] - slope * shares[1], 0.0)
    return round(fixed + slope, 6), round(fixed, 6)


def estimate_noise(spreads: list[float], shares: list[float]) -> float:
    """How far the estimated round can move with the timing's noise: the shortened rounds' spreads over their
    repeats (the round without steps first) carried to share 1 along `estimated_round`'s line.

    Examples:
        >>> estimate_noise([0.01, 0.02], [0.0, 0.1])  # 0.02 / 0.1 + 0.01 * (1 / 0.1 - 1)
        0.29
    """
    return round(spreads[1] / shares[1] + spreads[0] * (1 / shares[1] - 1), 6)


def choose_with_margin(candidates: dict[str, dict], padding_free: set[str]) -> tuple[str, str | None]:
    """(the candidate to run, why it is not the fastest estimate or None): the fastest estimated round
    (``round_s``), except that a candidate executing padding beats the fastest padding-free one only by more
    than the two estimates' measured noise (``noise_s``): on a busy machine the shortened rounds of a few steps
    per client mislead, and padding is work a padding-free mapping never does.

    Examples:
        >>> timed = {"map": {"round_s": 10.0, "noise_s": 0.5}, "chunked:4": {"round_s": 9.0, "noise_s": 1.0}}
        >>> choose_with_margin(timed, {"map"})[0], choose_with_margin(timed, set())[0]
        ('map', 'chunked:4')
    """
    best = min(candidates, key=lambda n: candidates[n]["round_s"])
    free = [n for n in candidates if n in padding_free]
    if best in padding_free or not free:
        return best, None
    fallback = min(free, key=lambda n: candidates[n]["round_s"])
    a, b = candidates[best], candidates[fallback]
    margin = a.get("noise_s", 0.0) + b.get("noise_s", 0.0)
    if b["round_s"] - a["round_s"] > margin:
        return best, None
    return fallback, (f"{best} ({a['round_s']:.3g} s) executes padding and beats {fallback} ({b['round_s']:.3g} s) "
                      f"by no more than the timing's noise ({margin:.3g} s)")


def padding_free(engine, options: list[tuple[str, int | None]], round_key, round_index: int) -> set[str]:
    """The labels of the ``options`` under which the round ``round_index`` executes no padding step."""
    return {label(m, c) for m, c in options
            if engine.with_mapping(m, c).round_padding(round_key, round_index)["padding_efficiency"] >= 1.0}


def choose_mapping(engine, server, clients, key, round_index: int = 0, values: dict | None = None,
                   options: list[tuple[str, int | None]] | None = None, rounds_left: int | None = None,
                   report=None):
    """(the fastest candidate's engine, record) for the round ``round_index`` with ``key`` on this state.

    Each candidate is compiled and timed on two `shortened` rounds (a few steps per client, whatever the
    clients' sizes), and its round is estimated from them (`estimated_round`).
    ``server`` and ``clients`` are read, never donated or changed. The record
    (JSON-ready) holds every candidate's compile seconds, the longer shortened round's seconds (``timed_s``) and
    share (``share``), the seconds of a round whatever its steps (``fixed_s``) and the estimated round
    (``round_s``), or its error, the chosen label, mapping and chunk
    size, and the seconds the choice took in all. With ``rounds_left``, the candidates after the first are timed
    only within `BUDGET` (the record's ``skipped`` says why not). ``report(line)``, when given, hears which
    candidate is being compiled and timed, before each (a CNN's vmap can take minutes on a CPU), and the first
    estimate of the run's time as soon as the first is timed. For federations (engine/rows.py) ``server``
    and ``clients`` are all of theirs and ``key`` their round keys [F]: their rows share the mapping, so the
    fastest mapping of one run need not be the fastest of its sweep.
    """
    began = time.perf_counter()
    if options is None:  # the program's own default first (federations on an accelerator: packed)
        options = sorted(candidates(clients_per_device(engine), packed_width=engine.packed_width()),
                         key=lambda option: label(*option) != str(engine.mapping))
    timed, runs, record, skipped = {}, {}, {}, None
    for i, (mapping, chunk) in enumerate(options):
        name = label(mapping, chunk)
        if i >= 1 and rounds_left is not None and timed:
            first = record[next(iter(timed))]
            run_s = rounds_left * first["round_s"]
            cost = (len(options) - 1) * (first["compile_s"] + SLOWER * first["timed_s"])
            spent = time.perf_counter() - began
            if i == 1 and cost > BUDGET * run_s:
                skipped = (f"timing {len(options) - 1} more would cost ~{cost:.0f} s, over {BUDGET:.0%} of the "
                           f"~{run_s:.0f} s of the {rounds_left} rounds left")
                break
            if spent > BUDGET * run_s:
                skipped = (f"{', '.join(label(*o) for o in options[i:])} not timed: {spent:.0f} s spent, over "
                           f"{BUDGET:.0%} of the ~{run_s:.0f} s of the {rounds_left} rounds left")
                break
        if report is not None:
            report(f"client mapping auto: compiling and timing {name} ({i + 1} of {len(options)}) ...")
        try:
            timing, rounds = shortened(engine, mapping, chunk)
            start = time.perf_counter()
            run = timing.compiled_round(server, clients, key, round_index, values)
            compile_s = time.perf_counter() - start
            seconds, used = _time_shortened(run, rounds)
            record[name] = {"compile_s": round(compile_s, 3), **_estimate(seconds, used)}
        except Exception as e:  # noqa: BLE001 (out of memory, a mapping the method cannot take: not a candidate)
            record[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        timed[name], runs[name] = (mapping, chunk), (run, used, seconds)
        if report is not None and len(timed) == 1:
            report(first_estimate(name, record[name], rounds_left))
    if not timed:
        raise RuntimeError(f"client_mapping=auto: every candidate failed: {record}")
    best = min(record[n]["round_s"] for n in timed)
    for name in [n for n in timed if record[n]["round_s"] <= RETIME_WITHIN * best] if len(timed) > 1 else ():
        run, used, seconds = runs[name]  # each shortened round once more: its fastest time, its spread
        record[name].update(_estimate([t + [_seconds(run, train)] for t, (train, _) in zip(seconds, used)], used))
    runs.clear()
    chosen, why = choose_with_margin({n: record[n] for n in timed},
                                     padding_free(engine, list(timed.values()), key, round_index))
    mapping, chunk = timed[chosen]
    winner = engine.with_mapping(mapping, chunk)
    out = {"requested": client_mapping.AUTO, "chosen": chosen, "mapping": str(winner.mapping), "chunk_size": chunk,
           "timed": True,
           "devices": sharding.mesh_size(engine.mesh), "timed_round": int(round_index), "candidates": record,
           "seconds": round(time.perf_counter() - began, 2), **({"margin": why} if why else {})}
    return winner, out if skipped is None else {**out, "skipped": skipped}


def ran_slower(record: dict, seconds_per_round: float) -> bool:
    """Whether the timed choice ``record`` (not checked yet) ran more than `RETIME_OVER` times its estimate."""
    estimate = round_seconds(record)
    return (estimate is not None and "checked" not in record and "retimed" not in record
            and seconds_per_round > RETIME_OVER * estimate)


def retime(engine, record: dict, seconds_per_round: float, server, clients, key, round_index: int, rounds_left: int,
           report=None):
    """(the engine to go on with, its record) once the run's first rounds after compiling took
    ``seconds_per_round`` each (their evaluations included) under the mapping ``record`` chose: when that is more
    than `RETIME_OVER` times its estimate (`ran_slower`: the machine was busier while timing, or the estimate
    wrong) and the run has rounds enough left (`worth_timing`), every candidate is timed again on this state for
    round ``round_index`` (round key ``key``), the new choice is taken, and ``report(line)`` hears both (the
    record's ``retimed`` keeps what ran and what was estimated). Otherwise ``engine`` and ``record`` as given,
    a timed record marked ``checked`` (with the seconds that ran): a run checks its estimate once."""
    if not ran_slower(record, seconds_per_round) or not worth_timing(rounds_left):
        return engine, record if round_seconds(record) is None else {**record, "checked": round(seconds_per_round, 4)}
    estimate, before = round_seconds(record), record["chosen"]
    say = report or (lambda line: None)
    say(f"client mapping auto: {before} ran {seconds_per_round:.3g} s a round, {seconds_per_round / estimate:.2f}x "
        f"its estimate of {estimate:.3g} s: timing the candidates again ...")
    winner, again = choose_mapping(engine, server, clients, key, round_index, rounds_left=rounds_left, report=report)
    again = {**again, "retimed": {"was": before, "ran_s": round(seconds_per_round, 4), "estimate_s": estimate,
                                  "round": int(round_index)}}
    switched = again["chosen"] != before
    say(f"{describe(again)}; " + (f"switching from {before} to {again['chosen']}" if switched else f"keeping {before}"))
    return (winner if switched else engine), again


def first_estimate(name: str, timed: dict, rounds_left: int | None) -> str:
    """The line that gives a run's first wall-time estimate, from the first candidate's shortened round."""
    whole = f"; about {clock(rounds_left * timed['round_s'])} for the {rounds_left} rounds left" if rounds_left else ""
    return (f"client mapping auto: {name} takes about {timed['round_s']:.3g} s a round here (a shortened round of "
            f"{timed['share']:.2%} of its client-steps took {timed['timed_s']:.3g} s, {timed['fixed_s']:.3g} s of "
            f"a round whatever its steps){whole}")


def untimed(engine, requested: str, why: str) -> dict:
    """The record of a mapping taken without timing (given by the config, or ``auto``'s default), and why."""
    mapping, chunk = str(engine.mapping), engine.mapping.chunk_size
    return {"requested": requested, "chosen": label(mapping, chunk), "mapping": mapping,
            "chunk_size": chunk, "timed": False, "why": why}


def reuse(engine, record: dict, why: str):
    """(this engine with the mapping an earlier timing chose, its record marked ``reused``: ``why``), for a
    program of the same shape as the timed one (a sweep's later chunk of as many points)."""
    return engine.with_mapping(record["mapping"], record["chunk_size"]), {**record, "reused": why}


def round_seconds(record: dict) -> float | None:
    """The seconds of one round of the chosen mapping, when the choice timed it (else None)."""
    if not record.get("timed"):
        return None
    return record["candidates"][record["chosen"]].get("round_s")


def describe(record: dict) -> str:
    """One log line: the chosen mapping and, when timed, each candidate's seconds per round and the choice's cost;
    the padding efficiency of the first round it runs, when the record has it (`with_padding`)."""
    padding, counts = record.get("padding"), ""
    if padding is not None and "executed_client_steps" in padding:
        counts = f" ({padding['real_client_steps']} real of {padding['executed_client_steps']} executed client-steps)"
    padding = "" if padding is None else (f"; padding efficiency {padding['padding_efficiency']:.3f} in round "
                                          f"{padding['round']}{counts}")
    if not record["timed"]:
        return f"client mapping {record['requested']}: {record['chosen']} ({record['why']}){padding}"
    parts = [f"{n} {c['round_s']:.3g} s" if "round_s" in c else f"{n} failed" for n, c in record["candidates"].items()]
    skipped = f"; not the others: {record['skipped']}" if "skipped" in record else ""
    margin = f"; {record['margin']}" if "margin" in record else ""
    took = f"reused: {record['reused']}" if "reused" in record else f"choosing took {record['seconds']:.1f} s"
    return (f"client mapping auto: {record['chosen']} (a round each, estimated from a shortened one: "
            f"{', '.join(parts)}{margin}; {took}{skipped}){padding}")


def with_padding(engine, record: dict, round_key, round_index: int) -> dict:
    """``record`` with ``padding``: the real, executed and sequential client-steps and the padding efficiency of
    round ``round_index`` (round key ``round_key``) under the engine's mapping (`Engine.round_padding`)."""
    return {**record, "padding": engine.round_padding(round_key, round_index)}


def choose_or_default(engine, requested: str, rounds_left: int, server, clients, key, round_index: int,
                      report=None, values: dict | None = None):
    """`choose_mapping` when ``requested`` is 'auto' and timing is worth it (`worth_timing`), else this engine
    with an `untimed` record. ``key``, ``report`` and ``values``: as `choose_mapping`'s."""
    if requested != client_mapping.AUTO:
        return engine, with_padding(engine, untimed(engine, requested, "set by train.client_mapping"), key,
                                    round_index)
    if not worth_timing(rounds_left):
        why = (f"the {jax.default_backend()} default, untimed: " +
               (f"fewer than {MIN_ROUNDS} rounds to go" if jax.process_count() == 1 else "several processes"))
        return engine, with_padding(engine, untimed(engine, requested, why), key, round_index)
    engine, record = choose_mapping(engine, server, clients, key, round_index, values, rounds_left=rounds_left,
                                    report=report)
    return engine, with_padding(engine, record, key, round_index)


def _time_shortened(run, rounds) -> tuple[list[list[float]], list]:
    """(each one's repeated seconds, rounds) of the round without steps and the first of the longer ``rounds``
    whose steps take `MEASURABLE_S` over it (else the longest), each run `REPEATS` times after a first that
    warms up: the fastest is its time, the spread its noise."""
    def runs(train):
        return [_seconds(run, train) for _ in range(REPEATS)]

    _seconds(run, rounds[0][0])
    fixed = runs(rounds[0][0])
    for train, share in rounds[1:]:
        seconds = runs(train)
        if min(seconds) - min(fixed) >= MEASURABLE_S or share == rounds[-1][1]:
            return [fixed, seconds], [rounds[0], (train, share)]
    raise ValueError("shortened rounds: none with steps")


def _estimate(seconds: list[list[float]], rounds: list) -> dict:
    """A candidate's record from its shortened rounds' repeated ``seconds``: the longer one's time and share, the
    seconds a round costs whatever its steps, the whole round (`estimated_round`, from the fastest of each) and
    that estimate's noise (`estimate_noise`, from their spreads)."""
    shares = [share for _, share in rounds]
    round_s, fixed_s = estimated_round([min(t) for t in seconds], shares)
    return {"timed_s": round(min(seconds[-1]), 4), "share": round(shares[-1], 5), "fixed_s": round(fixed_s, 4),
            "round_s": round(round_s, 4),
            "noise_s": round(estimate_noise([max(t) - min(t) for t in seconds], shares), 4)}


def _seconds(run, train=None) -> float:
    start = time.perf_counter()
    jax.block_until_ready(run(train))
    return time.perf_counter() - start
