"""The learning tests' small two-class Fashion-MNIST setting, as config overrides.

10 clients with 2 classes each (pathological), 150 train / 50 test samples,
an MLP of 64 hidden units, Adam 1e-3, B=50, 3 local epochs, every client in
each of 3 rounds: large enough to separate a method from its client's
majority class, small enough for the CPU test suite.
"""

from __future__ import annotations

from pathlib import Path


def overrides(data_dir: Path, method: str) -> list[str]:
    """Config overrides (``key=value``) of the setting for ``method``, data from ``data_dir``."""
    return ["data.name=fmnist", f"data.data_dir={data_dir}", "partition.scheme=pathological",
            "partition.num_clients=10", "partition.classes_per_client=2", "partition.train_per_client=150",
            "partition.test_per_client=50", "partition.test_from=split", "model.name=mlp", "model.hidden=[64]",
            "train.optimizer=adam", "train.lr=0.001", "train.batch_size=50", "train.local_epochs=3",
            "train.join_ratio=1.0", "train.rounds=3", f"method_name={method}"]
