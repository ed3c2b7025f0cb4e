"""Finding, checking and downloading dataset files; atomic writes into the cache.

Search order for a file (each root is tried as ``root/<subdir>/`` then ``root/``):
  1. the ``data_dir`` argument (the command line's --data-dir),
  2. the environment variable FEDJAX_PFL_DATA_DIR,
  3. the user cache: FEDJAX_PFL_CACHE_DIR, else $XDG_CACHE_HOME/fedjax_pfl,
     else ~/.cache/fedjax_pfl (downloads and decoded caches go here),
  4. extra folders a loader names (e.g. Debian's /usr/share/datasets/...).
The first file found must match its published checksums (md5, and sha256 where
known), else `UserError`. A .gz whose bytes differ but whose decompressed
content matches `DataFile.content_md5` is accepted: Debian re-gzips the
Fashion-MNIST files, so only the decompressed content can be checked there.
Missing and not allowed to download (or the download failed, e.g. offline):
`DataNotFoundError` naming the file, every folder searched and how to supply it. Downloads go to a temporary file in the
cache folder, are verified, then renamed into place; a bad download leaves
nothing behind, not even the folders it created. `recording_reads` collects
the paths `find_file` returns, so a run can record the files it actually read. FEDJAX_PFL_DOWNLOAD_BASE_URL (or ``base_url``) replaces the
canonical URL's folder, for mirrors and for tests with a local server.
This file knows no dataset formats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from fedjax_pfl.core.errors import DataNotFoundError, UserError
from fedjax_pfl.core.folders import make_folders

ENV_DATA_DIR = 'FEDJAX_PFL_DATA_DIR'
ENV_CACHE_DIR = 'FEDJAX_PFL_CACHE_DIR'
ENV_BASE_URL = 'FEDJAX_PFL_DOWNLOAD_BASE_URL'
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class DataFile:
    """A published file: its name, checksums and canonical download URL.

    `url` is None when the file has no public source (project-local copies).
    `content_md5` is the md5 of a .gz file's decompressed bytes.
    """

    name: str
    md5: str
    url: str | None = None
    sha256: str | None = None
    content_md5: str | None = None


def cache_dir() -> Path:
    """The user cache folder for downloads and decoded arrays (may not exist yet)."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR]).expanduser()
    base = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
    return Path(base).expanduser() / 'fedjax_pfl'


def search_folders(subdir: str, data_dir: str | os.PathLike | None = None,
                   extra_dirs: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """Every folder searched for a file of dataset `subdir`, in order."""
    roots = [data_dir, os.environ.get(ENV_DATA_DIR) or None, cache_dir()]
    folders = []
    for root in roots:
        if root is not None:
            root = Path(root).expanduser()
            folders += [root / subdir, root]
    folders += [Path(d).expanduser() for d in extra_dirs]
    return list(dict.fromkeys(folders))


def file_digest(path: str | os.PathLike, algorithm: str = 'md5') -> str:
    """Hex digest of a file's bytes."""
    with open(path, 'rb') as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def gzip_content_md5(path: str | os.PathLike) -> str:
    """Md5 of a .gz file's decompressed content."""
    h = hashlib.md5()
    with gzip.open(path, 'rb') as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


_verified: set[tuple[str, int, int, DataFile]] = set()


def _checksum_problem(path: Path, spec: DataFile) -> str | None:
    """None when `path` matches `spec`, else what is wrong with it."""
    got = file_digest(path, 'md5')
    if got == spec.md5:
        if spec.sha256 and (got256 := file_digest(path, 'sha256')) != spec.sha256:
            return f'sha256 {got256}, expected {spec.sha256}'
        return None
    if spec.content_md5 and path.name.endswith('.gz'):
        try:
            content = gzip_content_md5(path)
        except (OSError, EOFError, zlib.error) as e:  # truncated, or damaged inside (a flipped byte)
            return f'md5 {got}, expected {spec.md5}; not a readable gzip file ({e})'
        if content == spec.content_md5:
            return None
        return (f'md5 {got}, expected {spec.md5}; decompressed md5 {content}, '
                f'expected {spec.content_md5}')
    return f'md5 {got}, expected {spec.md5}'


def verify_file(path: str | os.PathLike, spec: DataFile) -> Path:
    """Checks `path` against `spec`'s checksums (cached per path, size and mtime).

    Raises UserError on a mismatch, naming the file and what to do.
    """
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, spec)
    if key in _verified:
        return path
    problem = _checksum_problem(path, spec)
    if problem:
        raise UserError(
            f'{path} does not match the published checksum of {spec.name} '
            f'({problem}): it is corrupt, truncated or another version. '
            f'Delete it and supply the original file'
            + (f' (from {spec.url})' if spec.url else '') + '.')
    _verified.add(key)
    return path


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `dest`; renames it to `dest` on success.

    On any exception the temporary file is deleted, `dest` is untouched and
    the folders created for it are removed again (when still empty).
    """
    dest = Path(dest)
    created = make_folders(dest.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f'.{dest.name}.', suffix='.part', dir=dest.parent)
        os.close(fd)
        tmp = Path(tmp)
        try:
            yield tmp
            tmp.chmod(0o644)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except BaseException:
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def save_npz_atomic(dest: str | os.PathLike, arrays: dict[str, np.ndarray]) -> Path:
    """Writes an uncompressed .npz atomically (readers never see half a file)."""
    with atomic_path(dest) as tmp:
        with open(tmp, 'wb') as f:
            np.savez(f, **arrays)
    return Path(dest)


def download_url(spec: DataFile, base_url: str | None = None) -> str | None:
    """The URL to fetch `spec` from: `base_url`/name, the env mirror, or its own URL."""
    base = base_url or os.environ.get(ENV_BASE_URL)
    if base:
        return base.rstrip('/') + '/' + spec.name
    return spec.url


class DownloadFailed(UserError):
    """The server could not be reached or failed; ``reason`` says so in a few words."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def download(spec: DataFile, dest: str | os.PathLike, *, base_url: str | None = None,
             progress: bool = True, timeout: float = 60.0) -> Path:
    """Downloads `spec` to `dest` with a progress bar, verifying it before the rename.

    Raises UserError when the download fails or the checksum does not match;
    then nothing is left at `dest` or beside it.
    """
    url = download_url(spec, base_url)
    if url is None:
        raise DataNotFoundError(f'{spec.name} has no public download source.')
    dest = Path(dest)
    from tqdm import tqdm  # here, not at the top: reading files needs no tqdm (the GPU machine has none)

    try:
        with atomic_path(dest) as tmp:
            request = urllib.request.Request(url, headers={'User-Agent': 'fedjax_pfl'})
            with urllib.request.urlopen(request, timeout=timeout) as response, \
                    open(tmp, 'wb') as f:
                total = int(response.headers.get('Content-Length') or 0) or None
                with tqdm(total=total, unit='B', unit_scale=True, unit_divisor=1024,
                          desc=f'Downloading {spec.name}', disable=not progress) as bar:
                    while chunk := response.read(_CHUNK):
                        f.write(chunk)
                        bar.update(len(chunk))
            problem = _checksum_problem(tmp, spec)
            if problem:
                raise UserError(
                    f'The download of {spec.name} from {url} does not match its '
                    f'published checksum ({problem}); nothing was saved. Try again '
                    f'later, or download it by hand into {dest.parent}.')
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise DownloadFailed(
            f'Could not download {spec.name} from {url} ({e}). Download it by hand '
            f'into {dest.parent}, or pass --data-dir / set {ENV_DATA_DIR} to a folder '
            f'that holds it.', reason=f'downloading it from {url} failed ({e})') from e
    return dest



