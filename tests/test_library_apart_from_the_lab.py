"""The library holds no lab: nothing under fedjax_pfl/ plans device leases or shuttles their records.

What plans a table's runs for a time budget (``reproduce --plan-for-seconds``)
is the library's; packing a lent machine's records and landing them here is
the lab's (tools/run_records.py, benchmarks/lease.sh), which imports the
library and is imported by none of it.
"""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedjax_pfl"
LEASE = re.compile(r"\blease", re.IGNORECASE)  # lease, leases, lease_plan ...; not release or please


def test_no_module_name_docstring_or_file_name_of_the_package_mentions_a_lease():
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}" for p in sorted(PACKAGE.rglob("*"))
             if p.is_file() and p.suffix in (".py", ".json", ".yaml", ".md", ".txt")
             for i, line in enumerate(p.read_text().splitlines(), 1) if LEASE.search(line)]
    found += [str(p) for p in PACKAGE.rglob("*") if LEASE.search(p.name)]
    assert not found, "\n".join(found)


def test_no_module_of_the_package_imports_the_lab():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(PACKAGE.parent)}: {n}" for n in names
                      if n.split(".")[0] in ("tools", "benchmarks")]
    assert not found, found
