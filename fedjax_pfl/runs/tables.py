"""CSV tables of one run: metrics.csv and clients.csv.

metrics.csv holds the same numbers as metrics.jsonl, one row per evaluation
(floats written in Python's shortest round-trip form, so reading the CSV back
gives the JSON values exactly). clients.csv holds each client's test metrics
from the latest per-client evaluation (`Engine.evaluate`), since PFL results
are about the spread over clients. Files are replaced atomically.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

CLIENT_COLUMNS = ("client", "train_size", "test_size", "accuracy", "loss")


def write_atomically(path: Path, write: Callable, binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for reading
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def metrics_columns(records: list[dict]) -> list[str]:
    """Every key of any record, in order of first appearance."""
    return list(dict.fromkeys(k for r in records for k in r))


def _cell(value):
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return "" if value is None else value


def write_metrics_csv(path: Path, records: list[dict]) -> None:
    columns = metrics_columns(records)

    def write(f):
        out = csv.writer(f)
        out.writerow(columns)
        out.writerows([_cell(r.get(c)) for c in columns] for r in records)

    write_atomically(path, write)


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
    def write(f):
        out = csv.DictWriter(f, CLIENT_COLUMNS)
        out.writeheader()
        out.writerows(rows)

    write_atomically(path, write)
