"""MNIST and Fashion-MNIST from their official IDX .gz files.

IDX: a big-endian header (two zero bytes, a dtype code, the number of dims,
then one uint32 per dim) followed by the raw data. Images come back as uint8
[n, 28, 28, 1]. Checksums are the published ones (see files.py for how
re-gzipped copies, such as Debian's, are accepted).
"""

from __future__ import annotations

import gzip
import os
from typing import Sequence

import numpy as np

from fedjax_pfl.data import files
from fedjax_pfl.data.dataset import Dataset
from fedjax_pfl.core.errors import UserError

MNIST_URL = 'https://ossci-datasets.s3.amazonaws.com/mnist/'
FASHION_MNIST_URL = 'http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/'
# Debian's dataset-fashion-mnist package (re-gzipped: only the content matches).
FASHION_MNIST_SYSTEM_DIRS = ('/usr/share/datasets/fashion-mnist',)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)

_NAMES = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
          't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')
# (md5 of the .gz, md5 of its decompressed content), in _NAMES order.
_MNIST_MD5 = (('f68b3c2dcbeaaa9fbdd348bbdeb94873', '6bbc9ace898e44ae57da46a324031adb'),
              ('d53e105ee54ea40749a09fcbcd1e9432', 'a25bea736e30d166cdddb491f175f624'),
              ('9fb629c4189551a2d022fa330f9573f3', '2646ac647ad5339dbf082846283269ea'),
              ('ec29112dd5afa0611ce80d1b7f02629c', '27ae3e4e09519cfbb04c329615203637'))
_FASHION_MNIST_MD5 = (
    ('8d4fb7e6c68d591d4c3dfef9ec88bf0d', 'f4a8712d7a061bf5bd6d2ca38dc4d50a'),
    ('25c81989df183df01b3e8a0aad5dffbe', '9018921c3c673c538a1fc5bad174d6f9'),
    ('bef4ecab320f06d8554ea6380940ec79', '8181f5470baa50b63fa0f6fddb340f0a'),
    ('bb300cfdad3c16e7a12a480ee83cd310', '15d484375f8d13e6eb1aabb0c3f46965'))


def _specs(url: str, sums) -> tuple[files.DataFile, ...]:
    return tuple(files.DataFile(name, md5, url + name, content_md5=content)
                 for name, (md5, content) in zip(_NAMES, sums))


MNIST_FILES = _specs(MNIST_URL, _MNIST_MD5)
FASHION_MNIST_FILES = _specs(FASHION_MNIST_URL, _FASHION_MNIST_MD5)

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype('>i2'),
               0x0C: np.dtype('>i4'), 0x0D: np.dtype('>f4'), 0x0E: np.dtype('>f8')}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an IDX file (.gz or raw) into an array of its stored shape."""
    opener = gzip.open if str(path).endswith('.gz') else open
    with opener(path, 'rb') as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise UserError(f'{path} is not an IDX file (bad magic number {raw[:4]!r}).')
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw, '>u4', ndim, 4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    if len(raw) != header + dtype.itemsize * int(np.prod(shape)):
        raise UserError(f'{path}: IDX header says shape {shape} but the file holds '
                        f'{len(raw) - header} data bytes.')
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(
        dtype.newbyteorder('='))


def _load_idx_dataset(name: str, subdir: str, specs: Sequence[files.DataFile],
                      mean: tuple[float, ...], std: tuple[float, ...],
                      extra_dirs: Sequence[str] = (), **find_kwargs) -> Dataset:
    paths = [files.find_file(spec, subdir, extra_dirs=extra_dirs, **find_kwargs)
             for spec in specs]
    x_train, y_train, x_test, y_test = (read_idx(p) for p in paths)
    for x, y, p in ((x_train, y_train, paths[0]), (x_test, y_test, paths[2])):
        if x.ndim != 3 or y.shape != x.shape[:1]:
            raise UserError(f'{p}: images {x.shape} and labels {y.shape} do not pair up.')
    return Dataset(
        name=name,
        x_train=x_train[..., None], y_train=y_train.astype(np.int32),
        x_test=x_test[..., None], y_test=y_test.astype(np.int32),
        num_classes=10, mean=mean, std=std)


def load_mnist(*, data_dir: str | os.PathLike | None = None, allow_download: bool = False,
               base_url: str | None = None) -> Dataset:
    """MNIST: 60,000/10,000 uint8 images [n, 28, 28, 1], 10 classes."""
    return _load_idx_dataset('mnist', 'mnist', MNIST_FILES, MNIST_MEAN, MNIST_STD,
                             data_dir=data_dir, allow_download=allow_download,
                             base_url=base_url)


def load_fashion_mnist(*, data_dir: str | os.PathLike | None = None,
                       allow_download: bool = False,
                       base_url: str | None = None) -> Dataset:
    """Fashion-MNIST: 60,000/10,000 uint8 images [n, 28, 28, 1], 10 classes.

    Also found in Debian's /usr/share/datasets/fashion-mnist.
    """
    return _load_idx_dataset('fmnist', 'fashion_mnist', FASHION_MNIST_FILES,
                             FASHION_MNIST_MEAN, FASHION_MNIST_STD,
                             extra_dirs=FASHION_MNIST_SYSTEM_DIRS,
                             data_dir=data_dir, allow_download=allow_download,
                             base_url=base_url)
