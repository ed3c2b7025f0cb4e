"""CSV tables of one run: metrics.csv and clients.csv.

metrics.csv holds the same numbers as metrics.jsonl, one row per evaluation
(floats written in Python's shortest round-trip form, so reading the CSV back
gives the JSON values exactly). clients.csv holds each client's test metrics
from the latest per-client evaluation (`Engine.evaluate`), since PFL results
are about the spread over clients. Files are replaced atomically (atomic_file.py).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.outputs.metrics_file import flat_record

CLIENT_COLUMNS = ("client", "train_size", "test_size", "accuracy", "loss")


def metrics_columns(records: list[dict]) -> list[str]:
    """Every key of any (flat) record, in order of first appearance."""
    return list(dict.fromkeys(k for r in records for k in r))


def _cell(value):
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return "" if value is None else value


def write_metrics_csv(path: Path, records: list[dict]) -> None:
    """One row per record; the method's diagnostics as ``diagnostics/NAME`` columns (`flat_record`)."""
    records = [flat_record(r) for r in records]
    columns = metrics_columns(records)
    with atomic_write(path, newline="") as f:
        out = csv.writer(f)
        out.writerow(columns)
        out.writerows([_cell(r.get(c)) for c in columns] for r in records)


def client_rows(per_client: dict, partition: dict) -> list[dict]:
    """Per-client arrays ``correct``, ``count``, ``loss_sum`` + partition sizes -> rows of clients.csv.

    A client without test samples has accuracy and loss NaN.
    """
    correct, count = np.asarray(per_client["correct"], float), np.asarray(per_client["count"], float)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(count > 0, correct / count, np.nan)
        loss = np.where(count > 0, np.asarray(per_client["loss_sum"], float) / count, np.nan)
    train_sizes = partition["train"]["sizes"]
    test_sizes = partition["test"]["sizes"] if partition.get("test") else count.astype(int).tolist()
    return [{"client": i, "train_size": int(train_sizes[i]), "test_size": int(test_sizes[i]),
             "accuracy": float(accuracy[i]), "loss": float(loss[i])} for i in range(count.shape[0])]


def write_clients_csv(path: Path, rows: list[dict]) -> None:
    with atomic_write(path, newline="") as f:
        out = csv.DictWriter(f, CLIENT_COLUMNS)
        out.writeheader()
        out.writerows(rows)
