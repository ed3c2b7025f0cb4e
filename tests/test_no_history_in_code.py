"""Code, configs and tests say what they do, not their history.

No commit hashes, issue numbers or days' dates anywhere under fedjax_pfl/, configs/ and tests/; no
measured timings (milliseconds, minutes, hours, seconds set against seconds) and no "(was X)" / "was X, now
Y" / "an earlier version" narration in their prose: the comments and docstrings of the Python files, every
line of the YAML files (quoted example values aside). Those facts belong in commit messages, the
reproductions' notes (reproductions/) and benchmarks/RESULTS.md.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("fedjax_pfl", "configs", "tests")
THIS_FILE = Path(__file__).resolve()  # it plants history words to show the scanner finds them

HEX_WORD = re.compile(r"\b[0-9a-f]{7,12}\b")
ISSUE = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)
MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
# a day's date (ISO, "Nov 29, 2026", "29 November 2026"); a month and year alone dates papers and releases
DATE = re.compile(rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b{MONTH} [0-3]?\d, (?:19|20)\d\d\b"
                  rf"|\b[0-3]?\d {MONTH} (?:19|20)\d\d\b")
UNIT = r"(?:ms|milliseconds?|us|µs|microseconds?|min|minutes?|h|hours?)"
SECONDS = r"\d+(?:\.\d+)? ?(?:s|seconds?)\b"
TIMING = re.compile(rf"\b\d+(?:\.\d+)?[ -]?{UNIT}\b"  # any number of (milli/micro)seconds' kin, minutes, hours
                    rf"|\b\d+-seconds?\b"  # "an 82-second run"
                    rf"|\b{SECONDS}(?=[^.;]{{0,30}}(?:\bagainst\b|\bvs\b|->))"  # "0.47 s a round against 0.36"
                    rf"|(?:\bagainst|\bvs\.?|->) ?{SECONDS}")  # "1.27 vs 1.43 s", "112 s -> 86 s"
WAS = re.compile(r"\(was \d[\d.]*|\bwas [^,;()]{1,40}, now\b|\bearlier version", re.IGNORECASE)
QUOTED = re.compile(r"`[^`]*`|\"[^\"]*\"|(?<!\w)'[^'\n]*'(?!\w)")  # code and example values, not narration


def history_words(text: str) -> list[str]:
    """Commit-hash-like words (7-12 hex characters with both letters and digits), "issue N" mentions and
    dates: history wherever it is written."""
    hashes = [w for w in HEX_WORD.findall(text) if re.search("[a-f]", w) and re.search("[0-9]", w)]
    return hashes + ISSUE.findall(text) + DATE.findall(text)


def narration(text: str) -> list[str]:
    """Measured timings and "was X, now Y" in prose, outside quotes (a quoted '4.5 s' is an example value)."""
    text = QUOTED.sub(" ", text)
    return [m.group(0) for m in TIMING.finditer(text)] + [m.group(0) for m in WAS.finditer(text)]


def prose_lines(path: Path) -> dict[int, str]:
    """Line number -> the prose on it: a Python file's comments and docstrings, a YAML file's every line."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return dict(enumerate(text.splitlines(), 1))
    lines: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            lines[token.start[0]] = lines.get(token.start[0], "") + " " + token.string
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            first = body[0].value.lineno
            for n, line in enumerate(body[0].value.value.splitlines()):
                lines[first + n] = lines.get(first + n, "") + " " + line
    return lines


def findings(path: Path, root: Path = ROOT) -> list[str]:
    """'path:line: word' for each history word on any line and each narration in the prose of ``path``."""
    name = path.relative_to(root).as_posix()
    text = path.read_text(encoding="utf-8").splitlines()
    out = [f"{name}:{n}: {w}" for n, line in enumerate(text, 1) for w in history_words(line)]
    out += [f"{name}:{n}: {w}" for n, line in sorted(prose_lines(path).items()) for w in narration(line)]
    return out


def scanned_files() -> list[Path]:
    """The Python and YAML files under `SCANNED` (this file plants history words on purpose: left out)."""
    return [p for d in SCANNED for p in sorted((ROOT / d).rglob("*"))
            if p.suffix in (".py", ".yaml", ".yml") and p.is_file() and p.resolve() != THIS_FILE]




def test_the_scanner_finds_hashes_issues_dates_timings_and_narration():
    assert history_words("fixed in 4e8bfc4 (issue 25); sha 0123456789abcdef0123 is a checksum") == \
        ["4e8bfc4", "issue 25"]
    assert history_words("deadline 2026 and facade and 1234567, ICLR 2023") == []
    assert history_words("ran on 2026-11-29, again on Nov 30, 2026 and on 1 December 2026") == \
        ["2026-11-29", "Nov 30, 2026", "1 December 2026"]
    assert history_words("a PFLlib fork (April 2024); the paper (ICLR 2023)") == []
    assert narration("7.7 ms as a convolution, 28.1 minutes beside a 5-minute check and an 82-second test, 1 h") \
        == ["7.7 ms", "28.1 minutes", "5-minute", "82-second", "1 h"]
    assert narration("0.47 s a round against 0.36; 1.27 vs 1.43 s; 112 s -> 86 s") == \
        ["0.47 s", "vs 1.43 s", "112 s", "-> 86 s"]
    assert narration("91.54 (was 90.89); was 40.12, now 91.95; an earlier version ran fedamp") == \
        ["(was 90.89", "was 40.12, now", "earlier version"]
    assert narration("every 5 s in a log; 0.25 s a round makes 2 s; E = 5, B = 32, 10 rounds; the authors' rule") \
        == []
    assert narration("in words: '4.5 s', '1 h 40 min'; `--budget 600 s`; the client's 3 ms step") == ["3 ms"]


def test_the_scan_reads_prose_only_for_narration(tmp_path):
    """A timing in a code string (a setting, an expected output) is code's; in a comment or docstring it is not."""
    planted = tmp_path / "fedjax_pfl" / "planted.py"
    planted.parent.mkdir()
    planted.write_text('"""Module (7.7 ms a step)."""\n\nLIMIT = "12.5 s"  # 2.5 ms\n\n\ndef f():\n'
                       '    """Was 3 ms on 2026-11-29 at 2c89459."""\n    return "1.5 s"\n', encoding="utf-8")
    assert findings(planted, tmp_path) == [  # hashes and dates on any line, timings in prose only
        "fedjax_pfl/planted.py:7: 2c89459", "fedjax_pfl/planted.py:7: 2026-11-29",
        "fedjax_pfl/planted.py:1: 7.7 ms", "fedjax_pfl/planted.py:3: 2.5 ms", "fedjax_pfl/planted.py:7: 3 ms"]


def test_every_scanned_folder_holds_files():
    names = {p.relative_to(ROOT).parts[0] for p in scanned_files()}
    assert names == set(SCANNED) and any(p.suffix == ".yaml" for p in scanned_files())


def test_no_history_in_code_configs_or_tests():
    found = [f for p in scanned_files() for f in findings(p)]
    assert not found, ("history in code, configs or tests (move it to reproductions/ notes or "
                       "benchmarks/RESULTS.md, and state the contract):\n" + "\n".join(found))
