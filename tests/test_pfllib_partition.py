"""partition.scheme=pfllib_dirichlet: PFLlib's generators (the PFAKD and FedAS authors' data), draw for draw."""

import numpy as np
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data import pfllib_partition
from fedjax_pfl.data.pfllib_partition import pfllib_dirichlet_split

# The authors' own separate_data (partition "dir", alpha 0.5, least_samples 3) and split_data
# (scikit-learn train_test_split, train_size 0.75), run once after np.random.seed(42) on the pool
# np.repeat(np.arange(4), 9) with 4 clients: each client's pool indices, in the order they return them.
AUTHORS_TRAIN = [[24, 11, 14, 19, 26, 22], [31, 29, 33, 1, 32], [4, 2, 20, 28, 15, 30, 5, 34, 27],
                 [13, 25, 18, 21, 6, 10]]
AUTHORS_TEST = [[16, 23], [35, 7], [0, 3, 8], [12, 17, 9]]


def test_equals_the_authors_generator_index_for_index():
    train, test = pfllib_dirichlet_split(np.repeat(np.arange(4), 9), 4, 0.5, 0.75, seed=42, least_samples=3)
    assert [t.tolist() for t in train] == AUTHORS_TRAIN
    assert [t.tolist() for t in test] == AUTHORS_TEST


# The same, on the pool np.repeat(np.arange(3), 9) of a dataset with num_classes=4 (class 3 absent):
# PFLlib still draws class 3's shares, which shifts the split's draws after it.
AUTHORS_TRAIN_K4 = [[7, 26, 19, 22, 21, 0, 18, 24], [5, 6, 2], [10, 25, 4], [15, 17, 9, 16, 14]]
AUTHORS_TEST_K4 = [[23, 8, 20], [1], [11, 12], [3, 13]]
AUTHORS_TRAIN_K3 = [[11, 17, 10], [2, 5, 6, 9, 12], [20, 23, 14, 22, 7, 3], [18, 0, 21, 24, 26]]  # num_classes=3


def test_a_class_absent_from_the_pool_still_draws_as_in_the_authors_generator():
    labels = np.repeat(np.arange(3), 9)
    train, test = pfllib_dirichlet_split(labels, 4, 0.5, 0.75, seed=42, least_samples=3, num_classes=4)
    assert [t.tolist() for t in train] == AUTHORS_TRAIN_K4
    assert [t.tolist() for t in test] == AUTHORS_TEST_K4
    default = pfllib_dirichlet_split(labels, 4, 0.5, 0.75, seed=42, least_samples=3)  # num_classes = 3
    assert [t.tolist() for t in default[0]] == AUTHORS_TRAIN_K3
    with pytest.raises(UserError, match="labels reach 2 but num_classes is 2"):
        pfllib_dirichlet_split(labels, 4, 0.5, 0.75, seed=42, num_classes=2)


def _histograms(parts, labels, num_classes):
    return np.array([np.bincount(labels[p], minlength=num_classes) for p in parts])


def test_a_client_past_its_share_gets_no_later_class():
    """The balancing: once a client holds N / num_clients samples it is left out of every later class."""
    labels = np.repeat(np.arange(10), 600)
    train, test = pfllib_dirichlet_split(labels, 10, 0.5, 0.75, seed=42)
    hist = _histograms(train, labels, 10) + _histograms(test, labels, 10)
    before = np.cumsum(hist, axis=1) - hist  # samples a client held when class k was cut
    # zero share; at most the one sample that PFLlib's float cumulative share can leave to the last client
    assert (hist[before >= labels.size / 10] <= 1).all()
    assert (before >= labels.size / 10).any(), "the cap binds in this draw"
    # plain Dir(0.5) without the cap would give these full clients more: the sizes stay near N / 10
    assert hist.sum(1).max() < 2 * labels.size / 10


@pytest.mark.parametrize("num_clients,alpha,least,fraction", [(10, 0.5, 1, 0.75), (20, 0.1, 40, 0.75),
                                                              (7, 0.3, 5, 0.6)])
