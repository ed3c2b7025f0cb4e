"""The package's layers, read from its imports (ast): no circle, no upward import, no private name.

Layers, lowest first (a module may import its own folder and any lower layer):

    core -> process -> data, models, outputs -> kernels -> losses, aggregation -> methods -> engine -> runs -> commands
         -> papers -> cells -> the command modules (train, reproduce, report)

Every import counts, at module level or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fedjax_pfl"

# group -> rank; groups of one rank may not import each other
RANKS = {
    "core": 0,
    "process": 0.5,
    "data": 1, "models": 1, "outputs": 1,
    "kernels": 2,
    "losses": 3, "aggregation": 3,
    "methods": 4,
    "engine": 5,
    "runs": 6,
    "commands": 6.5,
    "papers": 7,
    "cells": 7.5,
    "train": 8, "reproduce": 8, "report": 8, "__init__": 8,
}
COMMANDS = {"__init__", "losses", "aggregation", "train", "reproduce", "report"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> list[tuple[str, str]]:
    """(imported module, imported name or '') for every fedjax_pfl import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith("fedjax_pfl")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedjax_pfl"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub, "") if sub in known else (node.module, a.name))
    return out


def private_attributes(path: Path, known: set[str]) -> list[str]:
    """``alias._name`` uses where ``alias`` is a fedjax_pfl module imported into ``path``."""
    tree = ast.parse(path.read_text())
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedjax_pfl"):
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                            if f"{node.module}.{a.name}" in known})
    return [f"{aliases[n.value.id]}.{n.attr}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases
            and n.attr.startswith("_") and not n.attr.startswith("__")]


def group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph() -> dict[str, list[tuple[str, str]]]:
    mods = modules()
    return {m: imports(p, set(mods)) for m, p in mods.items()}


def test_at_most_six_modules_stand_at_the_top():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert set(top) <= COMMANDS, f"modules directly in fedjax_pfl/ beyond the public faces and commands: {top}"
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert set(folders) <= set(RANKS), f"a folder without a layer: {folders}"


def test_every_import_runs_downward():
    upward = []
    for src, targets in graph().items():
        for target, _ in targets:
            if target == "fedjax_pfl":
                continue
            a, b = group(src), group(target)
            if a != b and RANKS[b] >= RANKS[a]:
                upward.append(f"{src} -> {target}")
    assert not upward, "imports that run up or sideways between layers:\n" + "\n".join(upward)


def test_no_module_imports_another_modules_private_names():
    mods = modules()
    private = [f"{src} imports {name} from {target}" for src, targets in graph().items()
               for target, name in targets if name.startswith("_") and target != src]
    private += [f"{src} uses {use}" for src, path in mods.items() for use in private_attributes(path, set(mods))]
    assert not private, "\n".join(private)


def test_no_import_circles():
    g = graph()
    # a module importing its own package's __init__ is not a circle of files
    edges = {src: {t for t, _ in targets if t in g and not src.startswith(t + ".")} for src, targets in g.items()}
    circles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("source, expected", [
    ("from fedjax_pfl.methods.base import _hidden\n", "private"),
    ("from fedjax_pfl.methods import base\nbase._hidden()\n", "private attribute"),
    ("from fedjax_pfl.runs import config\n", "upward"),
])
def test_the_checks_catch_a_planted_violation(tmp_path, source, expected):
    """The walkers above would see a violation: an engine-level file importing runs / a private name."""
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    found = imports(planted, set(modules()))
    if expected == "private":
        assert any(name.startswith("_") for _, name in found)
    elif expected == "private attribute":
        assert private_attributes(planted, set(modules())) == ["fedjax_pfl.methods.base._hidden"]
    else:
        (target, _), = found
        assert RANKS[group(target)] > RANKS["engine"]


def test_methods_reach_a_faces_rules_only_through_the_face():
    """A rule that losses.py or aggregation.py names has one import path: methods use the face, not kernels/."""
    from fedjax_pfl import aggregation, losses

    faces = {n: "aggregation" for n in aggregation.__all__} | {n: "losses" for n in losses.__all__}
    found = []
    for path in sorted((PACKAGE / "methods").glob("*.py")):
        tree = ast.parse(path.read_text())
        kernel_modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedjax_pfl.kernels"):
                for a in node.names:
                    if node.module == "fedjax_pfl.kernels":
                        kernel_modules.add(a.asname or a.name)
                    elif a.name in faces:
                        found.append(f"{path.name} imports {a.name} from {node.module}")
        found += [f"{path.name}:{n.lineno} uses {n.value.id}.{n.attr} (use {faces[n.attr]}.{n.attr})"
                  for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id in kernel_modules and n.attr in faces]
    assert not found, "\n".join(found)


def test_the_faces_only_name_what_kernels_define():
    """losses.py and aggregation.py define nothing of their own: every public name is a kernel's."""
    for face in ("losses", "aggregation"):
        tree = ast.parse((PACKAGE / f"{face}.py").read_text())
        own = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not own, f"{face}.py defines {own}: move them to kernels/"


def test_the_output_files_package_imports_without_jax():
    """outputs/ (run folders, metrics, tables, figures) imports with JAX unavailable, so a report can be made
    where no accelerator or training code runs."""
    import subprocess
    import sys

    names = sorted(p.stem for p in (PACKAGE / "outputs").glob("*.py") if p.stem != "__init__")
    code = ("import sys; sys.modules['jax'] = None; sys.modules['jaxlib'] = None\n"
            + "".join(f"import fedjax_pfl.outputs.{n}\n" for n in names))
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


ONE_FILE_EACH = {"methods", "kernels"}  # one file a method or a concept: as many as there are
ABOVE_THE_ENGINE = {"runs", "papers", "cells", "outputs"}


def test_no_folder_is_a_crowd():
    """At most 16 modules a folder (but methods/ and kernels/), at most 2,500 lines in a folder above the
    engine: beyond that a folder holds more than one idea."""
    crowded = []
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        files = list(folder.glob("*.py"))
        lines = sum(len(f.read_text().splitlines()) for f in files)
        if len(files) > 16 and folder.name not in ONE_FILE_EACH:
            crowded.append(f"{folder.name}/: {len(files)} modules")
        if lines > 2500 and folder.name in ABOVE_THE_ENGINE:
            crowded.append(f"{folder.name}/: {lines} lines")
    assert not crowded, "split these folders along their own groups:\n" + "\n".join(crowded)
