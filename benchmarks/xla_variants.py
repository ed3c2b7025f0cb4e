"""XLA flag variants a GPU suite row can run under, to measure per-step latency settings.

Each variant is a set of XLA flags added to ``XLA_FLAGS`` in the process that
measures it (flags are read once, when JAX's backend starts, so a variant
always runs in a child process of its own):

* ``default``: none (what the engine runs with);
* ``command_buffer``: XLA's command buffers extended to loops and branches
  (``--xla_gpu_enable_command_buffer`` with WHILE and CONDITIONAL added to
  XLA's default command types), so a local-training while loop's steps are
  replayed as one CUDA graph instead of one launch per kernel;
* ``triton_gemm_any``: XLA's Triton GEMM emitter for any matmul it can take
  (``--xla_gpu_triton_gemm_any``), fusing small matmuls with their neighbours.

None of them is a default anywhere: a variant becomes one only where the GPU
suite measures it faster (benchmarks/RESULTS.md). On a CPU the GPU flags are
parsed and ignored (tests/test_benchmarks.py runs them there).
"""

from __future__ import annotations

COMMAND_BUFFER_TYPES = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"

XLA_VARIANTS = {
    "default": "",
    "command_buffer": f"--xla_gpu_enable_command_buffer={COMMAND_BUFFER_TYPES}",
    "triton_gemm_any": "--xla_gpu_triton_gemm_any=true",
}


def variant_names(text: str) -> list[str]:
    """The variants of a comma-separated ``--xla-variants`` value; ValueError for an unknown one.

    >>> variant_names("default,command_buffer")
    ['default', 'command_buffer']
    """
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in XLA_VARIANTS]
    if unknown or not names:
        raise ValueError(f"--xla-variants takes {', '.join(XLA_VARIANTS)}, not {text!r}")
    return names


def with_variant(xla_flags: str, variant: str) -> str:
    """``XLA_FLAGS`` (``xla_flags``) with the variant's flags appended.

    >>> with_variant("--xla_dump_to=/tmp/d", "triton_gemm_any")
    '--xla_dump_to=/tmp/d --xla_gpu_triton_gemm_any=true'
    """
    return " ".join(f for f in (xla_flags.strip(), XLA_VARIANTS[variant]) if f)
