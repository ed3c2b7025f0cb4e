"""LG-FedAvg, FedBABU, FedRoD and FedALA learn on real Fashion-MNIST and beat FedAvg there
(each paper's claim on pathological label skew): 4 clients of a 6,000-image subset, one FedAvg
run of the same 3 rounds on the same clients as the bar of all four, trained once in this file.
"""

import dataclasses
import math

import pytest

import majority_baseline
import pfl_reference as ref
from fedjax_pfl.runs import config as config_lib


@pytest.fixture(scope="module")
def fmnist_small(data_dir):
    from fedjax_pfl.data.registry import load_dataset

    ds = load_dataset("fmnist", data_dir=data_dir)
    return dataclasses.replace(ds, x_train=ds.x_train[:6000], y_train=ds.y_train[:6000],
                               x_test=ds.x_test[:1000], y_test=ds.y_test[:1000])


def _fmnist_engine(name, dataset):
    """4 FMNIST clients with 2 classes each (100 train / 50 test), MLP 64, Adam 3e-3, B=20,
    E=2, all clients, 3 rounds. Chance is 10% for the untrained model, 50% within a client."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    cfg = config_lib.build(None, [
        f"method_name={name}", "data.name=fmnist", "partition.scheme=pathological", "partition.num_clients=4",
        "partition.classes_per_client=2", "partition.train_per_client=100", "partition.test_per_client=50",
        "partition.test_from=split", "model.name=mlp", "model.hidden=[64]", "train.optimizer=adam",
        "train.lr=0.003", "train.batch_size=20", "train.local_epochs=2", "train.join_ratio=1.0", "train.rounds=3"]
        # FedBABU: tune the head only (5 epochs) so that the test sees what the federated body learned
        + (["method.finetune_part=head", "method.finetune_epochs=5"] if name == "fedbabu" else []))
    return cfg, build_experiment(validate(cfg), dataset=dataset).engine


@pytest.fixture(scope="module")
def fmnist_fedavg_accuracy(fmnist_small):
    """FedAvg's accuracy after the same 3 rounds on the same clients."""
    return ref.run_engine(_fmnist_engine("fedavg", fmnist_small)[1], 3)[1]["accuracy"]


@pytest.mark.parametrize("name", ["lgfedavg", "fedbabu", "fedrod", "fedala"])
def test_learns_on_fashion_mnist(name, fmnist_small, fmnist_fedavg_accuracy):
    cfg, eng = _fmnist_engine(name, fmnist_small)
    first, last, metrics, server, clients = ref.run_engine(eng, cfg.train.rounds)
    assert math.isfinite(float(metrics["train_loss"])) and math.isfinite(last["loss"])
    # FedBABU's first evaluation already fine-tunes a head on the random body (~0.7)
    majority = majority_baseline.from_engine(eng)
    assert last["accuracy"] > majority + 0.2 and last["accuracy"] > first + 0.2, (first, last, majority)
    # each paper's claim on pathological label skew
    assert last["accuracy"] > fmnist_fedavg_accuracy + 0.15, (last, fmnist_fedavg_accuracy)
