"""The one way run outputs are written: a temporary file beside the target, fsynced, renamed over it.

Readers (a report, a person, a resumed run) never see a half-written file, and
a crash leaves either the old file or the new one. Files get the permissions
the user's umask gives a new file (as ``open`` does), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "w", newline: str | None = None):
    """Yields a file object for a temporary file beside ``path``; on success it is
    fsynced, given the umask's permissions and renamed to ``path``; on error removed.

    ``mode`` 'w' (text) or 'wb' (bytes); ``newline=''`` for the csv module.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"newline": newline})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
