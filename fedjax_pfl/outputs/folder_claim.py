"""Claiming a run folder for one run: its lock for the whole run, what it may hold, and starting over.

`claimed(out, has_checkpoint, resume, start_over)` checks that ``out`` can be written, takes
its exclusive lock (outputs/folder_lock.py: a second process writing the same
folder is refused at once with one line) and, under the lock, what the
folder holds:

- files that no run wrote (a user's own): refused, whatever the flags, and
  left as they are;
- a run, without ``--resume``: refused, saying how to continue it or, when
  it holds no complete checkpoint, that it cannot be continued and
  ``--start-over`` starts it afresh in place: a run that finished without
  keeping checkpoints (``checkpoint_every`` 0) is named as finished, any
  other as stopped before its first checkpoint was saved (a kill during that
  save, or before it);
- with ``--resume``, a run with no complete checkpoint: refused the same way;
- with ``--start-over``: the run's own files are removed and it starts afresh.

The lock is held until the block ends, however it ends; a folder the lock
made and nothing was written into is removed again. ``has_checkpoint(out)``
says whether the folder holds a complete checkpoint (the engine's
`checkpoint.exists`: this package knows no checkpoint format).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, Iterator

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs.folder_lock import LOCK_FILE, locked
from fedjax_pfl.outputs.run_output import read_json
from fedjax_pfl.outputs.output_folder import check_not_foreign, check_writable, holds_run, is_run_entry

START_OVER = "--start-over"


def no_checkpoint_note(out: Path) -> str:
    """Why the run in ``out`` cannot be continued, and what to do, when it has no complete checkpoint: a run
    whose summary.json says it finished kept no checkpoints; any other stopped before its first was saved."""
    summary = read_json(Path(out) / "summary.json")
    if isinstance(summary, dict) and summary.get("status") == "finished":
        return (f"the run in {out} finished without keeping a checkpoint (--checkpoint-every 0), so it cannot be "
                f"continued: start it afresh in place with {START_OVER}, or choose another --out")
    return (f"the run in {out} has no complete checkpoint (it stopped before its first one was saved, or during "
            f"that save), so it cannot be continued: start it afresh in place with {START_OVER}, or choose another "
            "--out")


def check_contents(out: Path, complete: bool, resume: bool, start_over: bool) -> None:
    """UserError when ``out`` (``complete``: holding a complete checkpoint) may not take this run (see the module
    docstring)."""
    if resume and start_over:
        raise UserError(f"--resume continues the run in --out and {START_OVER} replaces it: pass one of them")
    check_not_foreign(out)
    if resume and not complete:
        raise UserError(no_checkpoint_note(out))
    if resume or start_over or not holds_run(out):
        return
    if complete:
        raise UserError(f"{out} already holds a run; continue it with --resume, start it afresh in place with "
                        f"{START_OVER}, or choose another --out")
    raise UserError(no_checkpoint_note(out))


def clear_run(out: Path) -> None:
    """Remove what a run wrote into ``out`` (all of it is the run's: `check_contents` ran), but the lock."""
    for entry in Path(out).iterdir():
        if entry.name == LOCK_FILE or not is_run_entry(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@contextlib.contextmanager
def claimed(out: Path, has_checkpoint: Callable[[Path], bool], resume: bool = False,
            start_over: bool = False) -> Iterator[None]:
    """Hold ``out`` for one run (see the module docstring)."""
    out = Path(out)
    check_writable(out)
    check_not_foreign(out)  # (before the lock file is made in it; again under the lock)
    with locked(out):
        check_contents(out, has_checkpoint(out), resume, start_over)
        if start_over:
            clear_run(out)
        yield
