"""One Pallas kernel shape for every convolution piece: a matmul whose operands are gathered, never stored.

An implicit GEMM computes ``out[v, m, n] = sum_k A[v, m, k] B[v, k, n]`` for
each client ``v`` where A and B are not arrays in memory but index maps into
them: ``a_index(v, m, k) -> (flat offset, valid)`` says where A's element
lives in its flat operand (a padded convolution window reads outside the
input: ``valid`` False, the element is zero). A convolution's forward pass and
both of its gradients are such products over the same flat NHWC / HWIO
buffers (pallas_conv.py), so none of them writes a patch tensor.

The grid is (client, row tile, column tile): each client's operands are
picked by the first grid index, so a vmap of clients is one kernel launch.
Each program loops over the contraction in tiles, loading each tile with a
masked gather and accumulating ``jnp.dot`` in float32 (float64 for float64
operands). Tiles are powers of two and at least 16 on each side (what
Pallas's Triton lowering takes for a dot); rows, columns and contraction
entries past the true sizes are masked.

On a GPU the kernels lower through Pallas's Triton backend; elsewhere they
run in Pallas's interpret mode (the CPU tests): same values, no speed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

TILE_MIN = 16
NUM_WARPS = 4
NUM_STAGES = 2

Index = Callable[..., tuple]
"""``index(v, rows [R, 1], cols [1, C]) -> (flat offsets [R, C] int32, valid [R, C] bool)``."""


@dataclasses.dataclass(frozen=True)
class Gemm:
    """The static description of one implicit GEMM per client."""

    m: int  # rows of the product
    n: int  # columns
    k: int  # contraction length
    a_index: Index  # (v, m, k) -> where A[v, m, k] is in the first operand
    b_index: Index  # (v, k, n) -> where B[v, k, n] is in the second operand
    tiles: tuple  # (rows, columns, contraction) of one program's tile


def tile(size: int, cap: int) -> int:
    """A power of two >= ``size`` and >= `TILE_MIN`, at most ``cap`` (unless `TILE_MIN` is more).

    >>> tile(25, 64), tile(800, 64), tile(3, 64)
    (32, 64, 16)
    """
    return max(TILE_MIN, min(cap, pl.next_power_of_2(size)))


def interpret_mode() -> bool:
    """Pallas's interpret mode everywhere but on a GPU (the kernels' Triton lowering)."""
    return jax.default_backend() != "gpu"


def load(ref, index: Index, v, rows, cols):
    """The masked gather ``ref[offset]`` of one operand tile (zeros where the index says invalid)."""
    offsets, valid = index(v, rows, cols)
    return plt.load(ref.at[jnp.where(valid, offsets, 0)], mask=valid, other=0)


def accumulation_dtype(dtype) -> jnp.dtype:
    """float64 for float64 operands, else float32 (bf16 and f32 operands accumulate in f32)."""
    return jnp.dtype(jnp.float64) if jnp.dtype(dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def product_tile(gemm: Gemm, a_ref, b_ref, v, rows, cols):
    """``sum_k A[v, rows, k] B[v, k, cols]`` for one tile: [tile rows, tile columns] in the accumulation dtype."""
    _, _, tk = gemm.tiles
    acc_dtype = accumulation_dtype(a_ref.dtype)

    def step(t, acc):
        ks = t * tk + lax.iota(jnp.int32, tk)
        a = load(a_ref, gemm.a_index, v, rows, ks[None, :])
        b = load(b_ref, gemm.b_index, v, ks[:, None], cols)
        return acc + jnp.dot(a, b, preferred_element_type=acc_dtype)

    init = jnp.zeros((rows.shape[0], cols.shape[1]), acc_dtype)
    return lax.fori_loop(0, pl.cdiv(gemm.k, tk), step, init)


def out_index(n: int, m: int):
    """The row-major [m, n] layout of a client's output block, after ``v`` such blocks."""
    def index(v, rows, cols):
        return v * (m * n) + rows * n + cols, (rows < m) & (cols < n)
    return index


def store(ref, index: Index, v, rows, cols, value):
    """The masked scatter ``ref[offset] = value`` of one tile. Masked lanes point past the end: Triton never
    touches them and interpret mode's scatter drops them (a shared in-range offset would race with a real
    write there)."""
    offsets, valid = index(v, rows, cols)
    plt.store(ref.at[jnp.where(valid, offsets, ref.shape[0])], value.astype(ref.dtype), mask=valid)


def run(gemm: Gemm, clients: int, a, b, out_dtype):
    """``out [clients * m * n]`` (flat, row-major per client) of ``gemm`` on flat operands ``a`` and ``b``."""
    tm, tn, _ = gemm.tiles
    call = pl.pallas_call(
        functools.partial(_kernel, gemm), out_shape=jax.ShapeDtypeStruct((clients * gemm.m * gemm.n,), out_dtype),
        grid=(clients, pl.cdiv(gemm.m, tm), pl.cdiv(gemm.n, tn)), interpret=interpret_mode(), name="implicit_gemm",
        compiler_params=plt.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES))
    return call(a, b)


def _kernel(gemm, a_ref, b_ref, out_ref):
    tm, tn, _ = gemm.tiles
    v = pl.program_id(0)
    rows = (pl.program_id(1) * tm + lax.iota(jnp.int32, tm))[:, None]
    cols = (pl.program_id(2) * tn + lax.iota(jnp.int32, tn))[None, :]
    store(out_ref, out_index(gemm.n, gemm.m), v, rows, cols, product_tile(gemm, a_ref, b_ref, v, rows, cols))