_reads: list[list[Path]] = []


@contextlib.contextmanager
def recording_reads() -> Iterator[list[Path]]:
    """Yields a list that collects every path `find_file` returns while active."""
    found: list[Path] = []
    _reads.append(found)
    try:
        yield found
    finally:
        _reads.remove(found)


def find_file(spec: DataFile, subdir: str, **kwargs) -> Path:
    """Finds, verifies or downloads one dataset file; returns its path.

    `subdir` is the dataset's folder name under each root (e.g. 'mnist').
    `extracted` names a folder that may stand in for the archive (its unpacked
    contents, e.g. 'cifar-10-batches-py'); it is returned unchecked when found.
    Keywords: data_dir, extra_dirs, allow_download, base_url, extracted, progress.
    """
    path = _find_file(spec, subdir, **kwargs)
    for found in _reads:
        found.append(path)
    return path


def locate(spec: DataFile, subdir: str, data_dir: str | os.PathLike | None = None,
           extra_dirs: Sequence[str | os.PathLike] = (), extracted: str | None = None) -> Path | None:
    """Where `find_file` would read `spec` from without downloading (unchecked), or None: the first of the
    search folders holding the file (or its `extracted` folder)."""
    for folder in search_folders(subdir, data_dir, extra_dirs):
        if extracted and (folder / extracted).is_dir():
            return folder / extracted
        if (folder / spec.name).is_file():
            return folder / spec.name
    return None


def _find_file(spec: DataFile, subdir: str, *, data_dir: str | os.PathLike | None = None,
               extra_dirs: Sequence[str | os.PathLike] = (), allow_download: bool = False,
               base_url: str | None = None, extracted: str | None = None,
               progress: bool = True) -> Path:
    folders = search_folders(subdir, data_dir, extra_dirs)
    found = locate(spec, subdir, data_dir, extra_dirs, extracted)
    if found is not None:
        return found if found.is_dir() else verify_file(found, spec)
    url = download_url(spec, base_url)
    failed = None
    if allow_download and url:
        try:
            return download(spec, cache_dir() / subdir / spec.name, base_url=base_url,
                            progress=progress)
        except DownloadFailed as e:  # offline: say where it was looked for, as without download
            failed = e.reason
    wanted = spec.name + (f' (or its extracted folder {extracted}/)' if extracted else '')
    env = os.environ.get(ENV_DATA_DIR)
    searched = ', '.join(str(f) for f in folders)
    env_note = f'{ENV_DATA_DIR}={env}' if env else f'{ENV_DATA_DIR} is not set'
    message = (f'Dataset file {wanted} not found; searched: {searched} ({env_note})'
               + (f'; {failed}' if failed else '') + '. '
               f'Supply it: put it in DIR/{subdir}/ (or DIR itself) and pass --data-dir DIR'
               + ('' if env else f' or set {ENV_DATA_DIR}=DIR'))
    if failed:
        message += '.'
    elif url and data_dir:  # the training command reads only that folder: it downloads without --data-dir
        message += (f', or allow downloading it from {url} (allow_download=True; the training command '
                    f'downloads with --download and without --data-dir).')
    elif url:
        message += (f', or allow downloading it from {url} (allow_download=True; '
                    f'on the command line, --download).')
    else:
        message += ('. It has no public download source: copy it from the project\'s '
                    'shared data folder.')
    raise DataNotFoundError(message)
