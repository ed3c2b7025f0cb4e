"""Method options, declared once and checked one way.

A method's options are a frozen dataclass deriving from `Options`; every field
is declared with `option` (core/declared.py), which carries its default, one
line of help and its allowed values:

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

from fedjax_pfl.core import declared

option = declared.declare
describe = declared.describe
OptionInfo = declared.FieldInfo


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of every method's options: fields declared with `option`, checked when built."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            declared.spec_of(field)  # every option is declared
        declared.check_fields(self, "method.")
        self.check()

    def check(self) -> None:
        """Rules between fields (override; raise `UserError`)."""


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
