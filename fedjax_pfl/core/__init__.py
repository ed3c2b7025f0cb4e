"""The ground floor: pure pytree operations (tree_ops), the user-facing error types (errors), the settings'
declarations (declared), folders made so they can be unmade (folders), and how a process ends when stopped from
outside its code: stop signals and the stop request of a run (stop_signals, stop_request), a full disk
(disk_space), an environment JAX cannot start in (jax_environment).

Imports nothing else of fedjax_pfl; every other layer may import it.
"""
