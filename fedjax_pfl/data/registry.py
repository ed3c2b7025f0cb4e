"""Datasets by name: `load_dataset('cifar10', data_dir=...)` -> Dataset.

Names: mnist, fmnist (alias fashion_mnist), cifar10 (official pickles),
cifar10_jpeg (the lossy project copy: never report it as cifar10), cifar100,
pathmnist, synthetic, pfllib (a folder PFLlib wrote: --data-dir PATH, naturally
partitioned, see pfllib.py). source='tfds' serves mnist, fmnist, cifar10, cifar100.
`resolve_auto` turns the run default 'auto' into the CIFAR-10 that is at hand:
the official files, else the project's JPEG copy (named cifar10_jpeg).
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable

from fedjax_pfl.data import cifar, idx, medmnist, pfllib, synthetic, tfds_source
from fedjax_pfl.data.dataset import Dataset
from fedjax_pfl.core.errors import UserError

DATASETS: dict[str, Callable[..., Dataset]] = {
    'mnist': idx.load_mnist,
    'fmnist': idx.load_fashion_mnist,
    'cifar10': cifar.load_cifar10,
    'cifar10_jpeg': cifar.load_cifar10_jpeg,
    'cifar100': cifar.load_cifar100,
    'pathmnist': medmnist.load_pathmnist,
    'synthetic': synthetic.load_synthetic,
    'pfllib': pfllib.load_pfllib,
}
ALIASES = {'fashion_mnist': 'fmnist'}
SOURCES = ('files', 'tfds')
AUTO = 'auto'  # the run default: `resolve_auto`
# Each dataset's example shape and class count, known before its files are read (tests/test_data_sources.py holds
# them against the loaded arrays); None: what its files hold (a PFLlib folder).
INPUTS: dict[str, tuple[tuple[int, ...], int] | None] = {
    'mnist': ((28, 28, 1), 10), 'fmnist': ((28, 28, 1), 10),
    'cifar10': ((32, 32, 3), 10), 'cifar10_jpeg': ((32, 32, 3), 10), 'cifar100': ((32, 32, 3), 100),
    'pathmnist': ((28, 28, 3), medmnist.PATHMNIST_CLASSES),
    'synthetic': ((synthetic.DIMENSION,), synthetic.NUM_CLASSES),
    'pfllib': None,
}


def input_kind(name: str) -> str | None:
    """'image' or 'vector' for the inputs of dataset ``name`` (canonical), None when its files decide."""
    inputs = INPUTS[name]
    return None if inputs is None else 'image' if len(inputs[0]) == 3 else 'vector'


def resolve_auto(data_dir: str | os.PathLike | None = None, source: str = 'files') -> tuple[str, str]:
    """(dataset, why) for 'auto': the official cifar10 when its files are found (or from TFDS), else the
    project's JPEG copy cifar10_jpeg when it is, else cifar10 (downloaded where allowed)."""
    if source == 'tfds':
        return 'cifar10', 'auto: CIFAR-10 from TensorFlow Datasets'
    official = cifar.locate_cifar10(data_dir)
    if official is not None:
        return 'cifar10', f'auto: the official CIFAR-10 files, at {official}'
    jpeg = cifar.locate_cifar10_jpeg(data_dir)
    if jpeg is not None:
        return 'cifar10_jpeg', (f"auto: the official cifar10 files are not here; the project's lossy JPEG copy of "
                                f'CIFAR-10, cifar10_jpeg, is (at {jpeg})')
    return 'cifar10', "auto: neither the official cifar10 files nor the project's JPEG copy cifar10_jpeg are here"


def dataset_names() -> tuple[str, ...]:
    """The canonical dataset names (aliases excluded)."""
    return tuple(DATASETS)


def canonical_name(name: str) -> str:
    """Resolves an alias; raises UserError for an unknown name."""
    name = ALIASES.get(name, name)
    if name not in DATASETS:
        valid = ', '.join(list(DATASETS) + [f'{a} (= {n})' for a, n in ALIASES.items()])
        raise UserError(f'Unknown dataset {name!r}. Valid names: {valid}.')
    return name


def load_dataset(name: str, *, data_dir: str | os.PathLike | None = None,
                 allow_download: bool = False, source: str = 'files',
                 **kwargs: Any) -> Dataset:
    """Loads a dataset by name.

    source='files' reads standard files (see files.py for where it looks);
    source='tfds' uses TensorFlow Datasets, with `data_dir` as the TFDS data
    directory. `kwargs` go to the loader (e.g. alpha, beta, num_clients, seed
    for synthetic; include_val for pathmnist; base_url for a download mirror).
    """
    name = canonical_name(name)
    if source not in SOURCES:
        raise UserError(f'Unknown data source {source!r}; choose one of {", ".join(SOURCES)}.')
    if source == 'tfds':
        if name not in tfds_source.TFDS_DATASETS:
            raise UserError(f'Dataset {name!r} is not available from TFDS; use '
                            f'source="files". TFDS serves {", ".join(tfds_source.TFDS_DATASETS)}.')
        loader = tfds_source.load_tfds
        _check_options(name, loader, kwargs, skip=('name',))
        return loader(name, data_dir=data_dir, allow_download=allow_download, **kwargs)
    loader = DATASETS[name]
    if name == 'synthetic':  # generated: no files to find
        _check_options(name, loader, kwargs)
        return loader(**kwargs)
    _check_options(name, loader, kwargs)
    return loader(data_dir=data_dir, allow_download=allow_download, **kwargs)


def _check_options(name: str, loader: Callable[..., Dataset], kwargs: dict[str, Any],
                   skip: tuple[str, ...] = ()) -> None:
    allowed = [p for p in inspect.signature(loader).parameters
               if p not in ('data_dir', 'allow_download') + skip]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise UserError(f'Dataset {name!r} takes no option(s) {", ".join(unknown)}; '
                        f'its options are: {", ".join(allowed) or "none"}.')
