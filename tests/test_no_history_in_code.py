"""The package's code and docstrings say what the code does, not its history: no commit hashes and no issue
numbers in fedjax_pfl/ (those belong in commit messages and benchmarks/RESULTS.md)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fedjax_pfl"
HEX_WORD = re.compile(r"\b[0-9a-f]{7,12}\b")
ISSUE = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)


def history_words(text: str) -> list[str]:
    """Commit-hash-like words (7-12 hex characters with both letters and digits) and "issue N" mentions."""
    hashes = [w for w in HEX_WORD.findall(text) if re.search("[a-f]", w) and re.search("[0-9]", w)]
    return hashes + ISSUE.findall(text)


def test_the_scanner_finds_a_hash_and_an_issue_number():
    assert history_words("fixed in 4e8bfc4 (issue 25); sha 0123456789abcdef0123 is a checksum") == \
        ["4e8bfc4", "issue 25"]
    assert history_words("deadline 2026 and facade and 1234567") == []


def test_no_commit_hash_or_issue_number_in_the_package():
    found = [f"{p.relative_to(PACKAGE.parent)}:{n}: {w}" for p in sorted(PACKAGE.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) for w in history_words(line)]
    assert not found, "history in the code (move it to a commit message or benchmarks/RESULTS.md):\n" + "\n".join(found)
