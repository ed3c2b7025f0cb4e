"""Seconds a table cell's round takes on a device kind, estimated from measurements.

Measurements come from two places: benchmarks/seconds_per_round.json (the
GPU suite's rows, per device kind, each at the run settings it names) and the
table's own runs made on that device (their metrics.jsonl ``seconds``
and the machine their config.json names). A measurement is turned into
seconds per *client-epoch* by a work model (`round_work`: how many passes over
a client's train data a method's round makes, for the round's selected
clients and for every client), and a cell's seconds per round are that rate
times the cell's own work. So a FedAS row measured with every client online
gives FedAS at online ratio 0.2, and FedAvg's rate stands in for a method
never measured (its work counted from the method's definition, with
`PRIOR_MARGIN`). The anchors, nearest first: this method in the table's own
runs on that device (same data, model, clients and batch size); this
method's row in the record at the same model, clients, batch size and client
mapping; another method's row there; another method's runs in the table.
Without any, the estimate is unknown (the plan says so, and the runs
measure it). Nothing here imports JAX until a method's options are read.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import run_folder

RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "seconds_per_round.json"
PRIOR_MARGIN = 1.2  # on an estimate from another method's rate: the work model is counted, not measured
RUN_MATCH = ("data.name", "model.name", "partition.num_clients", "train.batch_size")
RECORD_MATCH = ("model.name", "partition.num_clients", "train.batch_size", "train.client_mapping")


@dataclasses.dataclass(frozen=True)
class Anchor:
    """One measurement: the run settings (a run's config, or the record's dotted keys) and its seconds per round."""

    config: dict
    seconds_per_round: float
    source: str

    @property
    def method(self) -> str:
        return str(setting(self.config, "method_name"))


@dataclasses.dataclass(frozen=True)
class Estimate:
    seconds_per_round: float | None  # None: unknown
    source: str


def load_record(path: Path | None = None) -> dict:
    """The seconds-per-round record (default `RECORD`)."""
    path = RECORD if path is None else path
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read the seconds-per-round record {path}: {e}") from None


def kind_record(record: dict, kind: str) -> dict:
    """The record of one device kind; UserError naming the kinds it has."""
    kinds = record.get("kinds") or {}
    if kind not in kinds:
        raise UserError(f"no measurements for device kind {kind!r} in benchmarks/seconds_per_round.json; "
                        f"choose one of: {', '.join(kinds) or 'none'}")
    return kinds[kind]


def setting(config: dict, key: str, default=None):
    """``config``'s value at dotted ``key``: a key of its own (the record's flat configs) or a path through a
    run's nested config (config.json, ``config_lib.to_dict``)."""
    if key in config:
        return config[key]
    value = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def _option(options, name: str) -> float:
    value = getattr(options, name, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"the work model names option {name!r}, which this method has not as a number")
    return float(value)


def clients_per_round(config: dict) -> int:
    """The engine's round(N * join ratio), at least 1 (engine.clients_per_round, without importing JAX)."""
    n = int(setting(config, "partition.num_clients") or 1)
    return max(1, min(n, int(round(n * float(setting(config, "train.join_ratio", 1.0))))))


def counted_clients(count: int, work: dict) -> int:
    """Clients side by side as the work model counts them: at least its ``min_clients_counted``."""
    return max(count, int(work.get("min_clients_counted", 1)))


def round_work(config: dict, work: dict) -> float:
    """Client-epochs of one round of ``config`` under the record's work model ``work``."""
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.runs.config import method_options

    name = str(setting(config, "method_name"))
    options = method_options(get_method(name).hparams_type, dict(setting(config, "method") or {}))
    model = (work.get("methods") or {}).get(name, {})
    epochs = float(setting(config, "train.local_epochs", 1))
    extra = sum(_option(options, x) if isinstance(x, str) else float(x) for x in model.get("extra_epochs", ()))
    selected = epochs * float(model.get("epochs_factor", 1)) + extra
    rounds = max(1, int(setting(config, "train.rounds") or 1))
    every = float(model.get("every_client_epochs", 0)) + float(model.get("once_every_client_epochs", 0)) / rounds
    every += getattr(options, "finetune_epochs", 0) / max(1, int(setting(config, "eval_every") or 1))
    n = int(setting(config, "partition.num_clients") or 1)
    return counted_clients(clients_per_round(config), work) * selected + counted_clients(n, work) * every


