"""Method options, declared once and checked one way.

A method's options are a frozen dataclass deriving from `Options`; every field
is declared with `option`, which carries its default, one line of help and its
allowed values:

    @dataclasses.dataclass(frozen=True)
    class FedProxOptions(Options):
        mu: float = option(0.01, "weight of the proximal term (mu/2) ||w - w_global||^2", at_least=0)

Building the dataclass checks every field against its declaration (type,
range, choices; one-line `UserError` naming ``method.<field>``), then calls
`Options.check` for rules between fields. `describe` lists the declarations
for ``--method M --help``, the documentation and config.json, so the three
cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing

from fedjax_pfl.core.errors import UserError

_SPEC = "fedjax_pfl.option"


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """What `option` declares about one field, beside its default."""

    help: str
    at_least: float | None = None
    more_than: float | None = None
    at_most: float | None = None
    less_than: float | None = None
    choices: tuple | None = None
    none: str | None = None  # what None means, when None is allowed (e.g. "train.lr")

    def allowed(self) -> str:
        """The allowed values in words, e.g. 'in [0, 1]', '> 0', 'one of: a, b'."""
        if self.choices is not None:
            return "one of: " + ", ".join(map(str, self.choices))
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


def option(default, help: str, *, at_least=None, more_than=None, at_most=None, less_than=None, choices=None,
           none: str | None = None):
    """A dataclass field with its default, one line of help and its allowed values.

    ``at_least``/``more_than`` and ``at_most``/``less_than`` bound numbers
    (inclusive/exclusive); ``choices`` lists the allowed values; ``none`` says
    what None means where the type allows it (``float | None``).
    """
    spec = OptionSpec(help, at_least, more_than, at_most, less_than,
                      tuple(choices) if choices is not None else None, none)
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def spec_of(field: dataclasses.Field) -> OptionSpec:
    spec = field.metadata.get(_SPEC)
    if spec is None:
        raise TypeError(f"option {field.name!r} is not declared with options.option(...)")
    return spec


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of every method's options: fields declared with `option`, checked when built."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            check_value(field.name, getattr(self, field.name), hints[field.name], spec_of(field))
        self.check()

    def check(self) -> None:
        """Rules between fields (override; raise `UserError`)."""


def _is_optional(annotation) -> tuple[bool, typing.Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return type(None) in typing.get_args(annotation), inner[0]
    return False, annotation


def check_value(name: str, value, annotation, spec: OptionSpec) -> None:
    """UserError unless ``value`` has the field's type and lies in its declared range/choices."""
    where = f"method.{name}"
    optional, annotation = _is_optional(annotation)
    if value is None:
        if optional:
            return
        raise UserError(f"{where} may not be empty")
    if typing.get_origin(annotation) is tuple:
        if not isinstance(value, tuple) or not value:
            raise UserError(f"{where} must be a non-empty list, got {value!r}")
        item = typing.get_args(annotation)[0]
        for v in value:
            check_value(name, v, item, spec)
        return
    if annotation is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where} must be true or false, got {value!r}")
        return
    if annotation in (int, float):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or (annotation is int and int(value) != value):
            kind = "a whole number" if annotation is int else "a finite number"
            raise UserError(f"{where} must be {kind} {spec.allowed()}".rstrip() + f", got {value!r}")
        ok = ((spec.at_least is None or value >= spec.at_least) and (spec.more_than is None or value > spec.more_than)
              and (spec.at_most is None or value <= spec.at_most) and (spec.less_than is None or value < spec.less_than))
        if not ok:
            raise UserError(f"{where} must be {spec.allowed()}, got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise UserError(f"{where} must be {spec.allowed()}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class OptionInfo:
    """One option as the help text, the docs and config.json show it."""

    name: str
    type: str
    default: typing.Any
    help: str
    allowed: str


def _type_name(annotation) -> str:
    optional, inner = _is_optional(annotation)
    if typing.get_origin(inner) is tuple:
        name = f"list of {typing.get_args(inner)[0].__name__}"
    else:
        name = getattr(inner, "__name__", str(inner))
    return f"{name} or empty" if optional else name


def describe(options_type) -> list[OptionInfo]:
    """Every option of ``options_type`` (None: none) with type, default, help and allowed values."""
    if options_type is None:
        return []
    hints = typing.get_type_hints(options_type)
    out = []
    for field in dataclasses.fields(options_type):
        spec = spec_of(field)
        allowed = spec.allowed()
        if spec.none:
            allowed = f"{allowed}; empty: {spec.none}" if allowed else f"empty: {spec.none}"
        out.append(OptionInfo(field.name, _type_name(hints[field.name]), field.default, spec.help, allowed))
    return out


def resolved(options) -> dict:
    """{name: value} of every option of an options instance (None: {}), for config.json."""
    if options is None:
        return {}
    return {f.name: (list(v) if isinstance(v := getattr(options, f.name), tuple) else v)
            for f in dataclasses.fields(options)}


def step_size_options(options_type) -> list[str]:
    """Names of a method's own step sizes (options named ``*_lr``, e.g. pFedMe's personal_lr): what a
    diverged run may need lowered besides train.lr."""
    if options_type is None:
        return []
    return [f.name for f in dataclasses.fields(options_type) if f.name.endswith("_lr")]
