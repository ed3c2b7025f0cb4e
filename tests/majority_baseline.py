"""The per-client majority-class baseline that every learning test must beat.

A personalized model that only learned its client's most frequent train
label scores, on that client's test split, the share of that label there.
The unweighted mean of that share over clients with test samples (the same
mean as the runs' ``accuracy``) is the bar a method has to clear before it
can be said to learn anything beyond the label skew of its partition.
Computed from the same partition as the run, never a constant.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def from_histograms(train_histograms, test_histograms) -> float:
    """Mean over clients with test samples of test share of their train majority class.

    >>> from_histograms([[3, 1], [0, 5]], [[2, 2], [1, 3]])  # (2/4 + 3/4) / 2
    0.625
    """
    train = np.asarray(train_histograms, np.float64)
    test = np.asarray(test_histograms, np.float64)
    if train.shape != test.shape or train.ndim != 2:
        raise ValueError(f"histograms must both be [clients, classes], got {train.shape} and {test.shape}")
    majority = train.argmax(axis=1)
    count = test.sum(axis=1)
    has = count > 0
    share = test[np.arange(len(test)), majority] / np.maximum(count, 1)
    return float(share[has].mean())


def from_client_data(train, test, num_classes: int) -> float:
    """`from_histograms` of two `ClientData` (padding rows past ``n`` ignored)."""
    return from_histograms(_histograms(train, num_classes), _histograms(test, num_classes))


def from_engine(engine) -> float:
    """`from_client_data` of the train and test clients an `Engine` evaluates."""
    return from_client_data(engine.train, engine.test, engine.method.model.num_classes)


def from_run(run_dir) -> float:
    """`from_histograms` of a run folder's partition.json (the partition the run trained on)."""
    part = json.loads((Path(run_dir) / "partition.json").read_text())
    if part.get("test") is None:
        raise ValueError(f"{run_dir}/partition.json has no test split")
    return from_histograms(part["train"]["histograms"], part["test"]["histograms"])


def _histograms(data, num_classes: int) -> np.ndarray:
    y, n = np.asarray(data.y), np.asarray(data.n)
    valid = np.arange(y.shape[1])[None, :] < n[:, None]
    return np.stack([np.bincount(y[i][valid[i]], minlength=num_classes) for i in range(len(n))])
