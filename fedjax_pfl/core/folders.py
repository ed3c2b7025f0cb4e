"""Making a folder so that it can be unmade: `make_folders` returns the folders it created, deepest first,
for a caller that removes them again when what it meant to write there never came (a failed download, a
run refused before writing)."""

from __future__ import annotations

from pathlib import Path


def make_folders(folder: Path) -> list[Path]:
    """mkdir -p ``folder``; the folders it created, deepest first (none when it existed)."""
    folder = Path(folder)
    created = []
    while not folder.exists():
        created.append(folder)
        folder = folder.parent
    for path in reversed(created):
        path.mkdir(exist_ok=True)
    return created
