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
"""

from __future__ import annotations

import os

import jax

from fedjax_pfl.core.errors import UserError

# launcher -> (variables that must all be set, variable holding the process count)
LAUNCHERS = {
    "SLURM": (("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"),
              "SLURM_NTASKS"),
    "Open MPI": (("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE"),
}


def detected_launcher(environ=None) -> str | None:
    """The cluster launcher that started this process among several, or None."""
    environ = os.environ if environ is None else environ
    for name, (variables, count) in LAUNCHERS.items():
        if all(v in environ for v in variables) and environ[count].isdigit() and int(environ[count]) > 1:
            return name
    return None


def start(requested: bool = False, coordinator: str | None = None, num_processes: int | None = None,
          process_id: int | None = None, environ=None) -> bool:
    """Initialise the multi-process runtime when requested or launched by a cluster; -> whether it did.

    ``coordinator`` (host:port of process 0), ``num_processes`` and
    ``process_id`` override what a launcher provides; without a launcher all
    three are needed.
    """
    explicit = (coordinator, num_processes, process_id)
    launcher = detected_launcher(environ)
    if not (requested or launcher or any(v is not None for v in explicit)):
        return False
    if launcher is None and any(v is None for v in explicit):
        raise UserError("--distributed without a cluster launcher (SLURM srun, Open MPI mpirun) needs "
                        "--coordinator HOST:PORT, --num-processes N and --process-id I")
    if num_processes is not None and not 0 <= (process_id if process_id is not None else 0) < num_processes:
        raise UserError(f"--process-id must lie in [0, {num_processes}), got {process_id}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    return True


def is_main_process() -> bool:
    """Whether this process writes the run folder (process 0; always True in a single process)."""
    return jax.process_index() == 0
