"""MedMNIST (v2) .npz files; PathMNIST: 9 tissue classes, uint8 28x28x3 images.

An .npz holds train_images/train_labels, val_*, test_* with labels [n, 1].
Mean/std are computed exactly from the training images (no published values).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from fedjax_pfl.data import files
from fedjax_pfl.data.dataset import Dataset, channel_stats
from fedjax_pfl.core.errors import UserError

PATHMNIST_FILE = files.DataFile(
    'pathmnist.npz', 'a8b06965200029087d5bd730944a56c1',
    'https://zenodo.org/records/10519652/files/pathmnist.npz')
PATHMNIST_CLASSES = 9


def read_medmnist_npz(path: str | os.PathLike, include_val: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Reads (x_train, y_train, x_test, y_test): uint8 [n, H, W, C], int32 [n].

    With `include_val`, the validation split is appended to train.
    """
    splits = ('train', 'val', 'test') if include_val else ('train', 'test')
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            arrays = {s: (z[f'{s}_images'], z[f'{s}_labels']) for s in splits}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise UserError(f'{path} is not a MedMNIST .npz with {splits} images and '
                        f'labels ({e!r}).') from e
    out = {}
    for s, (x, y) in arrays.items():
        if x.ndim == 3:
            x = x[..., None]  # grayscale MedMNIST sets
        if x.dtype != np.uint8 or x.ndim != 4 or y.reshape(-1).shape != (x.shape[0],):
            raise UserError(f'{path}: {s} images {x.dtype} {x.shape} with labels '
                            f'{y.shape}; expected uint8 [n, H, W(, C)] and [n, 1].')
        out[s] = (x, y.reshape(-1).astype(np.int32))
    x_train = np.concatenate([out[s][0] for s in splits[:-1]])
    y_train = np.concatenate([out[s][1] for s in splits[:-1]])
    return x_train, y_train, out['test'][0], out['test'][1]


def load_pathmnist(*, data_dir: str | os.PathLike | None = None,
                   allow_download: bool = False, base_url: str | None = None,
                   include_val: bool = False) -> Dataset:
    """PathMNIST: 89,996 train (+10,004 val) / 7,180 test images [n, 28, 28, 3]."""
    path = files.find_file(PATHMNIST_FILE, 'medmnist', data_dir=data_dir,
                           allow_download=allow_download, base_url=base_url)
    x_train, y_train, x_test, y_test = read_medmnist_npz(path, include_val)
    mean, std = channel_stats(x_train)
    return Dataset('pathmnist', x_train, y_train, x_test, y_test,
                   PATHMNIST_CLASSES, mean, std)
