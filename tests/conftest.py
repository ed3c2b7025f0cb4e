"""Shared fixtures."""

import os
from pathlib import Path

import pytest

_DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / 'shared' / 'data'

# A relative FEDJAX_PFL_DATA_DIR (the README's ../shared/data) is made absolute
# once, so tests that change folder or start subprocesses elsewhere still find it.
if os.environ.get('FEDJAX_PFL_DATA_DIR'):
    os.environ['FEDJAX_PFL_DATA_DIR'] = str(Path(os.environ['FEDJAX_PFL_DATA_DIR']).resolve())


@pytest.fixture(scope='session')
def data_dir() -> Path:
    """The real-data folder: $FEDJAX_PFL_DATA_DIR, else <repo>/../shared/data.

    Fails (never skips) when it is missing: the real-data tests must run.
    """
    path = Path(os.environ.get('FEDJAX_PFL_DATA_DIR') or _DEFAULT_DATA_DIR)
    if not path.is_dir():
        pytest.fail(f'Real-data folder {path} does not exist: set FEDJAX_PFL_DATA_DIR '
                    f'to the folder holding mnist/, fashion_mnist/, cifar10_jpeg/ '
                    f'(CI: ../shared/data beside the repository).', pytrace=False)
    return path
