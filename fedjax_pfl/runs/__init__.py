"""Runs: what a run leaves behind for people to look at.

Tables (metrics.csv, clients.csv), figures (plots/), TensorBoard scalars, and
the report that puts several runs side by side. Everything here reads and
writes run folders and plain host arrays; nothing here imports the engine,
the methods or JAX, so a report needs no accelerator and no training code.
"""
