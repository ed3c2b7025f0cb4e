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

from fedjax_pfl.process import jax_environment
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data import files

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


def wanted(setting, cpu_count: int, outside: str | None, several_processes: bool, clients: int | None = None):
    """(host device count to set, or None to leave JAX's, and why) for ``devices.cpu = setting``; ``clients``:
    the run's client count, when known (auto sets no more devices than clients)."""
    count = parse(setting)
    if count is not None:
        return count, f"devices.cpu={count}"
    if outside:
        return None, f"auto: kept {outside}"
    if several_processes:
        return None, "auto: one device per process (several processes)"
    if clients is not None and clients < cpu_count:
        return clients, f"auto: one per client ({clients}, fewer than the {cpu_count} cores)"
    return cpu_count, f"auto: one per core ({cpu_count})"


def check_count(setting, clients: int | None) -> None:
    """UserError before JAX starts for more host devices than clients: the engine pads the clients to a multiple
    of the devices and holds their data once per device (engine/sharding.py), so 64 devices make a 6-client run's
    data arrays 64 x 64 / 6 times as large, and none of the extra devices has a client to train."""
    count = parse(setting)
    if count is not None and clients is not None and count > clients:
        raise UserError(f"devices.cpu={count} is more host devices than the run's {clients} clients (each device "
                        "holds a copy of the client data, padded to a client per device); use --cpu-devices "
                        f"{clients} or fewer, or leave it auto")


def apply(setting, clients: int | None = None) -> dict:
    """Set JAX's host device count for ``devices.cpu = setting`` if JAX has not started (`check_count` first;
    ``clients``: the run's client count, when known); -> `record`."""
    check_environment()
    check_count(setting, clients)
    configured = jax.config.jax_num_cpu_devices
    if configured == _applied.get("set"):  # an earlier run of this process set it (reproduce: one per cell)
        configured = -1
    count, why = wanted(setting, os.cpu_count() or 1, chosen_outside(os.environ, configured),
                        jax.distributed.is_initialized(), clients)
    if count is not None:
        try:
            jax.config.update("jax_num_cpu_devices", count)
            _applied["set"] = count
        except RuntimeError:  # JAX validates: the backend started with another count
            why = f"{why} not applied: JAX had started before the run"
    _applied.update(requested=str(setting), why=why)
    return record()


def record() -> dict:
    """What ran (config.json's resolved "devices.cpu"): the setting, why, the backend and its device count (the
    first call starts JAX's backend: a platform it cannot start is a `UserError`)."""
    try:
        backend, devices = jax.default_backend(), jax.device_count()
    except (RuntimeError, AssertionError) as e:
        raise UserError(jax_environment.start_failure(os.environ, f"{type(e).__name__}: {e}")) from None
    return {"requested": _applied.get("requested"), "why": _applied.get("why", "not applied (run from Python)"),
            "backend": backend, "devices": devices}


def check_environment() -> None:
    """``JAX_PLATFORMS`` and ``XLA_FLAGS`` tried before JAX starts here (process/jax_environment.py), each once per
    environment (remembered in the cache folder)."""
    jax_environment.check(os.environ, files.cache_dir() / "environments")


def describe(entry: dict) -> str:
    """One log line."""
    return f"devices: {entry['devices']} {entry['backend']} ({entry['why']})"
