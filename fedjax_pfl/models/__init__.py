"""Flax models with a body/head split (networks), their convolution layers, and
prediction wrappers used at evaluation. Imports only `fedjax_pfl.core`.
"""
