"""The learning tests' bar (tests/majority_baseline.py) against a per-client loop."""

import doctest

import numpy as np
import optax

import majority_baseline
from fedjax_pfl.data import partition
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup


def test_majority_baseline_equals_a_per_client_loop_and_reads_the_run_partition(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 400).astype(np.int32)
    x = np.zeros((400, 1), np.float32)
    train_idx = [np.arange(i * 40, i * 40 + 30 - i) for i in range(10)]
    test_idx = [np.arange(i * 40 + 30, i * 40 + 40) if i != 3 else np.arange(0) for i in range(10)]
    expected = []
    for tr, te in zip(train_idx, test_idx):
        if len(te):
            majority = np.bincount(y[tr], minlength=5).argmax()
            expected.append(np.mean(y[te] == majority))
    want = float(np.mean(expected))
    got = majority_baseline.from_client_data(stack_clients(x, y, train_idx), stack_clients(x, y, test_idx), 5)
    assert abs(got - want) < 1e-12
    summary = partition.summary(train_idx, y, 5, test_idx)
    (tmp_path / "partition.json").write_text(__import__("json").dumps(summary))
    assert abs(majority_baseline.from_run(tmp_path) - want) < 1e-12
    setup = local_setup(model=build_model("mlp", (1,), 5, hidden=(4,)), optimizer=optax.sgd, lr=0.1, batch_size=4,
                        local_epochs=1, normalize=lambda v: v)
    engine = engine_lib.Engine(get_method("local")(setup), stack_clients(x, y, train_idx),
                               stack_clients(x, y, test_idx), engine_config(10))
    assert abs(majority_baseline.from_engine(engine) - want) < 1e-12
    assert doctest.testmod(majority_baseline).failed == 0
