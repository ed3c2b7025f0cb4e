"""One shape of a round over rows: the package holds one scan over rounds and no batched round.

Many runs train together only as federations, rows of one program (engine/rows.py); a second way (a round
vmapped over an experiment axis) or a second scan over rounds would let the two drift apart. Read from the
source (ast): every function, method and class the package defines.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fedjax_pfl"
BATCHED = {"run_rounds_batched", "compiled_round_batched", "_rounds_batched", "init_batched", "_init_batched",
           "BatchedProgram", "_stacked_data"}
SCANS_OVER_ROUNDS = {"_rounds_impl", "rounds_impl", "scan_rounds"}


def defined_names(root: Path = PACKAGE) -> list[tuple[str, str]]:
    """(module path, name) of every function, method and class defined under ``root``, and of every attribute
    assigned (``self._rounds_batched = ...``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append((str(path.relative_to(root)), node.name))
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.append((str(path.relative_to(root)), node.attr))
    return found


def test_no_batched_round_is_defined():
    assert [(where, name) for where, name in defined_names() if name in BATCHED] == []


def test_one_function_scans_over_rounds():
    scans = [(where, name) for where, name in defined_names() if name in SCANS_OVER_ROUNDS]
    assert len([name for _, name in scans if name == "_rounds_impl"]) <= 1, scans
    assert [name for _, name in scans if name != "_rounds_impl"] == ["scan_rounds"], scans


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself: a batched method, a batched jit kept on ``self`` and a second scan are found."""
    (tmp_path / "engine.py").write_text(
        "class E:\n    def run_rounds_batched(self):\n        self._rounds_batched = 1\n\ndef _rounds_impl(): ...\n")
    assert {name for _, name in defined_names(tmp_path)} == {"E", "run_rounds_batched", "_rounds_batched",
                                                             "_rounds_impl"}
