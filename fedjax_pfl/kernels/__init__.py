"""The math behind the losses and aggregation rules, one concept per file.

Pure, jit-able functions of arrays and pytrees for ONE client or one server
step (distances, QPs, Fisher traces, prototypes, local training loops, ...).
Kernels import only `fedjax_pfl.core` and each other: never losses.py,
aggregation.py, methods, the engine or runs.
"""
