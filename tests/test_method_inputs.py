"""A method function's inputs are in its signature: no function in methods/ reads a train or data setting through
the bound method ``m`` (``m.setup.drop_last``, ``m.local.batch_size``, or a name bound to ``m.setup`` /
``m.local``); a function that reads one takes the `LocalTraining` record (methods/base.py) as an argument, which a
contract function hands on whole (``training.train(m.local, ...)``). Its options come as ``m.hparams``, the
method's own declared options."""

import ast
import dataclasses
from pathlib import Path

from fedjax_pfl.methods.base import LocalSetup, LocalTraining

METHODS = Path(__file__).resolve().parents[1] / "fedjax_pfl" / "methods"
CONTEXT = "m"  # the bound method, every method function's first argument
RECORDS = ("setup", "local")  # what of the context holds the run's settings
# the run's train and data settings a method reads (the optimizer at this round's lr is a round value, the
# loops the engine's way of running a client's loops: neither is a setting)
SETTINGS = {f.name for f in dataclasses.fields(LocalTraining)} - {"optimizer", "loops"}


def _chain(node):
    """(root name or None, attribute names from the root) of ``a.b.c``."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), names[::-1]


def _parameters(fn) -> list[str]:
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if p is not None]


def _own_nodes(fn):
    """The nodes of ``fn``'s body, not those of functions nested in it (yielded themselves, not entered)."""
    stack = list(fn.body) if isinstance(fn.body, list) else [fn.body]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _scope(fn, outer: dict) -> dict:
    """{name: 'context' | 'record'} in ``fn``: the enclosing scope's names not shadowed by a parameter, ``m`` if
    it is the first parameter, and the names ``fn`` binds to ``m`` itself or to ``m.setup`` / ``m.local``."""
    params = _parameters(fn)
    bound = {k: v for k, v in outer.items() if k not in params}
    if params and params[0] == CONTEXT:
        bound[CONTEXT] = "context"
    for node in _own_nodes(fn):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts))
            for name, value in pairs:
                if not isinstance(name, ast.Name):
                    continue
                root, chain = _chain(value)
                kind = bound.get(root)
                if kind == "context" and chain in ([], *([r] for r in RECORDS)):
                    bound[name.id] = "record" if chain else "context"
                elif kind == "record" and not chain:
                    bound[name.id] = "record"
                else:
                    bound.pop(name.id, None)
    return bound


def context_reads(source: str) -> list[str]:
    """'line: expression' for every read of a train or data setting through the context in ``source``."""
    found = []

    def visit(fn, outer):
        bound, inner = _scope(fn, outer), set()
        for node in _own_nodes(fn):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(node, bound)
            elif isinstance(node, ast.Attribute) and id(node) not in inner:  # a whole chain a.b.c, once
                inner.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Attribute))
                root, chain = _chain(node)
                kind = bound.get(root)
                through = (kind == "context" and (chain[0] == "setup" or chain[0] in SETTINGS
                                                  or chain[0] == "local" and chain[1:2] and chain[1] in SETTINGS)
                           or kind == "record" and chain[0] in SETTINGS)
                if through:
                    found.append(f"{node.lineno}: {ast.unparse(node)}")

    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            visit(node, {})
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(item, {})
    return sorted(found, key=lambda hit: (int(hit.split(":")[0]), hit))


def test_no_method_function_reads_a_setting_through_its_context():
    found = {p.name: hits for p in sorted(METHODS.glob("*.py")) if p.name != "base.py"
             if (hits := context_reads(p.read_text()))}
    assert found == {}


def test_the_scan_finds_planted_reads():
    planted = (
        "def align(m, old, variables, data, key):\n"
        "    hp, s = m.hparams, m.setup\n"               # 2: the setup through the context, as an alias ...
        "    batch = s.batch_size\n"                      # 3: ... read
        "    return m.local.drop_last, m.setup\n"         # 4: two reads through the context
        "def client_update(m, server, client, data, key, info):\n"
        "    local = m.local\n"
        "    def inner(x):\n"
        "        return local.normalize(x)\n"             # 8: an alias read inside a nested function
        "    return train(local, inner)\n"                # passing the record whole: fine
    )
    assert context_reads(planted) == ["2: m.setup", "3: s.batch_size", "4: m.local.drop_last", "4: m.setup",
                                      "8: local.normalize"]


def test_the_scan_lets_a_given_record_and_the_options_be_read():
    clean = (
        "def client_update(m, server, client, data, key, info):\n"
        "    local = m.local\n"
        "    return class_sums(m, local, data), m.hparams.local_steps, m.model.num_classes\n"
        "def class_sums(m, local, data):\n"            # another function's parameter named like the alias
        "    return sum_batches(data, local.batch_size, local.normalize)\n"
        "def steps(options, local_epochs):\n"
        "    return options.local_steps or local_epochs\n"
    )
    assert context_reads(clean) == []


def test_the_record_holds_what_the_setup_gives_it():
    """`Method.local` copies each of these from the run's `LocalSetup` (runs/experiment.py builds that from the
    declared settings): a field added to one must be in the other."""
    assert SETTINGS <= {f.name for f in dataclasses.fields(LocalSetup)}
