"""The XLA flags a fresh process of this jaxlib accepts (the suite's fast-compile flags, conftest.py).

XLA reads XLA_FLAGS when JAX starts its first backend and aborts the whole
process on a flag it does not know (jaxlib 0.11.2 no longer knows
``--xla_cpu_use_fusion_emitters``): pytest then exits 1 with no output. So a
flag that not every supported jaxlib knows is tried in a fresh CPU process
before the suite sets it; the flags go in together when they are all known,
else each one alone.
"""

import os
import subprocess
import sys

PROBE = "import jax; jax.numpy.zeros(1).block_until_ready()"


def starts_with(flags: list[str]) -> bool:
    """Whether a fresh Python process starts JAX's CPU backend with ``flags`` as its XLA_FLAGS."""
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, timeout=120).returncode == 0


def accepted(flags: list[str]) -> list[str]:
    """The flags of ``flags`` this jaxlib accepts, in their order."""
    if starts_with(flags):
        return list(flags)
    return [flag for flag in flags if starts_with([flag])]
