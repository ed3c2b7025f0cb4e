"""Methods, one file each, and the registry by name.

Every module of this package that declares an `Algorithm` (methods/base.py) at
its top level is registered under the algorithm's name, so adding a method is
adding a file: the command line (``--method NAME``, ``--method NAME --help``),
the documentation pages and the README's methods table all read the
declaration.

Method files outside the package join the registry through the environment
variable ``FEDJAX_PFL_METHODS``: .py files, or folders whose .py files are
all method files, separated by ``os.pathsep`` (":" on Linux, ";" on Windows).
Each file is loaded as its own module; its names may not repeat the package's.
A run of such a method needs the variable set again to be resumed or reported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.base import Algorithm

ENV = "FEDJAX_PFL_METHODS"
EXTERNAL_PREFIX = "fedjax_pfl_external_methods."  # the module names of the files named by $FEDJAX_PFL_METHODS


def _declared(module) -> list:
    """The algorithms ``module`` declares at its top level (not those it imports)."""
    return [obj for obj in vars(module).values() if isinstance(obj, Algorithm) and obj.module == module.__name__]


def _external_files(value: str) -> list[Path]:
    files = []
    for entry in filter(None, value.split(os.pathsep)):
        path = Path(entry).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
        elif path.suffix == ".py" and path.is_file():
            files.append(path)
        else:
            raise UserError(f"{ENV} names {entry}, which is neither a .py file nor a folder; list method files "
                            f"or folders of them, separated by {os.pathsep!r}")
    return files


def _load_file(path: Path):
    name = EXTERNAL_PREFIX + path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path.resolve()):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (a dataclass looks its module up while it is made)
    spec.loader.exec_module(module)
    return module


def _discover(external: str) -> dict:
    found: dict = {}
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    packaged = len(modules)
    modules += [_load_file(path) for path in _external_files(external)]
    for index, module in enumerate(modules):
        for algorithm in _declared(module):
            other = found.get(algorithm.name)
            if other is not None and other is not algorithm:
                if index >= packaged:
                    raise UserError(f"{module.__file__} declares method {algorithm.name!r}, which is taken; "
                                    "rename it")
                raise RuntimeError(f"two methods named {algorithm.name!r}")
            found[algorithm.name] = algorithm
    return dict(sorted(found.items()))


_REGISTRY: dict[str, dict] = {}  # by the value of $FEDJAX_PFL_METHODS


def registry() -> dict:
    """{name: Algorithm} of every method, sorted by name."""
    external = os.environ.get(ENV, "")
    if external not in _REGISTRY:
        _REGISTRY[external] = _discover(external)
    return _REGISTRY[external]


def method_names() -> list[str]:
    return list(registry())


def get_method(name: str) -> Algorithm:
    """The algorithm registered as ``name``; call it with a setup and options to bind it."""
    methods = registry()
    if name not in methods:
        raise UserError(f"unknown method {name!r}; choose one of: {', '.join(methods)}")
    return methods[name]
