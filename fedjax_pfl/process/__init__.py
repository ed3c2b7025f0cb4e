"""How a process ends when stopped from outside its code: stop signals and a run's stop request
(stop_signals, stop_request), a full disk (disk_space), an environment JAX cannot start in (jax_environment).

Imports only core; every layer above may import it.
"""
