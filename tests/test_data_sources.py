"""Dataset sources: real MNIST/FMNIST/cifar10_jpeg files, file finding, checksums,
downloads from a local HTTP server, the CIFAR/MedMNIST readers on small written
files, Synthetic(alpha, beta), the TFDS error path and the registry."""

import functools
import gzip
import hashlib
import http.server
import io
import os
import pickle
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedjax_pfl.data import cifar, files, idx, medmnist, registry, synthetic, tfds_source
from fedjax_pfl.data.dataset import Dataset, channel_stats, with_normalization
from fedjax_pfl.core.errors import DataNotFoundError, UserError


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """Every test gets its own empty cache and no download mirror."""
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg_cache'))
    monkeypatch.delenv(files.ENV_CACHE_DIR, raising=False)
    monkeypatch.delenv(files.ENV_BASE_URL, raising=False)


def _require(data_dir: Path, subdir: str, name: str) -> Path:
    path = data_dir / subdir / name
    if not path.is_file():
        pytest.fail(f'{path} is missing: the real-data tests need it '
                    f'(see ../shared/data/README.md).', pytrace=False)
    return path


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _patch_md5(monkeypatch, module, attr: str, path: Path):
    """Points a loader's published checksum at a small file the test wrote."""
    spec = getattr(module, attr)
    monkeypatch.setattr(module, attr, files.DataFile(
        spec.name, _md5(path.read_bytes()), spec.url))


# ---------------------------------------------------------------- real files

@pytest.mark.parametrize('name, subdir, specs', [
    ('mnist', 'mnist', idx.MNIST_FILES),
    ('fmnist', 'fashion_mnist', idx.FASHION_MNIST_FILES),
])
def test_idx_datasets_load_real_files(data_dir, monkeypatch, name, subdir, specs):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    for spec in specs:  # the published checksums match the real files
        path = _require(data_dir, subdir, spec.name)
        assert files.file_digest(path) == spec.md5
        assert files.find_file(spec, subdir, data_dir=data_dir) == path
    ds = registry.load_dataset(name, data_dir=data_dir)
    assert ds.name == name and ds.is_image and not ds.is_federated
    assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
    assert ds.num_classes == 10
    for y, n in ((ds.y_train, 60000), (ds.y_test, 10000)):
        counts = np.bincount(y, minlength=10)
        assert counts.sum() == n and len(counts) == 10
        assert counts.min() > 0.85 * n / 10 and counts.max() < 1.15 * n / 10
    # The published normalisation statistics match the data.
    mean, std = channel_stats(ds.x_train)
    np.testing.assert_allclose(mean, ds.mean, atol=5e-4)
    np.testing.assert_allclose(std, ds.std, atol=5e-4)
    assert ds.x_train.max() == 255 and ds.x_train.min() == 0


def test_mnist_first_labels_and_pixels(data_dir):
    ds = idx.load_mnist(data_dir=data_dir)
    np.testing.assert_array_equal(ds.y_train[:8], [5, 0, 4, 1, 9, 2, 1, 3])
    np.testing.assert_array_equal(ds.y_test[:5], [7, 2, 1, 0, 4])
    assert int(ds.x_train[0].sum()) == 27525  # the well-known first "5"


def test_regzipped_copy_is_accepted_by_content_checksum(data_dir, tmp_path):
    """Debian re-gzips the files: the .gz md5 differs, the content md5 matches."""
    spec = idx.MNIST_FILES[1]
    content = gzip.decompress(_require(data_dir, 'mnist', spec.name).read_bytes())
    copy = tmp_path / 'mnist' / spec.name
    copy.parent.mkdir()
    copy.write_bytes(gzip.compress(content, compresslevel=1, mtime=12345))
    assert files.file_digest(copy) != spec.md5
    assert files.find_file(spec, 'mnist', data_dir=tmp_path) == copy
    # Same bytes with one label changed: rejected.
    bad = bytearray(content)
    bad[-1] = (bad[-1] + 1) % 10
    copy.write_bytes(gzip.compress(bytes(bad), mtime=12345))
    with pytest.raises(UserError, match='decompressed md5'):
        files.find_file(spec, 'mnist', data_dir=tmp_path)


