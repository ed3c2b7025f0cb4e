"""A method rebuilt with some of its scalars replaced by traced values.

A run's learning rate and a method's float options are Python numbers that the
compiled round bakes in. To run several values in one program (a grid on a
vmapped experiment axis) or to change the learning rate by round
(lr_schedule.py), the engine rebuilds the method inside the trace with those
scalars replaced by traced arrays: `with_values(method, {"lr": x, "mu": y})`.
Names are ``lr`` (``train.lr``) and the float fields of the method's options
dataclass. The options dataclass is copied field for field without its
``__post_init__`` checks (they need concrete numbers: check the concrete values
with `check_options` first). A method that chooses code by such a value in
Python cannot trace it; `with_values` then raises a `UserError` naming it.
"""

from __future__ import annotations

import copy
import dataclasses
import typing

import jax

from fedjax_pfl.core.errors import UserError

LR = "lr"
INITIAL_LR = "initial_lr"  # train.lr before the schedule's factor (set with LR by `Engine.method_at`)


def traceable_names(algorithm) -> tuple[str, ...]:
    """``lr`` and the float options of ``algorithm`` (the scalars a grid may vary in one program)."""
    options = algorithm.hparams_type
    if options is None:
        return (LR,)
    hints = typing.get_type_hints(options)
    floats = [f.name for f in dataclasses.fields(options) if hints[f.name] in (float, typing.Optional[float])]
    return (LR, *floats)


def _replace_unchecked(options, values: dict):
    """A copy of the frozen options dataclass with ``values`` set, skipping ``__post_init__``."""
    out = copy.copy(options)
    for name, value in values.items():
        object.__setattr__(out, name, value)
    return out


def with_values(method, values: dict):
    """``method`` rebuilt with ``values`` (name -> scalar, traced or not) in place of its own."""
    if not values:
        return method
    unknown = set(values) - set(traceable_names(method.algorithm)) - {INITIAL_LR}
    if unknown:
        raise UserError(f"method {method.name!r} cannot vary {', '.join(sorted(unknown))} in one program; "
                        f"it can vary: {', '.join(traceable_names(method.algorithm))}")
    setup = method.setup
    if LR in values:
        lr = values[LR]
        setup = dataclasses.replace(setup, optimizer=setup.make_optimizer(lr=lr), learning_rate=lr,
                                    initial_learning_rate=values.get(INITIAL_LR, lr))
    options = {k: v for k, v in values.items() if k not in (LR, INITIAL_LR)}
    hparams = _replace_unchecked(method.hparams, options) if options else method.hparams
    try:
        return method.rebuilt(setup, hparams)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError) as e:
        raise UserError(f"method {method.name!r} uses {', '.join(values)} as a Python number when it is built; "
                        "run those values one by one instead of as a list") from e
