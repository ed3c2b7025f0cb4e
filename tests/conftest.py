"""Shared fixtures: the real-data folder, and what several test files train or load once per process."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Tests check what programs compute, not how fast: most of the suite's time is
# XLA compiling many small programs: LLVM's optimisation passes are a third of
# that, and XLA:CPU's MLIR fusion emitters take longer to build a kernel than its
# elemental emitter. Skipping the passes and the emitters (set before JAX starts;
# subprocesses inherit it) leaves every result as it was and halves compile time.
# Only the flags this jaxlib knows (xla_flags.py: an unknown one aborts the process).
# Benchmarks never run under these flags.
_FAST_COMPILE = ['--xla_backend_optimization_level=0', '--xla_llvm_disable_expensive_passes=true',
                 '--xla_cpu_use_fusion_emitters=false']
if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from xla_flags import accepted

    os.environ['XLA_FLAGS'] = ' '.join([os.environ.get('XLA_FLAGS', ''), *accepted(_FAST_COMPILE)]).strip()

# One host device unless a test asks for more (forced_devices.py): the training command's default
# (devices.cpu=auto, runs/host_devices.py) would otherwise give every CLI subprocess one device per core;
# tests/test_host_devices.py runs that default on purpose.
if 'xla_force_host_platform_device_count' not in os.environ['XLA_FLAGS']:
    os.environ['XLA_FLAGS'] += ' --xla_force_host_platform_device_count=1'

# Many tests compile the same programs again (one method's protocols, the same run in several files, CLI
# subprocesses): JAX's persistent compilation cache lets a later compile load the first one's executable.
# Its key holds the program, the XLA flags and the JAX version, so a hit runs exactly what a fresh compile
# would. One folder per test session, set here in the pytest process before xdist starts its workers (they
# and every subprocess inherit it) and removed when that process ends: each run compiles everything once.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix='fedjax_pfl-test-xla-cache-')
    os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    if 'jax' in sys.modules:  # a plugin imported JAX first: it has read its options already
        sys.modules['jax'].config.update('jax_compilation_cache_dir', _cache_dir)

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


@pytest.fixture(scope='session')
def fmnist(data_dir):
    """The real Fashion-MNIST, loaded once per test process."""
    from fedjax_pfl.data.registry import load_dataset

    return load_dataset('fmnist', data_dir=data_dir)


@pytest.fixture(scope='session')
def shifted_pixel_fedavg_run():
    """Two FedAvg rounds on tests/shifted_pixel_federation.py's clients (engine, server, clients, key):
    kNN-Per trains exactly this; FedCAC with tau 0 must match it."""
    import shifted_pixel_federation

    return shifted_pixel_federation.fedavg_run()
