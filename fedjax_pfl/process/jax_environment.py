"""The environment JAX starts in (``JAX_PLATFORMS``, ``XLA_FLAGS``), tried before JAX starts in this process.

XLA aborts the process on a flag it does not know (a fatal log line, exit 1,
no Python error) and JAX fails on a platform the machine lacks with an error
deep in its start. `check` starts JAX in a child process with the same
environment first and turns its failure into one `UserError` (`start_failure`
words it). Once an environment started, a file in the given folder (named by
the jax version, the two values and the interpreter) remembers it, so each
environment is tried once. Nothing is tried when neither variable is set or
JAX has started here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jax

from fedjax_pfl.core.errors import UserError

PROBE = "import jax; jax.devices()"  # what `check` runs in a child process
VARIABLES = ("JAX_PLATFORMS", "XLA_FLAGS")
UNKNOWN_FLAG = re.compile(r"Unknown flags? in XLA_FLAGS: (.+)")


def _started() -> bool:
    from jax._src import xla_bridge  # (JAX's private module: a JAX without it fails this probe only)

    return bool(getattr(xla_bridge, "backends_are_initialized", lambda: False)())


def start_failure(environ, detail: str) -> str:
    """The one line for JAX failing to start in ``environ`` (``detail``: its error, or the child's last line)."""
    unknown = UNKNOWN_FLAG.search(detail)
    if unknown:
        return (f"XLA_FLAGS holds {unknown.group(1).strip()}, a flag the XLA of this jax ({jax.__version__}) does not "
                "know, and XLA would abort; remove it from XLA_FLAGS")
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return (f"JAX_PLATFORMS={platforms}: JAX cannot start {'that platform' if ',' not in platforms else 'those'} "
                f"on this machine ({detail[:200]}); set JAX_PLATFORMS to one it has (cpu is always there), or unset "
                "it")
    return f"JAX cannot start in this environment ({detail[:200]}); check XLA_FLAGS and JAX_PLATFORMS"


def check(environ, remembered: Path) -> None:
    """UserError (`start_failure`) when JAX cannot start in ``environ``, tried in a child process unless JAX has
    started here, neither variable is set, or a file in ``remembered`` says this environment started before."""
    values = {name: environ.get(name, "").strip() for name in VARIABLES}
    if not any(values.values()) or _started():
        return
    key = hashlib.sha256(json.dumps([jax.__version__, values, sys.executable]).encode()).hexdigest()[:24]
    marker = Path(remembered) / key
    if marker.is_file():
        return
    try:
        child = subprocess.run([sys.executable, "-c", PROBE], env=dict(environ), capture_output=True, text=True,
                               timeout=600)
    except (OSError, subprocess.TimeoutExpired):
        return  # (the check cannot run: JAX itself will say what it finds)
    if child.returncode != 0:
        lines = [line.strip() for line in child.stderr.splitlines() if line.strip()]
        detail = next((line for line in lines if UNKNOWN_FLAG.search(line)), lines[-1] if lines else "")
        raise UserError(start_failure(environ, detail))
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{json.dumps(values)}\n")
