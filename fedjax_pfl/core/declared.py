"""Declared fields: one declaration of a setting gives its default, help, allowed values and checks.

A dataclass field declared with `declare` carries, beside its default, one
line of help and its allowed values (bounds, choices, what an empty value
means). `check_value` checks a value against the declaration with a one-line
`UserError` naming the setting; `describe` lists the declarations of a
dataclass for help texts, reference pages and records. Method options
(methods/options.py) and run settings (runs/config.py) are both declared this
way, so what a user reads cannot drift from what the code checks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing

from fedjax_pfl.core.errors import UserError

_SPEC = "fedjax_pfl.declared"


@dataclasses.dataclass(frozen=True)
class Spec:
    """What `declare` says about one field, beside its default.

    ``choices`` is a tuple, or a function returning one (for names registered
    elsewhere, looked up when checked); ``check`` is a function of the value
    that raises `UserError` for values a range or a list cannot describe;
    ``flag`` names the command-line flag that sets the field (True: the
    field's own name), if any.
    """

    help: str
    at_least: float | None = None
    more_than: float | None = None
    at_most: float | None = None
    less_than: float | None = None
    choices: tuple | typing.Callable[[], tuple] | None = None
    none: str | None = None  # what None means, when None is allowed (e.g. "train.lr")
    check: typing.Callable[[typing.Any], None] | None = None
    flag: str | bool | None = None
    allowed_text: str | typing.Callable[[], str] | None = None  # the allowed values in words (or a function
    # returning them, for a list kept elsewhere), where ``check`` decides them

    def choice_values(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices

    def allowed(self) -> str:
        """The allowed values in words, e.g. 'in [0, 1]', '> 0', 'one of: a, b'."""
        if self.allowed_text:
            return self.allowed_text() if callable(self.allowed_text) else self.allowed_text
        choices = self.choice_values()
        if choices is not None:
            return "one of: " + ", ".join(map(str, choices))
        low = (f"[{_num(self.at_least)}" if self.at_least is not None else
               f"({_num(self.more_than)}" if self.more_than is not None else None)
        high = (f"{_num(self.at_most)}]" if self.at_most is not None else
                f"{_num(self.less_than)})" if self.less_than is not None else None)
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if low[0] == "[" else "> ") + low[1:]
        if high:
            return ("<= " if high[-1] == "]" else "< ") + high[:-1]
        return ""


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def declare(default, help: str, *, at_least=None, more_than=None, at_most=None, less_than=None, choices=None,
            none: str | None = None, check=None, flag: str | bool | None = None, allowed: str | None = None,
            factory=None):
    """A dataclass field with its default (or ``factory``), one line of help and its allowed values.

    ``at_least``/``more_than`` and ``at_most``/``less_than`` bound numbers
    (inclusive/exclusive); ``choices`` lists the allowed values (or returns
    them); ``none`` says what None means where the type allows it; ``check``
    checks what the rest cannot say (``allowed`` then says it in words);
    ``flag`` gives the field a command-line flag.
    """
    if choices is not None and not callable(choices):
        choices = tuple(choices)
    spec = Spec(help, at_least, more_than, at_most, less_than, choices, none, check, flag, allowed)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={_SPEC: spec})
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def spec_of(field: dataclasses.Field) -> Spec:
    spec = field.metadata.get(_SPEC)
    if spec is None:
        raise TypeError(f"field {field.name!r} is not declared with declared.declare(...)")
    return spec


def is_declared(field: dataclasses.Field) -> bool:
    return _SPEC in field.metadata


def optional_type(annotation) -> tuple[bool, typing.Any]:
    """(whether None is allowed, the annotation without None)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return type(None) in typing.get_args(annotation), inner[0]
    return False, annotation


def check_value(where: str, value, annotation, spec: Spec) -> None:
    """UserError unless ``value`` has the field's type and lies in its declared range/choices.

    ``where`` is the setting's name as the user writes it (``method.mu``, ``train.lr``)."""
    optional, annotation = optional_type(annotation)
    if value is None:
        if optional:
            return
        raise UserError(f"{where} may not be empty")
    if typing.get_origin(annotation) is tuple:
        if not isinstance(value, tuple) or (not value and spec.none is None):
            raise UserError(f"{where} must be a non-empty list, got {value!r}")
        item = typing.get_args(annotation)[0]
        for v in value:
            check_value(where, v, item, dataclasses.replace(spec, check=None))
    elif annotation is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where} must be true or false, got {value!r}")
    elif annotation in (int, float):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or (annotation is int and int(value) != value):
            kind = "a whole number" if annotation is int else "a finite number"
            raise UserError(f"{where} must be {kind} {spec.allowed()}".rstrip() + f", got {value!r}")
        ok = ((spec.at_least is None or value >= spec.at_least) and (spec.more_than is None or value > spec.more_than)
              and (spec.at_most is None or value <= spec.at_most) and (spec.less_than is None or value < spec.less_than))
        if not ok:
            raise UserError(f"{where} must be {spec.allowed()}, got {value!r}")
    choices = spec.choice_values()
    if choices is not None and value not in choices:
        raise UserError(f"{where} must be {spec.allowed()}, got {value!r}")
    if spec.check is not None:
        spec.check(value)


_type_hints = functools.cache(typing.get_type_hints)  # per dataclass: a sweep checks one config per point


def check_fields(obj, prefix: str) -> None:
    """`check_value` for every declared field of dataclass ``obj``, named ``prefix + name``."""
    hints = _type_hints(type(obj))
    for field in dataclasses.fields(obj):
        if is_declared(field):
            check_value(prefix + field.name, getattr(obj, field.name), hints[field.name], spec_of(field))


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """One declared field as help texts, reference pages and records show it."""

    name: str
    type: str
    default: typing.Any
    help: str
    allowed: str
    spec: Spec


def type_name(annotation) -> str:
    optional, inner = optional_type(annotation)
    if typing.get_origin(inner) is tuple:
        name = f"list of {typing.get_args(inner)[0].__name__}"
    else:
        name = getattr(inner, "__name__", str(inner))
    return f"{name} or empty" if optional else name


def shown(value) -> str:
    """A value as a user writes it in YAML or on the command line: ``empty``, ``true``, ``[1, 2]``."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(shown, value)) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def default_of(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def describe(cls) -> list[FieldInfo]:
    """Every declared field of dataclass ``cls`` (None: none) with type, default, help and allowed values."""
    if cls is None:
        return []
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        if not is_declared(field):
            continue
        spec = spec_of(field)
        allowed = spec.allowed()
        if spec.none:
            allowed = f"{allowed}; empty: {spec.none}" if allowed else f"empty: {spec.none}"
        out.append(FieldInfo(field.name, type_name(hints[field.name]), default_of(field), spec.help, allowed, spec))
    return out
