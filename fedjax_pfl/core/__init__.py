"""The ground floor: pure pytree operations (tree_ops), the user-facing error types (errors), the settings'
declarations (declared), and folders made so they can be unmade (folders).

Imports nothing else of fedjax_pfl; every other layer may import it.
"""
