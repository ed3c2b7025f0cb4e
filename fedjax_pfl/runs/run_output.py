"""The output folder of a run: config, partition summary, metrics, final summary.

Files are written so that a crash loses nothing already written: JSON files
go through a temporary file and an atomic rename; metrics.jsonl gets one
flushed, fsynced line per evaluation. Every file gets the permissions the
user's umask gives a new file (as ``open`` does), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "w"):
    """Yields a file object for a temporary file beside ``path``; on success it is
    fsynced, given the umask's permissions and renamed to ``path``; on error removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj) -> None:
    """Atomically write ``obj`` as JSON to ``path``."""
    with atomic_write(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=_jsonable)


def as_json(obj):
    """``obj`` as it reads back from a JSON file (tuples become lists, numpy numbers plain)."""
    return json.loads(json.dumps(obj, default=_jsonable))


def read_json(path: Path):
    """The JSON in ``path``, or None when the file does not exist or cannot be parsed."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _jsonable(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def versions() -> dict:
    """Versions of the packages a result depends on, and the git commit if any."""
    import flax
    import jax
    import optax

    import fedjax_pfl

    out = {"fedjax_pfl": fedjax_pfl.__version__, "jax": jax.__version__, "flax": flax.__version__,
           "optax": optax.__version__, "numpy": np.__version__, "backend": jax.default_backend()}
    try:
        repo = Path(fedjax_pfl.__file__).resolve().parent.parent
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def read_metrics(path: Path) -> list[dict]:
    """The records of metrics.jsonl (a torn last line, from a kill mid-write, is dropped)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            break
    return records


def truncate_metrics(path: Path, last_round: int) -> None:
    """Keep only the lines of metrics.jsonl up to ``last_round`` (when resuming)."""
    path = Path(path)
    if not path.exists():
        return
    keep = [r for r in read_metrics(path) if r["round"] <= last_round]
    with atomic_write(path) as f:
        f.write("".join(json.dumps(r, default=_jsonable) + "\n" for r in keep))


class MetricsLog:
    """Appends one JSON line per evaluation to metrics.jsonl (flushed and fsynced).

    ``records`` starts with the lines already in the file, so a resumed run's
    summary covers the whole run.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.records: list[dict] = read_metrics(self.path)
        self._file = open(self.path, "a")

    def write(self, record: dict) -> None:
        self.records.append(record)
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def best_round(records: list[dict], key: str) -> dict:
    """The evaluation with the highest ``key`` (first on ties; NaN never wins): round and both accuracies."""
    values = [r[key] for r in records]
    best = int(np.nanargmax(values)) if not all(math.isnan(v) for v in values) else len(values) - 1
    return {k: records[best][k] for k in ("round", "accuracy", "accuracy_weighted")}


def final_summary(records: list[dict]) -> dict:
    """Last evaluation, mean of the last (up to) 10 evaluations, and the best
    (optimistic) round chosen on unweighted and on sample-weighted accuracy."""
    if not records:
        return {}
    last10 = records[-10:]
    summary = {
        "rounds_evaluated": len(records),
        "last": {k: records[-1][k] for k in ("round", "accuracy", "accuracy_weighted", "accuracy_std", "loss")},
        "mean_last_10": {
            "evaluations": len(last10),
            "accuracy": float(np.mean([r["accuracy"] for r in last10])),
            "accuracy_weighted": float(np.mean([r["accuracy_weighted"] for r in last10])),
        },
        "best_optimistic": {
            "by_accuracy": best_round(records, "accuracy"),
            "by_accuracy_weighted": best_round(records, "accuracy_weighted"),
        },
    }
    if "eval_model" in records[-1]:
        summary["eval_model"] = records[-1]["eval_model"]
    if "val_accuracy" in records[-1]:  # partition.val_fraction > 0: what a setting is picked by
        summary["validation"] = {
            "last": records[-1]["val_accuracy"],
            "mean_last_10": float(np.mean([r["val_accuracy"] for r in last10])),
        }
    return summary
