"""The progress bar of a run's rounds (on stderr)."""

from __future__ import annotations

import sys


def progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="rounds", unit="round", disable=not enabled, file=sys.stderr)
