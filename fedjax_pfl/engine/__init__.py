"""The federated round as one compiled call: client selection, client mapping
(vmap / map / chunked), sharding over devices, multi-process start-up,
checkpoints and round-indexed learning rates.

The engine runs any method's pure functions; it imports methods, kernels,
models, data and core, never runs/ (the command line and run folders).
"""
