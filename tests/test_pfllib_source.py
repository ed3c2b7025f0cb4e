"""A folder in PFLlib's format loads as the same naturally partitioned clients."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.data import client_data, pfllib, registry
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.dataset import Dataset
from fedjax_pfl.runs.experiment import build_experiment, validate

SIZES = {"train": [7, 1, 12], "test": [3, 2, 4]}


def write_by_hand(root, num_classes=5, channels=2, side=6, seed=0):
    """The layout PFLlib's generate_*.py scripts write; returns {(split, i): (x NCHW, y)}."""
    rng = np.random.default_rng(seed)
    written = {}
    for split, sizes in SIZES.items():
        (root / split).mkdir(parents=True)
        for i, n in enumerate(sizes):
            x = rng.normal(size=(n, channels, side, side)).astype(np.float32)
            y = rng.integers(0, num_classes, n).astype(np.int64)
            with open(root / split / f"{i}.npz", "wb") as f:
                np.savez_compressed(f, data={"x": x, "y": y})
            written[split, i] = (x, y)
    config = {"num_clients": len(SIZES["train"]), "num_classes": num_classes, "non_iid": True,
              "balance": False, "partition": "dir", "alpha": 0.1, "batch_size": 10}
    (root / "config.json").write_text(json.dumps(config))
    return written


def test_loads_clients_rows_and_labels_as_written(tmp_path):
    written = write_by_hand(tmp_path / "FMNIST")
    ds = registry.load_dataset("pfllib", data_dir=tmp_path / "FMNIST")
    assert ds.is_federated and ds.num_classes == 5 and ds.input_shape == (6, 6, 2)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    for split in ("train", "test"):
        ids = getattr(ds, f"client_ids_{split}")
        assert np.bincount(ids).tolist() == SIZES[split]
        for i in range(3):
            x, y = written[split, i]
            np.testing.assert_array_equal(getattr(ds, f"x_{split}")[ids == i], x.transpose(0, 2, 3, 1))
            np.testing.assert_array_equal(getattr(ds, f"y_{split}")[ids == i], y)
    np.testing.assert_array_equal(ds.normalize(ds.x_test), ds.x_test)  # stored values are used as they are