@pytest.fixture(scope='module')
def jpeg_first_load(data_dir, tmp_path_factory):
    """Decodes cifar10_jpeg once per session into a private cache."""
    _require(data_dir, 'cifar10_jpeg', cifar.CIFAR10_JPEG_FILE.name)
    cache = tmp_path_factory.mktemp('jpeg_cache')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(files.ENV_CACHE_DIR, str(cache))
        mp.delenv(files.ENV_BASE_URL, raising=False)
        start = time.perf_counter()
        ds = registry.load_dataset('cifar10_jpeg', data_dir=data_dir)
        seconds = time.perf_counter() - start
    yield ds, seconds, cache
    for f in cache.rglob('*.npz'):  # ~185 MB: do not leave it in /tmp
        f.unlink()


def test_cifar10_jpeg_real_archive(jpeg_first_load):
    ds, _, _ = jpeg_first_load
    assert ds.name == 'cifar10_jpeg' and ds.num_classes == 10
    assert ds.x_train.shape == (50000, 32, 32, 3) and ds.x_test.shape == (10000, 32, 32, 3)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
    np.testing.assert_array_equal(np.bincount(ds.y_train), [5000] * 10)
    np.testing.assert_array_equal(np.bincount(ds.y_test), [1000] * 10)
    mean, std = channel_stats(ds.x_train)
    np.testing.assert_allclose(mean, (0.4914, 0.4822, 0.4465), atol=0.01)
    assert all(0.9 * s0 < s < s0 for s, s0 in zip(std, cifar.CIFAR10_STD))  # JPEG: a bit lower
    # Labels follow the class folders: ships (8) are bluer than frogs (6).
    blue = [ds.x_train[ds.y_train == c][..., 2].mean() - ds.x_train[ds.y_train == c][..., 0].mean()
            for c in (6, 8)]
    assert blue[1] > blue[0] + 10


def test_cifar10_jpeg_second_load_hits_cache(jpeg_first_load, data_dir, monkeypatch):
    first, first_seconds, cache = jpeg_first_load
    cached = list((cache / 'cifar10_jpeg').glob('decoded-*.npz'))
    assert len(cached) == 1 and cifar.CIFAR10_JPEG_FILE.md5 in cached[0].name
    assert not list(cache.rglob('*.part'))
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(cache))

    def no_decode(path):
        raise AssertionError('decoded again despite the cache')

    monkeypatch.setattr(cifar, 'decode_jpeg_archive', no_decode)
    start = time.perf_counter()
    second = cifar.load_cifar10_jpeg(data_dir=data_dir)
    assert time.perf_counter() - start < first_seconds / 2
    for key in ('x_train', 'y_train', 'x_test', 'y_test'):
        np.testing.assert_array_equal(getattr(second, key), getattr(first, key))


# ------------------------------------------------------ finding and checking

