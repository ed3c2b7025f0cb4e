"""What machine a result came from, in words: 'cpu: <model name> x<cores>' or '<platform>: <device kind>'.

Recorded in every run's config.json (``versions.machine``) and every benchmark record (``device``), so a
number can always be traced to the hardware that produced it.
"""

from __future__ import annotations

import os
import platform


def describe() -> str:
    """'cpu: AMD EPYC x2' (the first device's platform, and the CPU's model name and core count) or,
    on an accelerator, e.g. 'gpu: NVIDIA H100 80GB HBM3'."""
    import jax  # (here: outputs/ imports without JAX, tests/test_layers.py)

    d = jax.devices()[0]
    if d.platform != "cpu":
        return f"{d.platform}: {d.device_kind}"
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"cpu: {model} x{os.cpu_count()}"
