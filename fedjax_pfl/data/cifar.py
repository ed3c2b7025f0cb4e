"""CIFAR-10 and CIFAR-100: the official python pickles, and the cifar10_jpeg copy.

Official: cifar-10-python.tar.gz / cifar-100-python.tar.gz (checksum checked)
or their extracted cifar-10-batches-py/ / cifar-100-python/ folders; CIFAR-100
uses the 100 fine labels. Pickles are read with an unpickler that admits only
numpy arrays, so a foreign pickle cannot run code.

cifar10_jpeg: a project-local, LOSSY re-encoding of CIFAR-10 (JPEG q75) as
{train,test}/<class name>/NNNN.jpg in a tar.gz. Decoding needs Pillow and takes
seconds, so the decoded arrays are cached once as .npz in the user cache,
keyed by the archive's md5. Decoding is serial: on the 2-core machines,
process or thread pools gave no gain for 32x32 images.
All images come back uint8 [n, 32, 32, 3].
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
import warnings
from pathlib import Path

import numpy as np

from fedjax_pfl.data import files
from fedjax_pfl.data.dataset import Dataset
from fedjax_pfl.core.errors import UserError

CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer',
                   'dog', 'frog', 'horse', 'ship', 'truck')
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

CIFAR10_FILE = files.DataFile(
    'cifar-10-python.tar.gz', 'c58f30108f718f92721af3b95e74349a',
    'https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz')
CIFAR100_FILE = files.DataFile(
    'cifar-100-python.tar.gz', 'eb9058c3a382ffc7106e4002c42a8d85',
    'https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz')
CIFAR10_JPEG_FILE = files.DataFile(
    'cifar10-jpeg-q75.tar.gz', '1305e62a50e4706d19c8747004d1d1a2', url=None,
    sha256='45b041e867f5a40f79bfde38d3dd1fd511103d50068c1afecf6445e25234d4db')

# Per variant: archive folder, train members, test members, label key.
_LAYOUT = {
    'cifar10': ('cifar-10-batches-py',
                tuple(f'data_batch_{i}' for i in range(1, 6)), ('test_batch',), b'labels'),
    'cifar100': ('cifar-100-python', ('train',), ('test',), b'fine_labels'),
}
_JPEG_CACHE_VERSION = 1


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain data and numpy arrays only."""

    _NUMPY = {'_reconstruct', '_frombuffer', 'ndarray', 'dtype', 'scalar'}

    def find_class(self, module, name):
        if ((module.split('.')[0] == 'numpy' and name in self._NUMPY)
                or (module, name) == ('_codecs', 'encode')):  # bytes in protocol 2
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f'refusing to load {module}.{name}')


