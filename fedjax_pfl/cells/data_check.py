"""Whether a run's dataset files can be found, before a table spends time on its cells.

`missing_data(cfg)` loads the dataset the way a run does (runs/experiment.py)
and returns a one-line reason when its files are not found (a
`DataNotFoundError`), else None. Generated data (synthetic) needs no files.
Answers are kept for the process: a table asks once per dataset and folder.
"""

from __future__ import annotations

import functools
import os

from fedjax_pfl.core.errors import DataNotFoundError
from fedjax_pfl.data import files
from fedjax_pfl.data.registry import load_dataset
from fedjax_pfl.runs import config as config_lib


def missing_data(cfg: config_lib.RunConfig) -> str | None:
    """None when ``cfg``'s dataset loads; else the file that is missing, in one short line."""
    d = cfg.data
    if d.name == "synthetic":
        return None
    return _probe(d.name, d.data_dir, d.source, d.allow_download, os.environ.get(files.ENV_DATA_DIR),
                  str(files.cache_dir()))


@functools.lru_cache(maxsize=None)
def _probe(name, data_dir, source, allow_download, env_dir, cache) -> str | None:
    # env_dir and cache are part of the key only: they change where load_dataset looks
    try:
        load_dataset(name, data_dir=data_dir, allow_download=allow_download, source=source)
    except DataNotFoundError as e:
        return str(e).split("; searched", 1)[0].strip().rstrip(".")
    return None