def test_missing_file_offline_names_file_folders_and_remedy(tmp_path, monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    empty = tmp_path / 'empty'
    with pytest.raises(DataNotFoundError) as err:
        registry.load_dataset('mnist', data_dir=empty)
    msg = str(err.value)
    for text in ('train-images-idx3-ubyte.gz', str(empty / 'mnist'), str(empty),
                 str(files.cache_dir() / 'mnist'), str(files.cache_dir()),
                 '--data-dir', files.ENV_DATA_DIR, 'allow_download=True', idx.MNIST_URL):
        assert text in msg
    with pytest.raises(DataNotFoundError, match='no public download source'):
        cifar.load_cifar10_jpeg(data_dir=empty, allow_download=True)


def test_env_data_dir_is_searched(data_dir, monkeypatch):
    monkeypatch.setenv(files.ENV_DATA_DIR, str(data_dir))
    spec = idx.MNIST_FILES[3]
    assert files.find_file(spec, 'mnist') == data_dir / 'mnist' / spec.name
    folders = files.search_folders('mnist', '/explicit', extra_dirs=['/sys_dir'])
    assert folders == [Path('/explicit/mnist'), Path('/explicit'), data_dir / 'mnist',
                       data_dir, files.cache_dir() / 'mnist', files.cache_dir(),
                       Path('/sys_dir')]


def test_file_in_root_dir_is_accepted(tmp_path, monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    (tmp_path / 'thing.bin').write_bytes(b'abc')
    spec = files.DataFile('thing.bin', _md5(b'abc'))
    assert files.find_file(spec, 'things', data_dir=tmp_path) == tmp_path / 'thing.bin'


def test_corrupt_file_raises_user_error(tmp_path, monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    folder = tmp_path / 'mnist'
    folder.mkdir()
    spec = idx.MNIST_FILES[0]  # train images: the first file a load looks for
    (folder / spec.name).write_bytes(b'not the real file')
    with pytest.raises(UserError, match='checksum') as err:
        files.find_file(spec, 'mnist', data_dir=tmp_path)
    assert str(folder / spec.name) in str(err.value) and spec.md5 in str(err.value)
    with pytest.raises(UserError, match='checksum'):
        registry.load_dataset('mnist', data_dir=tmp_path)
    (folder / 'cifar-10-python.tar.gz').write_bytes(b'truncated')
    with pytest.raises(UserError, match='checksum'):
        cifar.load_cifar10(data_dir=folder)


# ---------------------------------------------------------------- downloads

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_root(tmp_path):
    """Serves a folder on 127.0.0.1 (ephemeral port); yields (folder, base URL)."""
    root = tmp_path / 'served'
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield root, f'http://127.0.0.1:{server.server_address[1]}/'
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_download_from_local_server(http_root, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    root, url = http_root
    payload = np.random.default_rng(0).bytes(300_000)
    (root / 'fake.bin').write_bytes(payload)
    spec = files.DataFile('fake.bin', _md5(payload), url='http://unused.invalid/fake.bin')
    with pytest.raises(DataNotFoundError):
        files.find_file(spec, 'fakeset', data_dir=tmp_path / 'none', base_url=url)
    path = files.find_file(spec, 'fakeset', data_dir=tmp_path / 'none',
                           allow_download=True, base_url=url)
    assert path == files.cache_dir() / 'fakeset' / 'fake.bin'
    assert path.read_bytes() == payload
    assert sorted(p.name for p in path.parent.iterdir()) == ['fake.bin']
    err = capsys.readouterr().err
    assert 'Downloading fake.bin' in err and '100%' in err
    # Found in the cache next time, without the server.
    (root / 'fake.bin').unlink()
    assert files.find_file(spec, 'fakeset', data_dir=tmp_path / 'none',
                           allow_download=True, base_url=url) == path


def test_download_checksum_mismatch_leaves_nothing(http_root, monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    root, url = http_root
    (root / 'fake.bin').write_bytes(b'tampered content')
    spec = files.DataFile('fake.bin', _md5(b'expected content'))
    with pytest.raises(UserError, match='does not match') as err:
        files.find_file(spec, 'fakeset', allow_download=True, base_url=url)
    assert 'nothing was saved' in str(err.value)
    folder = files.cache_dir() / 'fakeset'
    assert not folder.exists() or not list(folder.iterdir())
    with pytest.raises(UserError, match='absent.bin not found; searched: .*HTTP Error 404'):
        files.find_file(files.DataFile('absent.bin', 'x' * 32), 'fakeset',
                        allow_download=True, base_url=url, progress=False)
    assert not folder.exists() or not list(folder.iterdir())


def _write_pathmnist(path: Path, n=(40, 10, 20), seed=0) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, size in zip(('train', 'val', 'test'), n):
        arrays[f'{split}_images'] = rng.integers(0, 256, (size, 28, 28, 3), dtype=np.uint8)
        arrays[f'{split}_labels'] = rng.integers(0, 9, (size, 1), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return arrays


def test_loader_downloads_through_env_mirror(http_root, monkeypatch):
    """load_dataset(..., allow_download=True) with FEDJAX_PFL_DOWNLOAD_BASE_URL."""
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    root, url = http_root
    arrays = _write_pathmnist(root / 'pathmnist.npz')
    _patch_md5(monkeypatch, medmnist, 'PATHMNIST_FILE', root / 'pathmnist.npz')
    monkeypatch.setenv(files.ENV_BASE_URL, url)
    ds = registry.load_dataset('pathmnist', allow_download=True)
    np.testing.assert_array_equal(ds.x_train, arrays['train_images'])
    assert (files.cache_dir() / 'medmnist' / 'pathmnist.npz').is_file()


# ------------------------------------------------- readers on written files

def _cifar_batch(rng, n, label_key, num_classes):
    batch = {b'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             label_key: rng.integers(0, num_classes, n).tolist(),
             b'batch_label': b'testing batch'}
    if label_key == b'fine_labels':
        batch[b'coarse_labels'] = rng.integers(0, 20, n).tolist()
    return batch


def _write_cifar(root: Path, variant: str, n=6) -> dict[str, dict]:
    folder_name, train_names, test_names, label_key = cifar._LAYOUT[variant]
    num_classes = 10 if variant == 'cifar10' else 100
    rng = np.random.default_rng(1)
    folder = root / folder_name
    folder.mkdir(parents=True)
    batches = {}
    for name in train_names + test_names:
        batches[name] = _cifar_batch(rng, n, label_key, num_classes)
        (folder / name).write_bytes(pickle.dumps(batches[name], protocol=2))
    (folder / 'batches.meta').write_bytes(pickle.dumps({b'label_names': []}))
    return batches


def _tar_gz(src: Path, dest: Path) -> Path:
    with tarfile.open(dest, 'w:gz') as tar:
        tar.add(src, arcname=src.name)
    return dest


@pytest.mark.parametrize('variant, classes', [('cifar10', 10), ('cifar100', 100)])
def test_cifar_python_readers(tmp_path, monkeypatch, variant, classes):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    batches = _write_cifar(tmp_path / 'extracted', variant)
    folder_name, train_names, _, label_key = cifar._LAYOUT[variant]
    x_train, y_train, x_test, y_test = cifar.read_cifar_python(
        tmp_path / 'extracted' / folder_name, variant)
    assert x_train.shape == (6 * len(train_names), 32, 32, 3) and x_test.shape == (6, 32, 32, 3)
    first = batches[train_names[0]]
    # Row layout: 1024 red, 1024 green, 1024 blue, each row-major 32x32.
    i, r, c, ch = 2, 5, 7, 1
    assert x_train[i, r, c, ch] == first[b'data'][i, ch * 1024 + r * 32 + c]
    np.testing.assert_array_equal(y_train[:6], first[label_key])
    assert y_train.dtype == np.int32 and 0 <= y_train.min() and y_train.max() < classes
    # The same data from a .tar.gz found in <data_dir>/<variant>/, checksum checked.
    spec_attr = f'{variant.upper()}_FILE'
    (tmp_path / 'data' / variant).mkdir(parents=True)
    archive = _tar_gz(tmp_path / 'extracted' / folder_name,
                      tmp_path / 'data' / variant / getattr(cifar, spec_attr).name)
    with pytest.raises(UserError, match='checksum'):
        registry.load_dataset(variant, data_dir=tmp_path / 'data')
    _patch_md5(monkeypatch, cifar, spec_attr, archive)
    ds = registry.load_dataset(variant, data_dir=tmp_path / 'data')
    assert ds.name == variant and ds.num_classes == classes
    np.testing.assert_array_equal(ds.x_train, x_train)
    np.testing.assert_array_equal(ds.y_test, y_test)
    # An extracted folder in the data dir is used as is.
    ds2 = registry.load_dataset(variant, data_dir=tmp_path / 'extracted')
    np.testing.assert_array_equal(ds2.x_test, x_test)


def test_cifar_reader_rejects_foreign_pickles_and_missing_batches(tmp_path):
    folder = tmp_path / 'cifar-10-batches-py'
    _write_cifar(tmp_path, 'cifar10')

    class Evil:
        def __reduce__(self):
            return (os.system, ('echo pwned',))

    (folder / 'test_batch').write_bytes(pickle.dumps({b'data': Evil()}))
    with pytest.raises(UserError, match='refusing to load'):
        cifar.read_cifar_python(folder, 'cifar10')
    (folder / 'test_batch').unlink()
    with pytest.raises(UserError, match='test_batch'):
        cifar.read_cifar_python(folder, 'cifar10')


def _jpeg_bytes(color) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new('RGB', (32, 32), color).save(buf, format='JPEG', quality=95)
    return buf.getvalue()


def _write_jpeg_archive(path: Path) -> Path:
    members = {'train/truck/0001.jpg': (0, 0, 250), 'train/airplane/0000.jpg': (250, 0, 0),
               'train/truck/0000.jpg': (0, 250, 0), 'test/cat/0000.jpg': (128, 128, 128)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, 'w:gz') as tar:
        for name, color in members.items():
            data = _jpeg_bytes(color)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_decode_jpeg_archive_small(tmp_path, monkeypatch):
    path = _write_jpeg_archive(tmp_path / 'small.tar.gz')
    out = cifar.decode_jpeg_archive(path)
    np.testing.assert_array_equal(out['y_train'], [0, 9, 9])  # sorted by (label, name)
    np.testing.assert_array_equal(out['y_test'], [3])
    assert out['x_train'].shape == (3, 32, 32, 3) and out['x_train'].dtype == np.uint8
    means = out['x_train'].mean(axis=(1, 2))
    assert means[0, 0] > 200 and means[1, 1] > 200 and means[2, 2] > 200
    monkeypatch.setitem(sys.modules, 'PIL', None)
    with pytest.raises(UserError, match='pip install Pillow'):
        cifar.decode_jpeg_archive(path)


def test_jpeg_cache_is_rebuilt_when_unreadable(tmp_path, monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    archive = _write_jpeg_archive(tmp_path / 'data' / 'cifar10_jpeg' / cifar.CIFAR10_JPEG_FILE.name)
    _patch_md5(monkeypatch, cifar, 'CIFAR10_JPEG_FILE', archive)
    first = cifar.load_cifar10_jpeg(data_dir=tmp_path / 'data')
    (cache,) = (files.cache_dir() / 'cifar10_jpeg').glob('decoded-*.npz')
    assert cifar.CIFAR10_JPEG_FILE.md5 in cache.name
    cache.write_bytes(b'garbage')
    with pytest.warns(UserWarning, match='unreadable cache'):
        second = cifar.load_cifar10_jpeg(data_dir=tmp_path / 'data')
    np.testing.assert_array_equal(first.x_train, second.x_train)
    assert np.load(cache)['x_train'].shape == (3, 32, 32, 3)  # written anew
    bad = tmp_path / 'bad.tar.gz'
    with tarfile.open(bad, 'w:gz') as tar:
        info = tarfile.TarInfo('train/unicorn/0000.jpg')
        info.size = 3
        tar.addfile(info, io.BytesIO(b'abc'))
    with pytest.raises(UserError, match='unicorn'):
        cifar.decode_jpeg_archive(bad)


def test_pathmnist_reader(tmp_path, monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    arrays = _write_pathmnist(tmp_path / 'medmnist' / 'pathmnist.npz')
    with pytest.raises(UserError, match='checksum'):
        medmnist.load_pathmnist(data_dir=tmp_path)
    _patch_md5(monkeypatch, medmnist, 'PATHMNIST_FILE', tmp_path / 'medmnist' / 'pathmnist.npz')
    ds = registry.load_dataset('pathmnist', data_dir=tmp_path)
    assert ds.x_train.shape == (40, 28, 28, 3) and ds.x_test.shape == (20, 28, 28, 3)
    assert ds.num_classes == 9 and ds.y_train.dtype == np.int32 and ds.y_train.ndim == 1
    np.testing.assert_array_equal(ds.y_test, arrays['test_labels'][:, 0])
    assert ds.mean == channel_stats(ds.x_train)[0]
    ds_val = registry.load_dataset('pathmnist', data_dir=tmp_path, include_val=True)
    assert ds_val.x_train.shape[0] == 50
    np.testing.assert_array_equal(ds_val.x_train[40:], arrays['val_images'])
    bad = tmp_path / 'bad.npz'
    np.savez(bad, train_images=arrays['train_images'])
    with pytest.raises(UserError, match='MedMNIST'):
        medmnist.read_medmnist_npz(bad)


# ---------------------------------------------------------------- synthetic

def test_synthetic_shapes_and_client_split():
    ds = registry.load_dataset('synthetic', alpha=0.5, beta=0.5, num_clients=20, seed=3)
    assert ds.name == 'synthetic_0.5_0.5' and not ds.is_image and ds.is_federated
    assert ds.x_train.dtype == np.float32 and ds.x_train.shape[1] == 60
    assert ds.num_classes == 10 and ds.mean == (0.0,) and ds.std == (1.0,)
    for y in (ds.y_train, ds.y_test):
        assert y.min() >= 0 and y.max() < 10
    n_train = np.bincount(ds.client_ids_train, minlength=20)
    n_test = np.bincount(ds.client_ids_test, minlength=20)
    assert len(n_train) == len(n_test) == 20
    sizes = n_train + n_test
    assert sizes.min() >= 50  # lognormal(4, 2) + 50
    np.testing.assert_array_equal(n_train, (0.75 * sizes).astype(int))
    # Non-IID: clients' label distributions differ a lot.
    hist = np.stack([np.bincount(ds.y_train[ds.client_ids_train == k], minlength=10) / n_train[k]
                     for k in range(20)])
    assert np.abs(hist - hist.mean(0)).sum(1).mean() > 0.5
    # Features: per-client means differ (v_k ~ N(B_k, 1)); variance falls as j^-1.2.
    x0 = ds.x_train[ds.client_ids_train == int(np.argmax(n_train))]
    var = x0.var(0)
    assert var[0] > 3 * var[-1]


def test_synthetic_is_deterministic_and_fixed_size():
    kwargs = dict(alpha=1.0, beta=1.0, num_clients=5, samples_per_client=40)
    a = synthetic.load_synthetic(seed=7, **kwargs)
    b = synthetic.load_synthetic(seed=7, **kwargs)
    c = synthetic.load_synthetic(seed=8, **kwargs)
    for key in ('x_train', 'y_train', 'x_test', 'y_test', 'client_ids_train'):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert not np.array_equal(a.x_train, c.x_train)
    np.testing.assert_array_equal(np.bincount(a.client_ids_train), [30] * 5)
    np.testing.assert_array_equal(np.bincount(a.client_ids_test), [10] * 5)
    iid = synthetic.load_synthetic(0, 0, num_clients=4, samples_per_client=400, iid=True)
    assert iid.name == 'synthetic_iid'
    hist = np.stack([np.bincount(iid.y_train[iid.client_ids_train == k], minlength=10) / 300
                     for k in range(4)])
    assert np.abs(hist - hist.mean(0)).sum(1).max() < 0.3
    with pytest.raises(UserError):
        synthetic.load_synthetic(samples_per_client=1)
    with pytest.raises(UserError):
        synthetic.load_synthetic(alpha=-1)


def test_synthetic_size_factor_is_the_pfedkd_authors_sizes():
    """The pFedKD-WCL authors' generator: 5 x (lognormal(4, 2) + 50) samples per client, same clients."""
    one = registry.load_dataset('synthetic', num_clients=8, seed=2)
    five = registry.load_dataset('synthetic', num_clients=8, seed=2, size_factor=5)
    sizes = lambda ds: np.bincount(ds.client_ids_train, minlength=8) + np.bincount(ds.client_ids_test, minlength=8)
    np.testing.assert_array_equal(sizes(five), 5 * sizes(one))
    np.testing.assert_array_equal(sizes(one), synthetic.client_sizes(np.random.default_rng(2), 8))
    n_train = np.bincount(five.client_ids_train, minlength=8)
    np.testing.assert_array_equal(n_train, (0.75 * sizes(five)).astype(int))
    with pytest.raises(UserError, match='size_factor must be a whole number >= 1'):
        synthetic.load_synthetic(size_factor=0)
    with pytest.raises(UserError, match='leave it at 1'):
        synthetic.load_synthetic(samples_per_client=40, size_factor=5)


def test_synthetic_size_factor_reaches_the_generator_from_the_config():
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment, validate

    cfg = config_lib.build(overrides=['method_name=fedavg', 'data.name=synthetic', 'partition.scheme=natural',
                                      'partition.num_clients=4', 'model.name=mlr', 'data.synthetic_size_factor=3'])
    exp = build_experiment(validate(cfg))
    expected = 3 * synthetic.client_sizes(np.random.default_rng(0), 4)
    np.testing.assert_array_equal(np.asarray(exp.data.train.n) + np.asarray(exp.data.test.n), expected)
    assert exp.dataset.x_train.shape == (0, synthetic.DIMENSION)  # (generated samples freed once partitioned)
    assert exp.dataset.x_train.base is None and exp.dataset.client_ids_test.base is None  # no view keeps them


def test_half_normalization_is_torchvisions_half_and_reaches_the_setup():
    """data.normalization=half: (x/255 - 0.5) / 0.5 per channel (PFLlib's generators), through the
    experiment's normalize; the dataset's own statistics by default; feature data refuses it."""
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment, validate

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (12, 4, 4, 3), dtype=np.uint8)
    x[0], x[1] = 0, 255
    y = (np.arange(12) % 2).astype(np.int32)
    images = Dataset('tiny', x, y, x, y, 2, (0.49, 0.48, 0.45), (0.25, 0.24, 0.26))
    assert with_normalization(images, 'dataset') is images
    want = x.astype(np.float64) / 127.5 - 1.0
    np.testing.assert_allclose(with_normalization(images, 'half').normalize(x), want, atol=1e-6)
    overrides = ['method_name=fedavg', 'model.name=mlp', 'partition.scheme=iid', 'partition.num_clients=2',
                 'partition.min_size=1', 'train.batch_size=8']
    for how, expected in (('half', want), ('dataset', (x / 255.0 - np.array(images.mean)) / np.array(images.std))):
        exp = build_experiment(validate(config_lib.build(overrides=[*overrides, f'data.normalization={how}'])), dataset=images)
        np.testing.assert_allclose(np.asarray(exp.engine.method.setup.normalize(x)), expected, atol=1e-5)
    features = Dataset('feat', x.reshape(12, -1).astype(np.float32), y, x.reshape(12, -1).astype(np.float32), y,
                       2, (0.0,), (1.0,))
    with pytest.raises(UserError, match='applies to image datasets'):
        with_normalization(features, 'half')
    with pytest.raises(UserError, match='data.normalization must be one of: dataset, half'):
        build_experiment(validate(config_lib.build(overrides=[*overrides, 'data.normalization=quarter'])), dataset=images)


# ------------------------------------------------------ tfds, registry, Dataset

def test_tfds_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
    with pytest.raises(UserError, match=r'pip install "fedjax_pfl\[tfds\]"'):
        registry.load_dataset('mnist', source='tfds')
    with pytest.raises(UserError, match=r'pip install "fedjax_pfl\[tfds\]"'):
        tfds_source.load_tfds('fashion_mnist')
    with pytest.raises(UserError, match='not available from TFDS'):
        registry.load_dataset('pathmnist', source='tfds')


def test_tfds_source_converts_to_dataset(monkeypatch):
    """A stand-in tensorflow_datasets module: the arrays come back as a Dataset."""
    rng = np.random.default_rng(0)
    calls = []

    def load(name, split, batch_size, data_dir, download):
        calls.append((name, split, batch_size, data_dir, download))
        if name == 'cifar100':
            raise AssertionError('Dataset cifar100: could not find data in /tfds')
        return [{'image': rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
                 'label': rng.integers(0, 10, n)} for n in (12, 4)]

    stub = type(sys)('tensorflow_datasets')
    stub.load, stub.as_numpy = load, lambda splits: splits
    monkeypatch.setitem(sys.modules, 'tensorflow_datasets', stub)
    ds = registry.load_dataset('fashion_mnist', source='tfds', data_dir='/tfds')
    assert calls[0] == ('fashion_mnist', ['train', 'test'], -1, '/tfds', False)
    assert ds.name == 'fmnist' and ds.x_train.shape == (12, 28, 28, 1)
    assert ds.y_test.dtype == np.int32 and ds.mean == idx.FASHION_MNIST_MEAN
    with pytest.raises(DataNotFoundError, match='allow_download'):
        tfds_source.load_tfds('cifar100', data_dir='/tfds')


def test_registry_names_and_errors():
    assert registry.dataset_names() == ('mnist', 'fmnist', 'cifar10', 'cifar10_jpeg',
                                        'cifar100', 'pathmnist', 'synthetic', 'pfllib')
    assert registry.canonical_name('fashion_mnist') == 'fmnist'
    with pytest.raises(UserError) as err:
        registry.load_dataset('imagenet')
    for name in registry.dataset_names():
        assert name in str(err.value)
    with pytest.raises(UserError, match='takes no option'):
        registry.load_dataset('synthetic', alhpa=0.1)
    with pytest.raises(UserError, match='source'):
        registry.load_dataset('mnist', source='web')


def test_dataset_validation_and_normalize():
    x = np.full((4, 2, 2, 3), 255, np.uint8)
    y = np.arange(4, dtype=np.int32)
    ds = Dataset('t', x, y, x[:2], y[:2], 4, (0.5, 0.5, 0.5), (0.25, 0.5, 1.0))
    assert ds.is_image and ds.input_shape == (2, 2, 3)
    np.testing.assert_allclose(ds.normalize(x[:1])[0, 0, 0], [2.0, 1.0, 0.5])
    with pytest.raises(ValueError, match='y_train'):
        Dataset('t', x, y.astype(np.int64), x, y, 4, (0.5,) * 3, (1.0,) * 3)
    with pytest.raises(ValueError, match='labels outside'):
        Dataset('t', x, y, x, y, 3, (0.5,) * 3, (1.0,) * 3)
    with pytest.raises(ValueError, match='mean/std'):
        Dataset('t', x, y, x, y, 4, (0.5,), (1.0,))
    with pytest.raises(ValueError, match='x_train'):
        Dataset('t', x.astype(np.float64), y, x, y, 4, (0.5,) * 3, (1.0,) * 3)
