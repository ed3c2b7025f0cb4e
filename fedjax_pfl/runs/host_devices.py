"""``devices.cpu``: how many devices JAX makes of the host CPU (``jax_num_cpu_devices``), set before JAX starts.

XLA:CPU runs one device's program mostly on one of its threads, so one CPU
device trains one client at a time on about one core. With several host
devices the engine deals each round's clients over them
(engine/sharding.py, `split_over_devices`): each device trains its own
clients beside the others, and the numbers are those of one device up to
float rounding.

- ``auto`` (the default): one device per core (``os.cpu_count()``), for
  every model (each model measured was faster so: benchmarks/RESULTS.md;
  the client data are replicated on each host device: engine/sharding.py). A
  count already chosen outside the config is kept:
  ``XLA_FLAGS=--xla_force_host_platform_device_count=N``,
  ``JAX_NUM_CPU_DEVICES=N``, or ``jax_num_cpu_devices`` set in Python; so is
  the one device of each process of a multi-process run (its processes may
  share a machine's cores).
- ``N``: N host devices, whatever else was set.

JAX fixes its device count when its backend starts (the first computation).
`apply` acts only before that: in the training command, reproduce and the
benchmarks' children it runs first. A run started from Python after other
JAX work (the tests) keeps the devices that exist, and its record says so.
On a GPU or TPU the engine splits the clients over the accelerators, and the
host devices set here go unused.
"""

from __future__ import annotations

import os

import jax

from fedjax_pfl.core.errors import UserError

AUTO = "auto"
FORCE_FLAG = "--xla_force_host_platform_device_count"

_applied: dict = {}  # what `apply` did in this process (JAX's device count is per process too)


def parse(setting) -> int | None:
    """``devices.cpu`` -> a device count, or None for ``auto``; raises UserError otherwise."""
    text = str(setting).strip()
    if text == AUTO:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"devices.cpu must be 'auto' or a whole number of host devices >= 1, got {setting!r}")
    return int(text)


def chosen_outside(environ, configured: int) -> str | None:
    """Where a host device count was already chosen (``configured``: ``jax_num_cpu_devices``, -1 when unset),
    or None."""
    if configured >= 0:
        return f"jax_num_cpu_devices={configured} (JAX_NUM_CPU_DEVICES or Python)"
    flag = next((f for f in environ.get("XLA_FLAGS", "").split() if f.startswith(FORCE_FLAG)), None)
    return f"XLA_FLAGS {flag}" if flag else None


def wanted(setting, cpu_count: int, outside: str | None, several_processes: bool):
    """(host device count to set, or None to leave JAX's, and why) for ``devices.cpu = setting``."""
    count = parse(setting)
    if count is not None:
        return count, f"devices.cpu={count}"
    if outside:
        return None, f"auto: kept {outside}"
    if several_processes:
        return None, "auto: one device per process (several processes)"
    return cpu_count, f"auto: one per core ({cpu_count})"


def apply(setting) -> dict:
    """Set JAX's host device count for ``devices.cpu = setting`` if JAX has not started; -> `record`."""
    configured = jax.config.jax_num_cpu_devices
    if configured == _applied.get("set"):  # an earlier run of this process set it (reproduce: one per cell)
        configured = -1
    count, why = wanted(setting, os.cpu_count() or 1, chosen_outside(os.environ, configured),
                        jax.distributed.is_initialized())
    if count is not None:
        try:
            jax.config.update("jax_num_cpu_devices", count)
            _applied["set"] = count
        except RuntimeError:  # JAX validates: the backend started with another count
            why = f"{why} not applied: JAX had started before the run"
    _applied.update(requested=str(setting), why=why)
    return record()


def record() -> dict:
    """What ran (config.json's resolved "devices.cpu"): the setting, why, the backend and its device count."""
    return {"requested": _applied.get("requested"), "why": _applied.get("why", "not applied (run from Python)"),
            "backend": jax.default_backend(), "devices": jax.device_count()}


def describe(entry: dict) -> str:
    """One log line."""
    return f"devices: {entry['devices']} {entry['backend']} ({entry['why']})"