def _read_batch(data: bytes, source: str, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR pickle → (uint8 [n, 32, 32, 3], int32 [n])."""
    try:
        d = _ArrayUnpickler(io.BytesIO(data), encoding='bytes').load()
        x = np.asarray(d[b'data'], np.uint8)
        y = np.asarray(d[label_key], np.int32)
    except (pickle.UnpicklingError, KeyError, TypeError, ValueError, EOFError) as e:
        raise UserError(f'{source} is not a CIFAR python batch ({e!r}).') from e
    if x.ndim != 2 or x.shape[1] != 3072 or y.shape != (x.shape[0],):
        raise UserError(f'{source}: expected data [n, 3072] and n labels, '
                        f'got {x.shape} and {y.shape}.')
    return x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), y


def read_cifar_python(path: str | os.PathLike, variant: str = 'cifar10'
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Reads (x_train, y_train, x_test, y_test) from the official python format.

    `path` is the .tar.gz or the extracted folder; `variant` 'cifar10' or 'cifar100'.
    """
    folder, train_names, test_names, label_key = _LAYOUT[variant]
    path = Path(path)
    blobs: dict[str, bytes] = {}
    wanted = set(train_names + test_names)
    if path.is_dir():
        for name in wanted:
            if (path / name).is_file():
                blobs[name] = (path / name).read_bytes()
    else:
        with tarfile.open(path, 'r:*') as tar:
            for member in tar:
                parent, _, base = member.name.rpartition('/')
                if member.isfile() and base in wanted and parent.endswith(folder):
                    blobs[base] = tar.extractfile(member).read()
    missing = sorted(wanted - blobs.keys())
    if missing:
        raise UserError(f'{path} lacks {", ".join(missing)} of the {variant} python '
                        f'format ({folder}/). Re-download or re-extract it.')

    def read(names):
        parts = [_read_batch(blobs[n], f'{path}:{n}', label_key) for n in names]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    return (*read(train_names), *read(test_names))


def _load_official(variant: str, spec: files.DataFile, num_classes: int, mean, std,
                   **find_kwargs) -> Dataset:
    path = files.find_file(spec, variant, extracted=_LAYOUT[variant][0], **find_kwargs)
    x_train, y_train, x_test, y_test = read_cifar_python(path, variant)
    return Dataset(variant, x_train, y_train, x_test, y_test, num_classes, mean, std)


def load_cifar10(*, data_dir: str | os.PathLike | None = None, allow_download: bool = False,
                 base_url: str | None = None) -> Dataset:
    """Official CIFAR-10: 50,000/10,000 uint8 images [n, 32, 32, 3], 10 classes."""
    return _load_official('cifar10', CIFAR10_FILE, 10, CIFAR10_MEAN, CIFAR10_STD,
                          data_dir=data_dir, allow_download=allow_download,
                          base_url=base_url)


def load_cifar100(*, data_dir: str | os.PathLike | None = None, allow_download: bool = False,
                  base_url: str | None = None) -> Dataset:
    """Official CIFAR-100 (fine labels): 50,000/10,000 images [n, 32, 32, 3], 100 classes."""
    return _load_official('cifar100', CIFAR100_FILE, 100, CIFAR100_MEAN, CIFAR100_STD,
                          data_dir=data_dir, allow_download=allow_download,
                          base_url=base_url)


def locate_cifar10(data_dir: str | os.PathLike | None = None) -> Path | None:
    """Where the official CIFAR-10 files (archive or extracted folder) would be read from, unchecked; None when
    no search folder holds them (files.locate: nothing is downloaded)."""
    return files.locate(CIFAR10_FILE, 'cifar10', data_dir, extracted=_LAYOUT['cifar10'][0])


def locate_cifar10_jpeg(data_dir: str | os.PathLike | None = None) -> Path | None:
    """Where the project's cifar10_jpeg archive would be read from, unchecked; None when not found."""
    return files.locate(CIFAR10_JPEG_FILE, 'cifar10_jpeg', data_dir)


def decode_jpeg_archive(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Decodes a {train,test}/<class name>/*.jpg tar.gz into uint8 arrays.

    Returns x_train, y_train, x_test, y_test; labels follow CIFAR10_CLASSES
    and examples are ordered by (label, file name).
    """
    try:
        from PIL import Image  # (here: a missing Pillow is this one-line error, for this dataset only)
    except ImportError as e:
        raise UserError('Decoding cifar10_jpeg needs Pillow: pip install Pillow') from e
    label_of = {name: i for i, name in enumerate(CIFAR10_CLASSES)}
    entries = {'train': [], 'test': []}
    raw = Path(path).read_bytes()
    if raw[:2] == b'\x1f\x8b':
        raw = gzip.decompress(raw)  # whole archive in memory: ~2x faster than streaming
    with tarfile.open(fileobj=io.BytesIO(raw), mode='r:') as tar:
        for member in tar:
            if not (member.isfile() and member.name.lower().endswith(('.jpg', '.jpeg'))):
                continue
            parts = member.name.lstrip('./').split('/')
            if len(parts) != 3 or parts[0] not in entries or parts[1] not in label_of:
                raise UserError(f'{path}: unexpected member {member.name}; expected '
                                f'{{train,test}}/<CIFAR-10 class name>/<n>.jpg.')
            entries[parts[0]].append(
                (label_of[parts[1]], parts[2],
                 raw[member.offset_data:member.offset_data + member.size]))
    out = {}
    for split, items in entries.items():
        items.sort(key=lambda t: t[:2])
        x = np.empty((len(items), 32, 32, 3), np.uint8)
        for i, (_, name, data) in enumerate(items):
            with Image.open(io.BytesIO(data), formats=['JPEG']) as im:
                if im.size != (32, 32):
                    raise UserError(f'{path}: {split} image {name} is {im.size}, not 32x32.')
                x[i] = np.asarray(im if im.mode == 'RGB' else im.convert('RGB'))
        out[f'x_{split}'] = x
        out[f'y_{split}'] = np.array([t[0] for t in items], np.int32)
    if not len(out['y_train']) or not len(out['y_test']):
        raise UserError(f'{path} holds no train or no test images.')
    return out


def _read_jpeg_cache(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ('x_train', 'y_train', 'x_test', 'y_test')}
    except (OSError, KeyError, ValueError, EOFError) as e:
        warnings.warn(f'Ignoring unreadable cache {path} ({e!r}); decoding again.')
        return None
    if (arrays['x_train'].dtype != np.uint8 or arrays['y_train'].dtype != np.int32
            or arrays['x_train'].shape[1:] != (32, 32, 3)):
        warnings.warn(f'Ignoring malformed cache {path}; decoding again.')
        return None
    return arrays


def load_cifar10_jpeg(*, data_dir: str | os.PathLike | None = None,
                      allow_download: bool = False, base_url: str | None = None,
                      use_cache: bool = True) -> Dataset:
    """CIFAR-10 re-encoded as JPEG q75 (lossy): 50,000/10,000 images [n, 32, 32, 3].

    The archive has no public source (a mirror can be given with `base_url`).
    Decoded arrays are cached under files.cache_dir()/cifar10_jpeg/.
    """
    spec = CIFAR10_JPEG_FILE
    archive = files.find_file(spec, 'cifar10_jpeg', data_dir=data_dir,
                              allow_download=allow_download, base_url=base_url)
    cache = (files.cache_dir() / 'cifar10_jpeg'
             / f'decoded-{spec.md5}-v{_JPEG_CACHE_VERSION}.npz')
    arrays = _read_jpeg_cache(cache) if use_cache and cache.is_file() else None
    if arrays is None:
        arrays = decode_jpeg_archive(archive)
        if use_cache:
            try:
                files.save_npz_atomic(cache, arrays)
            except OSError as e:
                warnings.warn(f'Could not cache decoded cifar10_jpeg at {cache} ({e}).')
    return Dataset('cifar10_jpeg', arrays['x_train'], arrays['y_train'],
                   arrays['x_test'], arrays['y_test'], 10, CIFAR10_MEAN, CIFAR10_STD)
