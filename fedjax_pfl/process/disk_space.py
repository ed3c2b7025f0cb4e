"""A write that failed because the disk (or the file-size limit) has no room: recognised however it surfaces.

Python raises `OSError` with errno ENOSPC (no space left), EDQUOT (quota
exceeded) or EFBIG (larger than the file-size limit, ``ulimit -f``);
Orbax's array writes (tensorstore) raise a ValueError whose text carries the
OS error code. `is_no_space` recognises both, and `NoSpaceError` is the
one-line error a run stops with: the folder, what it was writing, and how
to continue once space is freed.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from fedjax_pfl.core.errors import UserError

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_TEXT = re.compile(r"No space left on device|Disk quota exceeded|File too large|os_error_code='(%s)'"
                   % "|".join(str(e) for e in NO_SPACE_ERRNOS))


def is_no_space(error: BaseException | None) -> bool:
    """Whether ``error`` (or an exception it was raised from) is a write that found no room."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, NoSpaceError):
            return True
        if isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS:
            return True
        if not isinstance(error, OSError) and _TEXT.search(str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


class NoSpaceError(UserError):
    """A run (or command) stopped because the disk holding ``folder`` is full; ``kept`` says what it keeps."""

    def __init__(self, folder: Path, doing: str, kept: str = "", then: str = "continue the run with --resume"):
        super().__init__(f"no space left on the disk holding {folder} ({doing}){': ' + kept if kept else ''}; free "
                         f"space there (or raise the file-size limit, ulimit -f), then {then}")
