"""The ground floor: pure pytree operations (tree_ops) and the user-facing error types (errors).

Imports nothing else of fedjax_pfl; every other layer may import it.
"""
