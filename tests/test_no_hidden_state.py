"""No module of the package keeps state in a module global that code reads while it is traced.

A traced loop that asks a global how to run (a runner, a reporter, a listener)
gives a compiled program that depends on what was in force when it was
traced, not on its arguments. What a traced function needs to know is passed
to it (kernels/counted_loop.py `Loops`, engine/round_progress.py `Progress`).
The scan below reads every module of the layers whose code is traced (the
engine, methods, kernels, models, the public faces, core) with `ast` and
fails on a ``global`` statement or on a module-level mutable container (list,
dict, set) that the module changes after import; a planted module shows that
the scan finds both. (Host-side layers keep such state where no trace reads
it: files read, the terminal's progress display.)
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fedjax_pfl"
TRACED = ["engine", "methods", "kernels", "models", "core", "losses.py", "aggregation.py"]
# host-side state in a traced layer, never read by traced code
HOST_SIDE = {"methods/__init__.py": "the registry of methods, filled when they are found, read when a run is built"}
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add", "discard",
            "popitem", "sort", "reverse"}
CONTAINERS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def _mutable_globals(tree: ast.Module) -> set[str]:
    """Names bound at module level to a mutable container (a literal, a comprehension, or list()/dict()/set())."""
    names = set()
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        made = isinstance(value, CONTAINERS) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in ("list", "dict", "set", "defaultdict", "OrderedDict"))
        names |= {t.id for t in targets if made and isinstance(t, ast.Name)}
    return names


def hidden_state(source: str) -> list[str]:
    """Where ``source`` (a module) keeps state in a global: its ``global`` statements, and each change of a
    module-level mutable container (a mutating method called on it, an item set or deleted), in source order."""
    tree = ast.parse(source)
    names = _mutable_globals(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append((node.lineno, f"global {', '.join(node.names)}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
              and isinstance(node.func.value, ast.Name) and node.func.value.id in names):
            found.append((node.lineno, f"{node.func.value.id}.{node.func.attr}(...)"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for target in getattr(node, "targets", None) or [getattr(node, "target", None)]:
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                        and target.value.id in names):
                    found.append((node.lineno, f"{target.value.id}[...] changed"))
    return [f"line {line}: {text}" for line, text in sorted(found)]


def test_no_traced_module_keeps_state_in_a_global():
    paths = [path for part in TRACED
             for path in ([PACKAGE / part] if part.endswith(".py") else (PACKAGE / part).rglob("*.py"))]
    assert len(paths) > 60 and PACKAGE / "kernels" / "counted_loop.py" in paths
    found = {name: hidden for path in sorted(paths)
             if (name := str(path.relative_to(PACKAGE))) not in HOST_SIDE and (hidden := hidden_state(path.read_text()))}
    assert found == {}


def test_the_scan_finds_a_planted_runner_list_and_a_global_statement():
    planted = '''
_runners = []
_listener = None
TABLE = {"cpu": 8}


def runner(run):
    _runners.append(run)


def listening(listener):
    global _listener
    _listener = listener


def counted_loop(body, count, init):
    run = _runners[-1] if _runners else None
    return TABLE["cpu"]
'''
    assert hidden_state(planted) == ["line 8: _runners.append(...)", "line 12: global _listener"]
    assert hidden_state("CACHE = {}\ndef put(k, v):\n    CACHE[k] = v\n") == ["line 3: CACHE[...] changed"]
