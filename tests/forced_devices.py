"""Environment for a subprocess that runs JAX on ``n`` forced CPU devices.

Keeps the suite's fast-compile XLA flags (conftest.py) and adds the device
count: a subprocess given only ``--xla_force_host_platform_device_count``
would compile with LLVM's full optimisation, about 1.5x slower.
"""

import os


def cpu_devices_env(n: int) -> dict:
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    return {"XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={n}"]), "JAX_PLATFORMS": "cpu"}
