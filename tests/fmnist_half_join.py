"""The kNN-Per, FedCAC and GPFL learning tests' Fashion-MNIST setting: DiversiFed's pathological preset, shrunk.

6 clients with 2 classes each, 120 train / 60 test samples, an MLP of 32
hidden units, 2 local epochs of B=20 at lr 0.005, half of the clients in
each round, Flax's initialisation; 3 rounds by default.
"""

from pathlib import Path

import jax
import numpy as np

from fedjax_pfl.runs import config as config_lib


def engine(fmnist, method, options=()):
    """6 clients, 2 classes each (DiversiFed's pathological preset, shrunk), MLP 32, half join per round."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    preset = Path(__file__).resolve().parents[1] / "configs" / "diversifed_fmnist_pathological.yaml"
    cfg = config_lib.build(preset, [
        f"method_name={method}", *options, "partition.num_clients=6", "partition.train_per_client=120",
        "partition.test_per_client=60", "model.hidden=[32]", "train.local_epochs=2", "train.batch_size=20",
        "train.lr=0.005", "train.join_ratio=0.5",
        "model.init=flax",  # the learning margins were measured from Flax's init (the preset starts from torch's)
    ])
    return build_experiment(validate(cfg), dataset=fmnist).engine


def accuracy_before_after(eng, rounds=3):
    key = jax.random.key(0)
    server, clients = eng.init(key)
    before = eng.evaluate_summary(server, clients, key)["accuracy"]
    for t in range(rounds):
        server, clients, metrics = eng.round(server, clients, jax.random.fold_in(key, t), t)
    assert np.isfinite(float(metrics["train_loss"]))
    return before, eng.evaluate_summary(server, clients, key)["accuracy"], (server, clients, key)