def test_disjoint_whole_pool_least_samples_and_split_sizes(num_clients, alpha, least, fraction):
    labels = np.random.default_rng(0).integers(0, 10, 7000)
    train, test = pfllib_dirichlet_split(labels, num_clients, alpha, fraction, seed=1, least_samples=least)
    used = np.concatenate(train + test)
    assert np.sort(used).tolist() == list(range(labels.size))
    for tr, te in zip(train, test):
        n = tr.size + te.size
        assert n >= least
        assert tr.size == int(np.floor(fraction * n))


def test_seeded_and_seed_dependent():
    labels = np.repeat(np.arange(10), 300)
    a = pfllib_dirichlet_split(labels, 10, 0.5, 0.75, seed=42)
    b = pfllib_dirichlet_split(labels, 10, 0.5, 0.75, seed=42)
    c = pfllib_dirichlet_split(labels, 10, 0.5, 0.75, seed=43)
    assert all(np.array_equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))
    assert not all(np.array_equal(x, y) for x, y in zip(a[0], c[0]))


def test_redraws_until_least_samples_and_gives_up_with_a_one_line_error(monkeypatch):
    labels = np.repeat(np.arange(3), 20)
    train, test = pfllib_dirichlet_split(labels, 4, 0.2, 0.75, seed=0, least_samples=12)
    assert min(tr.size + te.size for tr, te in zip(train, test)) >= 12
    monkeypatch.setattr(pfllib_partition, "MAX_DRAWS", 2)
    with pytest.raises(UserError, match="lower partition.min_size"):
        pfllib_dirichlet_split(labels, 4, 0.05, 0.75, seed=0, least_samples=15)


@pytest.mark.parametrize("kwargs,match", [
    ({"alpha": 0.0}, "alpha must be > 0"),
    ({"train_fraction": 1.0}, "train_fraction must be in"),
    ({"least_samples": 100}, "do not fit a pool of 60"),
    ({"num_clients": 0}, "num_clients must be"),
    ({"labels": np.array([0.5, 1.0])}, "integer labels"),
])
def test_bad_requests_raise_user_error(kwargs, match):
    args = {"labels": np.repeat(np.arange(3), 20), "num_clients": 4, "alpha": 0.5, "train_fraction": 0.75,
            "seed": 0, **kwargs}
    with pytest.raises(UserError, match=match):
        pfllib_dirichlet_split(**args)


@pytest.mark.parametrize("overrides", [["partition.test_from=official"], ["partition.train_per_client=100"]])
def test_config_refuses_a_split_the_scheme_cannot_make(overrides):
    from fedjax_pfl.runs import config

    with pytest.raises(UserError, match="pfllib_dirichlet splits each client's pool"):
        config.validate_values(config.build(overrides=["partition.scheme=pfllib_dirichlet", *overrides]))


def test_experiment_uses_it_with_the_data_seed():
    """partition_dataset: the clients' train/test rows are the scheme's indices into the pooled train+test set."""
    from fedjax_pfl.data.dataset import Dataset
    from fedjax_pfl.runs import config, experiment

    y_train, y_test = np.repeat(np.arange(4), 50), np.repeat(np.arange(4), 10)
    ds = Dataset("toy", np.arange(200, dtype=np.float32)[:, None], y_train.astype(np.int32),
                 np.arange(200, 240, dtype=np.float32)[:, None], y_test.astype(np.int32), 4, (0.0,), (1.0,))
    cfg = config.build(overrides=["partition.scheme=pfllib_dirichlet", "partition.num_clients=5",
                                  "partition.alpha=0.5", "partition.min_size=1"])
    config.validate_values(cfg)
    data = experiment.partition_dataset(ds, cfg.partition, seed=42)
    train, test = pfllib_dirichlet_split(np.concatenate([y_train, y_test]), 5, 0.5, 0.75, seed=42)
    for i in range(5):
        n_train, n_test = int(data.train.n[i]), int(data.test.n[i])
        assert np.asarray(data.train.x[i, :n_train, 0]).astype(int).tolist() == train[i].tolist()
        assert np.asarray(data.test.x[i, :n_test, 0]).astype(int).tolist() == test[i].tolist()
    assert data.summary["info"]["scheme"] == "pfllib_dirichlet"
