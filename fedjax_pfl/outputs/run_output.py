"""JSON files of a run folder (config.json, partition.json, summary.json) and the summary's numbers.

JSON is written atomically (atomic_file.py), so a crash loses nothing
already written; metrics.jsonl has its own file (metrics_file.py).
`final_summary` turns the metrics records into summary.json's numbers.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
from pathlib import Path

import numpy as np

from fedjax_pfl.outputs import machine
from fedjax_pfl.outputs.atomic_file import atomic_write


def write_json(path: Path, obj) -> None:
    """Atomically write ``obj`` as JSON to ``path``."""
    with atomic_write(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=jsonable)


def as_json(obj):
    """``obj`` as it reads back from a JSON file (tuples become lists, numpy numbers plain)."""
    return json.loads(json.dumps(obj, default=jsonable))


def read_json(path: Path):
    """The JSON in ``path``, or None when the file does not exist or cannot be parsed."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def jsonable(obj):
    """``json.dump``'s ``default``: NumPy arrays and numbers, paths."""
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
    """`package_versions`, looked up once a process (a sweep writes it into every run's config.json)."""
    return dict(package_versions())


@functools.cache
def package_versions() -> dict:
    """Versions of the packages a result depends on, the machine (`machine.describe`), and the git commit if any."""
    import flax  # (these here: outputs/ imports without JAX, tests/test_layers.py; the package above it)
    import jax
    import optax

    import fedjax_pfl

    out = {"fedjax_pfl": fedjax_pfl.__version__, "jax": jax.__version__, "flax": flax.__version__,
           "optax": optax.__version__, "numpy": np.__version__, "backend": jax.default_backend(),
           "machine": machine.describe()}
    try:
        repo = Path(fedjax_pfl.__file__).resolve().parent.parent
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def best_round(records: list[dict], key: str) -> dict:
    """The evaluation with the highest ``key`` (first on ties; NaN never wins): round and both accuracies."""
    values = [r[key] for r in records]
    best = int(np.nanargmax(values)) if not all(math.isnan(v) for v in values) else len(values) - 1
    return {k: records[best][k] for k in ("round", "accuracy", "accuracy_weighted")}


LAST = ("round", "accuracy", "accuracy_weighted", "accuracy_std", "loss")  # of the last evaluation, where recorded


def final_summary(records: list[dict]) -> dict:
    """Last evaluation, mean of the last (up to) 10 evaluations, and the best
    (optimistic) round chosen on unweighted and on sample-weighted accuracy."""
    if not records:
        return {}
    last10 = records[-10:]
    summary = {
        "rounds_evaluated": len(records),
        "last": {k: records[-1][k] for k in LAST if k in records[-1]},
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
