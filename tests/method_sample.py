"""Which methods a test parametrized over many methods covers: a fixed sample, or all of them.

Each case of such a test builds and compiles its method's round, so over 28 methods one test costs
minutes, more than CI's time limit for the whole suite allows. `sample` keeps the listed methods, chosen
per test so that every distinct code path the test checks (a kind of state, an evaluation protocol, an
optimizer layout) is one of them; ``FEDJAX_PFL_EVERY_METHOD=1`` runs every method, as before a
release: ``FEDJAX_PFL_EVERY_METHOD=1 python -m pytest -q -n 2 tests/test_eval_protocols.py``.
"""

import os

ENV = "FEDJAX_PFL_EVERY_METHOD"


def sample(names, keep):
    """``names`` (an iterable of method names or of tuples whose first item is one), restricted to
    ``keep`` unless $FEDJAX_PFL_EVERY_METHOD is 1. A kept name that is not in ``names`` is an error:
    the sample cannot silently shrink when a method is renamed."""
    names = list(names)
    first = [n[0] if isinstance(n, tuple) else n for n in names]
    missing = sorted(set(keep) - set(first))
    if missing:
        raise ValueError(f"method sample names methods the test does not have: {missing}")
    if os.environ.get(ENV) == "1":
        return names
    return [n for n, m in zip(names, first) if m in keep]
