"""Methods, one small module each, and the registry by name.

Every module in this package that defines a `Method` subclass with a ``name``
is registered automatically, so adding a method is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods.base import Method

_INFRASTRUCTURE = {"anchored", "base", "finetune", "options", "shared_body", "step_counted"}


def _discover() -> dict[str, type[Method]]:
    found: dict[str, type[Method]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _INFRASTRUCTURE:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Method) and obj.name and obj.__module__ == module.__name__:
                if obj.name in found and found[obj.name] is not obj:
                    raise RuntimeError(f"two methods named {obj.name!r}")
                found[obj.name] = obj
    return dict(sorted(found.items()))


def registry() -> dict[str, type[Method]]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


_REGISTRY: dict[str, type[Method]] | None = None


def method_names() -> list[str]:
    return list(registry())


def get_method(name: str) -> type[Method]:
    methods = registry()
    if name not in methods:
        raise UserError(f"unknown method {name!r}; choose one of: {', '.join(methods)}")
    return methods[name]
