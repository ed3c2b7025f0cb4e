"""An exclusive lock on an output folder while a command writes it: a second writer is refused at once.

`locked(folder)` makes the folder if needed, opens `LOCK_FILE` in it and
takes an exclusive ``fcntl.flock`` without waiting; when another process
holds it, a one-line `UserError` names that process. The kernel releases a
flock when its process ends, however it ends (kill -9 included), so a lock
file left behind by a killed run never blocks the next one: it is merely
locked again. On release the lock file is removed while still held, after
checking it is still the file this process locked (a process that opened it
in between finds it gone and locks the new one instead); the folders the
lock made are removed too when nothing else was written into them, so a
command refused before writing anything (bad data, a second writer) leaves
no folder behind. Where ``fcntl`` does not exist (Windows) nothing is locked.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Iterator

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.core.folders import make_folders

try:
    import fcntl
except ImportError:  # pragma: no cover (not POSIX)
    fcntl = None

LOCK_FILE = ".fedjax_pfl.lock"  # holds "<pid> <host>" of the process writing the folder
ATTEMPTS = 5  # opens of a lock file that its holder removed meanwhile, before giving up


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says: 'process 123 on host', or '' when it says nothing."""
    try:
        pid, _, host = os.pread(fd, 200, 0).decode(errors="replace").strip().partition(" ")
    except OSError:
        return ""
    return f" (process {pid}{' on ' + host if host else ''})" if pid.isdigit() else ""


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _acquire(folder: Path, flag: str) -> tuple[int, list[Path]]:
    """(the open, locked lock file, the folders made for it); UserError when another process holds it."""
    path, made = folder / LOCK_FILE, []
    for _ in range(ATTEMPTS):
        made += make_folders(folder)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # its holder removed the folder it had made: make it again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(f"{flag} {folder} is being written by another run{holder}; wait until it ends, or "
                            f"choose another {flag}") from None
        if _same_file(path, fd):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            return fd, made
        os.close(fd)  # its holder removed it after we opened it: lock the one there now
    raise UserError(f"could not lock {flag} {folder}: other processes keep replacing its lock file; choose another "
                    f"{flag}")


def _release(folder: Path, fd: int, made: list[Path]) -> None:
    path = folder / LOCK_FILE
    with contextlib.suppress(OSError):
        if _same_file(path, fd):
            path.unlink()
    os.close(fd)
    for made_folder in made:  # deepest first; one that holds anything stays
        try:
            made_folder.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def locked(folder: Path, flag: str = "--out") -> Iterator[None]:
    """Hold the exclusive lock of ``folder`` (made if needed) for the block; ``flag`` names it in messages."""
    if fcntl is None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        yield
        return
    folder = Path(folder)
    fd, made = _acquire(folder, flag)
    try:
        yield
    finally:
        _release(folder, fd, made)
