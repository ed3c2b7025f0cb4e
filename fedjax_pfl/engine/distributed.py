"""Several processes (hosts) through JAX's own multi-process runtime.

`start` calls `jax.distributed.initialize` before any JAX computation when
asked (``--distributed``, or a coordinator given) or when a cluster launcher
that JAX detects by itself started several processes: SLURM (srun sets
SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID)
or Open MPI (mpirun sets OMPI_MCA_orte_hnp_uri and OMPI_COMM_WORLD_SIZE);
these are the variables of `jax._src.clusters` in jax 0.10.2. Elsewhere (two
processes on one machine, other launchers) the coordinator address, process
count and process id are given explicitly. CPU processes talk through gloo
(``jax_cpu_collectives_implementation``).

After start, `jax.devices()` lists the devices of all processes: the engine's
client mesh spans them, every process holds the whole (small) client pool on
its host and places only its own devices' rows (sharding.py). Process 0 alone
writes the run folder's files (`is_main_process`); all processes write their
shards of a checkpoint.

A lost process (killed, crashed, its machine gone): the others stop with one
line naming it (`LostProcessError`), never hang. Its peers see it at their
next collective, when gloo finds the connection closed (at once), or through
the coordination service, which counts a process that has sent no heartbeat
for `HEARTBEAT_TIMEOUT_S` as lost. The service runs recoverable
(``jax_enable_recoverability``): it does not abort the surviving processes
itself (XLA's abort prints a C++ stack trace), so the error reaches Python,
where `is_lost_process` recognises it and `lost_processes` asks the service
which process is gone. The run's last checkpoint is kept: all processes
started again with ``--resume`` continue from it.
"""

from __future__ import annotations

import atexit
import os
import re
import threading

import jax

from fedjax_pfl.core.errors import UserError

# launcher -> (variables that must all be set, variable holding the process count)
LAUNCHERS = {
    "SLURM": (("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"),
              "SLURM_NTASKS"),
    "Open MPI": (("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE"),
}
HEARTBEAT_TIMEOUT_S = 30  # a process silent this long counts as lost (jax's default, 100 s, left peers waiting)
SHUTDOWN_TIMEOUT_S = 30  # how long a finishing process waits at exit for the others (jax's default: 300 s)
# how gloo (CPU collectives) and the coordination service report a peer that is gone
_LOST_TEXT = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|heartbeat timeout|"
                        r"stopped sending heartbeats")


def detected_launcher(environ=None) -> str | None:
    """The cluster launcher that started this process among several, or None."""
    environ = os.environ if environ is None else environ
    for name, (variables, count) in LAUNCHERS.items():
        if all(v in environ for v in variables) and environ[count].isdigit() and int(environ[count]) > 1:
            return name
    return None


def start(requested: bool = False, coordinator: str | None = None, num_processes: int | None = None,
          process_id: int | None = None, environ=None, heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S) -> bool:
    """Initialise the multi-process runtime when requested or launched by a cluster; -> whether it did.

    ``coordinator`` (host:port of process 0), ``num_processes`` and
    ``process_id`` override what a launcher provides; without a launcher all
    three are needed. ``heartbeat_timeout_s``: how long a silent process
    takes to count as lost.
    """
    explicit = (coordinator, num_processes, process_id)
    launcher = detected_launcher(environ)
    if not (requested or launcher or any(v is not None for v in explicit)):
        return False
    if launcher is None and any(v is None for v in explicit):
        raise UserError("--distributed without a cluster launcher (SLURM srun, Open MPI mpirun) needs "
                        "--coordinator HOST:PORT, --num-processes N and --process-id I")
    if heartbeat_timeout_s < 1:
        raise UserError(f"--heartbeat-timeout must be at least 1 second, got {heartbeat_timeout_s}")
    if num_processes is not None and not 0 <= (process_id if process_id is not None else 0) < num_processes:
        raise UserError(f"--process-id must lie in [0, {num_processes}), got {process_id}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_recoverability", True)  # a lost process: an error in Python, not XLA's abort
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                               heartbeat_timeout_seconds=heartbeat_timeout_s,
                               shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S)
    atexit.register(_leave_together, heartbeat_timeout_s + 15)
    return True


def _leave_together(wait_s: float) -> None:
    """At exit: the other processes disconnect, and process 0, which hosts the coordination service, waits until
    they have (a recoverable service no longer holds it at its shutdown barrier, and a process that finds the
    service gone aborts with a C++ stack trace)."""
    if jax.process_index() == 0:
        lost_processes(wait_s)  # returns once every other process has disconnected (or counts as lost)
    jax.distributed.shutdown()


def is_main_process() -> bool:
    """Whether this process writes the run folder (process 0; always True in a single process)."""
    return jax.process_index() == 0


class LostProcessError(UserError):
    """This process stopped because ``lost`` (process ids; empty: not known) of the run's processes are gone."""

    def __init__(self, lost: list[int]):
        count = jax.process_count()
        who = (f"process{'es' if len(lost) > 1 else ''} {', '.join(map(str, lost))} of {count}" if lost
               else f"another of the {count} processes")
        super().__init__(f"{who} stopped answering (killed, crashed or unreachable), so process "
                         f"{jax.process_index()} stopped too; the last checkpoint is kept: start all {count} "
                         f"processes again with --resume")


def is_lost_process(error: BaseException | None) -> bool:
    """Whether ``error`` (or one it was raised from) is a peer process found gone, in a multi-process run."""
    if not jax.distributed.is_initialized():
        return False
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, LostProcessError) or _LOST_TEXT.search(str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


def lost_processes(wait_s: float = HEARTBEAT_TIMEOUT_S + 15) -> list[int] | None:
    """The processes the coordination service no longer counts alive; None when it did not say within ``wait_s``.

    The service answers once every live process has asked, and a process
    lost without a word counts as live until its heartbeats have been
    missing for the heartbeat timeout. When the service itself (process 0)
    is gone, the answer is [0].
    """
    from jax._src import distributed as jax_distributed  # the runtime client (no public handle in jax 0.10)

    client, count = jax_distributed.global_state.client, jax.process_count()
    answer: list = []

    def ask():
        try:
            answer.append(sorted(set(range(count)) - set(client.get_live_nodes(list(range(count))))))
        except Exception:  # noqa: BLE001 -- the coordination service (in process 0) cannot be reached
            answer.append([0] if jax.process_index() != 0 else [])

    asking = threading.Thread(target=ask, daemon=True, name="fedjax_pfl-live-processes")
    asking.start()
    asking.join(wait_s)
    return answer[0] if answer else None


def lost_process_error() -> LostProcessError:
    """The one-line error of a process whose peer is gone (`is_lost_process`), naming the lost processes."""
    return LostProcessError(lost_processes() or [])
