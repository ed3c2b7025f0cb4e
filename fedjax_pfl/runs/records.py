"""metrics.jsonl records from the host outputs of a compiled call, and the checks that stop a diverged run.

The engine returns each call's round metrics and evaluations as host NumPy
(it reads them after every call), keyed by its round index t (0, 1, ...);
here they become one record per evaluated round, numbered as people count
rounds (``round`` = t + 1: the first round is round 1), after checking that no selected client's training loss and no test
loss is NaN or infinite (`DivergedError`, naming the first bad round and its
clients). Pure functions of host data: nothing here touches JAX or files.
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_pfl.core.errors import DivergedError
from fedjax_pfl.engine.engine import summarize_evaluation


def rounds_of_call(metrics: dict, rounds: int) -> list[dict]:
    """The first ``rounds`` slots of a call's stacked round metrics, one dict per round (a nested dict
    of metrics, such as ``diagnostics``, sliced the same way)."""
    def slot(value, j):
        return {k: slot(v, j) for k, v in value.items()} if isinstance(value, dict) else value[j]

    return [slot(metrics, j) for j in range(rounds)]


def first_bad_round(records: list[dict]):
    """(round index, client ids) of the first non-finite client training loss, or None.

    ``records``: host per-round metrics, each with 'round' (the engine's
    index, from 0), 'client_loss' [S] and 'selected' [S].
    """
    for r in records:
        bad = ~np.isfinite(np.asarray(r["client_loss"]))
        if bad.any():
            return int(r["round"]), [int(c) for c in np.asarray(r["selected"])[bad]]
    return None


def check_rounds(records: list[dict], step_sizes: list[str] = ()) -> None:
    """DivergedError at the first non-finite client training loss of host per-round metrics; its hint
    names the method's own ``step_sizes`` (option names) beside --lr."""
    bad = first_bad_round(records)
    if bad is not None:
        t, clients = bad
        rates = ", ".join(["--lr", *(f"method.{name}" for name in step_sizes)])
        raise DivergedError(f"round {t + 1}: training loss is not finite for client(s) {', '.join(map(str, clients))}; "
                            f"lower the learning rate ({rates}) or check the data normalisation")


def evaluation_record(per_client: dict, round_metrics: dict, t: int, seconds: float, eval_model: str) -> dict:
    """The metrics.jsonl record of the evaluation after round index ``t`` (``round`` t + 1), with the
    method's ``diagnostics`` of that round when it reports any (``client_diagnostics``: its values per
    selected client, keyed by client id); DivergedError if the test loss is not finite.

    ``seconds``: the run's wall time when the call holding round ``t`` returned.
    """
    evaluation = summarize_evaluation(per_client)
    if not math.isfinite(evaluation["loss"]):
        raise DivergedError(
            f"round {t + 1}: test loss is not finite ({evaluation['loss']}); "
            "lower the learning rate (--lr) or check the data normalisation"
        )
    record = {"round": t + 1, **evaluation, "train_loss": float(round_metrics["train_loss"]),
              "eval_model": eval_model, "seconds": seconds}
    diagnostics = round_metrics.get("diagnostics")
    if diagnostics:  # the method's scalars about round t (Method.round_diagnostics)
        record["diagnostics"] = {k: float(v) for k, v in diagnostics.items()}
    per_client = round_metrics.get("client_diagnostics")
    if per_client:  # its values per selected client: {name: {client id: value}}
        ids = [str(int(c)) for c in np.asarray(round_metrics["selected"])]
        record["client_diagnostics"] = {k: dict(zip(ids, map(float, np.asarray(v)))) for k, v in per_client.items()}
    return record
