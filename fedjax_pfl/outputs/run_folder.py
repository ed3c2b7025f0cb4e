"""Reading a run folder written by ``python -m fedjax_pfl.train``.

A run folder holds config.json, partition.json, metrics.jsonl (one line per
evaluation), summary.json once the run stopped (finished, failed or
interrupted), and clients.csv and plots/ from `results_writer`; a compact
record (`compact_record`) only config.json, summary.json and
metrics.jsonl.xz. The readers accept folders of runs that failed or were
killed: a missing file reads as None or an empty list, a damaged line of
metrics.jsonl is skipped (and reported by `metrics_file.read_metrics`). This
module only reads; it never writes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs.metrics_file import read_metrics, run_metrics


def is_run(path: Path) -> bool:
    return (Path(path) / "config.json").is_file()


def find_runs(paths) -> list[Path]:
    """Run folders named by ``paths``: each a run folder or a folder holding runs (any depth)."""
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise UserError(f"no such folder: {path}; pass run folders written by python -m fedjax_pfl.train")
        found = [path] if is_run(path) else sorted(p.parent for p in path.rglob("config.json"))
        if not found:
            raise UserError(f"{path} holds no run (no config.json in it or below); "
                            "pass run folders written by python -m fedjax_pfl.train")
        runs += [p for p in found if p not in runs]
    return runs


def _read_json(path: Path, fix: str = "restore it from a backup, or leave this run out"):
    """The JSON in ``path``; None when it does not exist; UserError naming it when it cannot be read or parsed
    (``fix``: what to do then)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as e:  # (json's JSONDecodeError is a ValueError)
        raise UserError(f"{path} is damaged (not JSON: {e}); {fix}") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}; {fix}") from None


def read_config(run_dir: Path) -> dict:
    """The run's configuration (the ``config`` part of config.json)."""
    data = _read_json(Path(run_dir) / "config.json")
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise UserError(f"{run_dir}/config.json is missing or not written by python -m fedjax_pfl.train; "
                        "pass run folders written by it")
    return data["config"]


def read_provenance(run_dir: Path) -> dict:
    """Where a run came from: {"commits", "machines", "jax"}, each the distinct values (first seen first)
    that config.json's ``versions`` records for the run and for every resumed segment; '-' where not
    recorded (no commit for a run of a package installed outside a git checkout)."""
    data = _read_json(Path(run_dir) / "config.json") or {}
    segments = [data.get("versions") or {}] + [(r or {}).get("versions") or {} for r in data.get("resumed") or []]

    def distinct(key, shorten=None):
        values = [str(s.get(key)) if s.get(key) else "-" for s in segments]
        return list(dict.fromkeys(v if v == "-" or not shorten else v[:shorten] for v in values))

    return {"commits": distinct("git_commit", 7), "machines": distinct("machine"), "jax": distinct("jax")}


def read_partition(run_dir: Path) -> dict | None:
    return _read_json(Path(run_dir) / "partition.json")


def read_summary(run_dir: Path) -> dict | None:
    """The run's summary.json, None before the run stopped; UserError when it is damaged (the status it holds is
    lost: deleting it makes the run count as unfinished)."""
    summary = _read_json(Path(run_dir) / "summary.json", "delete it (the run then counts as unfinished) or restore "
                         "it from a backup")
    if summary is not None and not (isinstance(summary, dict) and isinstance(summary.get("status"), str)):
        raise UserError(f"{run_dir}/summary.json holds no run status (not written by python -m fedjax_pfl.train); "
                        "delete it (the run then counts as unfinished) or restore it from a backup")
    return summary


def read_records(run_dir: Path) -> list[dict]:
    """The valid records of the run's metrics (`metrics_file.run_metrics`), oldest first (damaged lines
    skipped: `metrics_file.read_metrics` says which)."""
    return read_metrics(run_metrics(run_dir)).records


def read_clients(run_dir: Path) -> list[dict] | None:
    """Rows of clients.csv with numbers as numbers, or None before the first one is written."""
    path = Path(run_dir) / "clients.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        return [{"client": int(r["client"]), "train_size": int(r["train_size"]), "test_size": int(r["test_size"]),
                 "accuracy": float(r["accuracy"]), "loss": float(r["loss"])} for r in csv.DictReader(f)]


def partition_label(partition: dict) -> str:
    """``partition`` section of a config -> e.g. 'dirichlet α=0.3', 'pathological 2/client'."""
    scheme = partition.get("scheme", "?")
    if scheme == "dirichlet":
        return f"dirichlet α={partition.get('alpha')}"
    if scheme == "pathological":
        return f"pathological {partition.get('classes_per_client')}/client"
    return scheme


def model_label(model: dict) -> str:
    hidden = model.get("hidden")
    return f"{model.get('name')}{list(hidden)}" if hidden else str(model.get("name"))


def describe(config: dict) -> dict:
    """The columns a reader identifies a run by: method, dataset, partition, model, clients."""
    partition = config.get("partition", {})
    return {"method": config.get("method_name"), "dataset": config.get("data", {}).get("name"),
            "clients": partition.get("num_clients"), "partition": partition_label(partition),
            "model": model_label(config.get("model", {}))}


def title(config: dict) -> str:
    """One line naming the run, for figure titles."""
    d = describe(config)
    return f"{d['method']} on {d['dataset']}, {d['clients']} clients, {d['partition']}, {d['model']}"


def wall_seconds(records: list[dict]) -> float | None:
    """Seconds spent in the round loop (first compile included), summed over resumed segments.

    ``seconds`` restarts at zero when a run is resumed, so each drop starts a segment.
    """
    if not records:
        return None
    total, previous = 0.0, 0.0
    for r in records:
        if r["seconds"] < previous:
            total += previous
        previous = r["seconds"]
    return total + previous