def steady_seconds(records: list[dict]) -> float | None:
    """Seconds per round of a run's first segment after its first call (compiling excluded), from the
    ``seconds`` of metrics.jsonl; None with fewer than two calls' records."""
    first = records[0] if records else None
    segment = []
    for r in records:
        if segment and r["seconds"] < segment[-1]["seconds"]:
            break  # a resumed segment starts its clock again
        segment.append(r)
    later = [r for r in segment if first is not None and r["seconds"] > first["seconds"]]
    if not later or later[-1]["round"] <= first["round"]:
        return None
    return (later[-1]["seconds"] - first["seconds"]) / (later[-1]["round"] - first["round"])


def run_anchors(runs_dir: Path, machine: str) -> list[Anchor]:
    """The finished runs under ``runs_dir`` made on ``machine``, as anchors."""
    anchors = []
    for folder in sorted(Path(runs_dir).glob("*/seed*")) if Path(runs_dir).is_dir() else []:
        if not run_folder.is_run(folder) or machine not in run_folder.read_provenance(folder)["machines"]:
            continue
        if (run_folder.read_summary(folder) or {}).get("status") != "finished":
            continue
        seconds = steady_seconds(run_folder.read_records(folder))
        if seconds:
            anchors.append(Anchor(run_folder.read_config(folder), seconds,
                                  f"measured: {folder.parent.name}/{folder.name} on {machine}"))
    return anchors


def record_anchors(kind: dict) -> list[Anchor]:
    """The record's rows of one device kind, as anchors."""
    return [Anchor({**w["config"], "method_name": method}, seconds,
                   f"{w.get('source', {}).get(method, 'record')} ({method}, {w['config'].get('partition.num_clients')} "
                   f"clients)")
            for w in kind.get("workloads", []) for method, seconds in w.get("seconds_per_round", {}).items()]


def _matches(anchor: Anchor, config: dict, keys: tuple[str, ...]) -> bool:
    return all(setting(anchor.config, k) == setting(config, k) for k in keys)


def _rate(anchors: list[Anchor], work: dict) -> float:
    """Median seconds per client-epoch of ``anchors``."""
    return statistics.median(a.seconds_per_round / round_work(a.config, work) for a in anchors)


def estimate(config: dict, runs: list[Anchor], recorded: list[Anchor], work: dict) -> Estimate:
    """Seconds per round of ``config`` (a run's nested config) from the nearest anchors (module docstring)."""
    method = setting(config, "method_name")
    own_runs = [a for a in runs if a.method == method and _matches(a, config, RUN_MATCH)]
    own_rows = [a for a in recorded if a.method == method and _matches(a, config, RECORD_MATCH)]
    other_rows = [a for a in recorded if _matches(a, config, RECORD_MATCH)]
    other_runs = [a for a in runs if _matches(a, config, RUN_MATCH)]
    for found, margin, how in ((own_runs, 1.0, "this method's runs"), (own_rows, 1.0, "this method's record"),
                               (other_rows, PRIOR_MARGIN, "the work model on"),
                               (other_runs, PRIOR_MARGIN, "the work model on")):
        if found:
            fedavg = [a for a in found if a.method == "fedavg"] if margin != 1.0 else found
            used = fedavg or found
            seconds = margin * _rate(used, work) * round_work(config, work)
            return Estimate(seconds, f"{how}: {used[0].source}" + (f" (+{len(used) - 1} more)" if len(used) > 1 else ""))
    keys = ", ".join(f"{k}={setting(config, k)}" for k in RECORD_MATCH)
    return Estimate(None, f"unknown: nothing measured at {keys} on this device kind")
