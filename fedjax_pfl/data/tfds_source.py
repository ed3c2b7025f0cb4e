"""TensorFlow Datasets as a second source of the same arrays (the [tfds] extra).

tensorflow_datasets is imported only inside `load_tfds`; without it the call
raises UserError naming the extra to install. TFDS keeps its own cache
(`data_dir`, else TFDS_DATA_DIR or ~/tensorflow_datasets) and downloads only
when allowed. Returns the same Dataset (name, dtypes, mean/std) as the files.
"""

from __future__ import annotations

import os

import numpy as np

from fedjax_pfl.data import cifar, idx
from fedjax_pfl.data.dataset import Dataset
from fedjax_pfl.core.errors import DataNotFoundError, UserError

# Our name -> (TFDS name, label feature, classes, mean, std).
TFDS_DATASETS = {
    'mnist': ('mnist', 'label', 10, idx.MNIST_MEAN, idx.MNIST_STD),
    'fmnist': ('fashion_mnist', 'label', 10, idx.FASHION_MNIST_MEAN, idx.FASHION_MNIST_STD),
    'cifar10': ('cifar10', 'label', 10, cifar.CIFAR10_MEAN, cifar.CIFAR10_STD),
    'cifar100': ('cifar100', 'label', 100, cifar.CIFAR100_MEAN, cifar.CIFAR100_STD),
}
_ALIASES = {'fashion_mnist': 'fmnist'}


def load_tfds(name: str, *, data_dir: str | os.PathLike | None = None,
              allow_download: bool = False) -> Dataset:
    """Loads mnist, fmnist (fashion_mnist), cifar10 or cifar100 through TFDS."""
    name = _ALIASES.get(name, name)
    if name not in TFDS_DATASETS:
        raise UserError(f'TFDS source has no dataset {name!r}; it offers '
                        f'{", ".join(TFDS_DATASETS)}.')
    try:
        import tensorflow_datasets as tfds  # the optional [tfds] extra: a one-line error without it
    except ImportError as e:
        raise UserError('The TFDS source needs tensorflow_datasets: '
                        'pip install "fedjax_pfl[tfds]" (or use source="files").') from e
    tfds_name, label_key, num_classes, mean, std = TFDS_DATASETS[name]
    try:
        splits = tfds.load(tfds_name, split=['train', 'test'], batch_size=-1,
                           data_dir=None if data_dir is None else os.fspath(data_dir),
                           download=allow_download)
    except Exception as e:  # TFDS raises assorted types when data is absent.
        if allow_download:
            raise UserError(f'TFDS could not load {tfds_name}: {e}') from e
        raise DataNotFoundError(
            f'TFDS has no prepared {tfds_name} in '
            f'{data_dir or "its data dir (TFDS_DATA_DIR or ~/tensorflow_datasets)"} '
            f'({e}). Allow downloading (allow_download=True) on a machine with '
            f'internet, or use source="files" with --data-dir.') from e
    arrays = []
    for split in tfds.as_numpy(splits):
        arrays += [np.asarray(split['image'], np.uint8), np.asarray(split[label_key], np.int32)]
    return Dataset(name, *arrays, num_classes=num_classes, mean=mean, std=std)