def test_natural_partition_gives_each_client_its_own_file(tmp_path):
    written = write_by_hand(tmp_path / "d")
    cfg = config_lib.build(None, ["method_name=fedavg", "data.name=pfllib", f"data.data_dir={tmp_path / 'd'}",
                                  "partition.scheme=natural", "model.name=mlr", "train.batch_size=4"])
    exp = build_experiment(validate(cfg))
    train, test = exp.data.train, exp.data.test
    assert np.asarray(train.n).tolist() == SIZES["train"] and np.asarray(test.n).tolist() == SIZES["test"]
    for i in range(3):
        x, y = client_data.unpad(train, i)
        np.testing.assert_array_equal(x, written["train", i][0].transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(y, written["train", i][1])
    server, clients = exp.engine.init(jax.random.key(0))
    summary = exp.engine.evaluate_summary(server, clients, jax.random.key(1))
    assert 0.0 <= summary["accuracy"] <= 1.0


@pytest.mark.parametrize("damage, message", [
    ("no_folder", "does not exist"),
    ("no_config", "config.json"),
    ("missing_client", "missing"),
    ("corrupt_client", "not a PFLlib client file"),
    ("text_x", "text sets"),
])
def test_bad_folder_is_a_one_line_user_error(tmp_path, damage, message):
    root = tmp_path / "d"
    if damage != "no_folder":
        write_by_hand(root)
    if damage == "no_config":
        (root / "config.json").unlink()
    elif damage == "missing_client":
        (root / "test" / "2.npz").unlink()
    elif damage == "corrupt_client":
        (root / "train" / "1.npz").write_bytes(b"not a zip file")
    elif damage == "text_x":
        with open(root / "train" / "0.npz", "wb") as f:
            np.savez_compressed(f, data={"x": np.array([([1, 2], 2), ([3], 1)], dtype=object),
                                         "y": np.array([0, 1])})
    with pytest.raises(UserError, match=message) as err:
        registry.load_dataset("pfllib", data_dir=root)
    assert "\n" not in str(err.value)


def test_cli_without_data_dir_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedjax_pfl.train", "--method", "fedavg", "--dataset", "pfllib",
                           "--partition", "natural", "--model", "mlr", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--data-dir" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cli_trains_on_the_folders_own_clients_unless_told_otherwise(tmp_path):
    from fedjax_pfl.commands import train

    folder = tmp_path / "d"
    write_by_hand(folder)
    argv = ["--method", "fedavg", "--dataset", "pfllib", "--data-dir", str(folder), "--model", "mlr", "--batch-size", "4"]
    def scheme(argv):  # as validation resolves the declared partition.scheme=auto
        return validate(train.config_from_args(*train.parse_args(argv))).checked.partition.scheme

    assert scheme(argv) == "natural"
    assert scheme([*argv, "--partition", "iid"]) == "iid"
    assert scheme([*argv, "partition.scheme=iid"]) == "iid"
    exp = build_experiment(validate(train.config_from_args(*train.parse_args(argv))))
    assert np.asarray(exp.data.train.n).tolist() == SIZES["train"]


def test_written_folder_loads_back_as_the_same_clients_in_pfllibs_file_format(tmp_path):
    rng = np.random.default_rng(3)
    mean, std = (0.5, 0.4), (0.5, 0.25)
    clients = {split: [(rng.integers(0, 256, (n, 6, 6, 2), dtype=np.uint8), rng.integers(0, 5, n))
                       for n in sizes] for split, sizes in SIZES.items()}
    x0, y0 = clients["train"][0]
    source = Dataset("t", x0, y0.astype(np.int32), x0, y0.astype(np.int32), 5, mean, std)
    folder = pfllib.write_pfllib_folder(
        tmp_path / "out", *[[(pfllib.to_pfllib_images(source, x), y) for x, y in clients[s]] for s in ("train", "test")],
        num_classes=5, alpha=0.5)
    with np.load(folder / "train" / "0.npz", allow_pickle=True) as z:  # what PFLlib's read_data sees
        data = z["data"].tolist()
    assert set(data) == {"x", "y"} and data["x"].dtype == np.float32 and data["y"].dtype == np.int64
    assert data["x"].shape == (SIZES["train"][0], 2, 6, 6)
    assert json.loads((folder / "config.json").read_text()) == {"num_clients": 3, "num_classes": 5, "alpha": 0.5}
    ds = registry.load_dataset("pfllib", data_dir=folder)
    for split in ("train", "test"):
        ids = getattr(ds, f"client_ids_{split}")
        for i, (x, y) in enumerate(clients[split]):
            expected = (x.astype(np.float64) / 255.0 - np.array(mean)) / np.array(std)  # float64 reference
            np.testing.assert_allclose(getattr(ds, f"x_{split}")[ids == i], expected, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(getattr(ds, f"y_{split}")[ids == i], y)


def test_writer_refuses_a_folder_with_clients_mismatched_splits_and_non_images(tmp_path):
    x, y = np.zeros((2, 1, 4, 4), np.float32), np.array([0, 1])
    pfllib.write_pfllib_folder(tmp_path / "a", [(x, y)], [(x, y)], num_classes=2)
    with pytest.raises(UserError, match="already holds PFLlib client files"):
        pfllib.write_pfllib_folder(tmp_path / "a", [(x, y)], [(x, y)], num_classes=2)
    with pytest.raises(UserError, match="one train and one test"):
        pfllib.write_pfllib_folder(tmp_path / "b", [(x, y)], [], num_classes=2)
    with pytest.raises(UserError, match="3 labels"):
        pfllib.write_pfllib_folder(tmp_path / "c", [(x, np.arange(3))], [(x, y)], num_classes=3)
    with pytest.raises(UserError, match="uint8 images"):
        pfllib.to_pfllib_images(None, x)
