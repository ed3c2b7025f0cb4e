"""APPLE's sequential round (PFLlib's protocol) with its core mix's two gradient forms, compared in one run.

APPLE's personalized model is sum_j p_j w_c,j over every client's core; a
local step differentiates it with respect to p, which reads all N cores.
Two forms of that gradient, the same numbers:

- ``weighted_rows`` (the library's, kernels/core_mixing.py): the weights'
  gradient as ``rows [N, P] @ g [P]``, the stack read as it lies;
- ``tensordot``: autodiff of ``jnp.tensordot(p, cores, axes=1)``, whose
  gradient ``g @ rows^T`` made XLA:CPU copy the whole [N, P] stack into its
  transpose inside the local-step loop, every step.

The workload is the DiversiFed FMNIST preset's shapes on random data (40
clients of 300 samples, MLP 784-64-10, E=10, B=100, Adam 1e-3; 1,200 local
steps a round, the clients one after another: ``method.sequential=true``
and the rest of PFLlib's options, as the DiversiFed tables run APPLE).
Each variant prints one JSON record (workload, device, seconds and rounds
per second, compile seconds, peak memory, how many ops of the compiled round
write the cores' stack transposed) and ``speedup_vs_tensordot``.

    PYTHONPATH=. python benchmarks/apple_mix.py            # 40 clients, 3 timed rounds (~1 min on a CPU core)
    PYTHONPATH=. python benchmarks/apple_mix.py --quick    # 6 clients of 100 samples, 2 timed rounds
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from common import device_name, peak_memory_bytes  # noqa: E402 (benchmarks/ is on sys.path)

VARIANTS = ("weighted_rows", "tensordot")
PFLLIB_APPLE = dict(same_init=True, core_after_round="mix", sequential=True, p_gradient="layer_mean",
                    p_momentum=0.0, p_lr=0.01, mu=0.0, schedule="cosine", reg_rounds=500)


def _tensordot_rows(weights, stacked):
    return jnp.tensordot(weights, stacked, axes=1)


def transposed_stack_copies(hlo: str, rows: int, size: int) -> int:
    """Ops of a compiled module that write the cores' [N, P] stack as its transpose [..., N] (N rows of
    ``size`` elements): the copy that autodiff's form put in the local-step loop."""
    count = 0
    for line in hlo.splitlines():
        m = re.search(r"= f32\[([\d,]+)\]\S* (?:copy|fusion)\(", line)
        if m:
            dims = [int(d) for d in m.group(1).split(",")]
            count += dims[-1] == rows and len(dims) > 1 and int(np.prod(dims)) == rows * size
    return count


def compiled_round(variant: str, clients: int, per_client: int):
    """(engine, server, clients' state, the compiled round, compile seconds, [N, P] stack's largest row size)
    of APPLE's sequential round on random FMNIST-shaped data, its mix in form ``variant``."""
    from fedjax_pfl.data.client_data import stack_clients
    from fedjax_pfl.engine import engine as engine_lib
    from fedjax_pfl.kernels import core_mixing
    from fedjax_pfl.methods.apple import APPLE, APPLEConfig
    from fedjax_pfl.runs.config import TrainConfig
    from fedjax_pfl.runs.experiment import engine_config, local_setup
    from fedjax_pfl.models.networks import build_model

    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(clients * per_client, 28, 28, 1), dtype=np.uint8)
    y = rng.integers(0, 10, size=clients * per_client).astype(np.int32)
    data = stack_clients(x, y, [np.arange(i * per_client, (i + 1) * per_client) for i in range(clients)])
    setup = local_setup(TrainConfig(optimizer="adam", lr=1e-3, batch_size=100, local_epochs=10),
                        build_model("mlp", (28, 28, 1), 10, hidden=(64,)), lambda a: a.astype(jnp.float32) / 255.0 - 0.5)
    original = core_mixing.weighted_rows
    if variant == "tensordot":
        core_mixing.weighted_rows = _tensordot_rows
    try:  # the mix's form is fixed when the round is traced
        eng = engine_lib.Engine(APPLE(setup, APPLEConfig(**PFLLIB_APPLE)), data, data,
                                engine_config(TrainConfig(), clients))
        server, state = eng.init(jax.random.key(0))
        start = time.perf_counter()
        compiled = eng._round.lower(server, state, eng.train, jax.random.key(1), jnp.int32(0), {}).compile()
        compile_s = time.perf_counter() - start
    finally:
        core_mixing.weighted_rows = original
    biggest = max(int(np.prod(a.shape[1:])) for a in jax.tree.leaves(server["cores"]["params"]))
    return eng, server, state, compiled, compile_s, biggest


def time_variant(variant: str, clients: int, per_client: int, repeats: int) -> dict:
    from fedjax_pfl.core import tree_ops

    eng, server, state, compiled, compile_s, biggest = compiled_round(variant, clients, per_client)
    params = tree_ops.flatten_stacked(server["cores"]["params"]).shape[1]
    times = []
    for t in range(repeats + 1):  # the first round warms up
        start = time.perf_counter()
        server, state, _ = compiled(server, state, eng.train, jax.random.key(1 + t), jnp.int32(t), {})
        jax.block_until_ready((server, state))
        times.append(time.perf_counter() - start)
    if not all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree.leaves(server)):
        raise SystemExit(f"non-finite server state under {variant}")
    s = statistics.median(times[1:])
    steps = clients * 10 * -(-per_client // 100)
    return {"workload": {"method": "apple (PFLlib protocol, sequential)", "model": "mlp 784-64-10",
                         "clients": clients, "samples_per_client": per_client, "local_steps_per_round": steps,
                         "params": params},
            "variant": variant, "device": device_name(), "jax": jax.__version__,
            "s_per_round": s, "rounds_per_s": 1.0 / s, "ms_per_local_step": 1e3 * s / steps,
            "compile_s": compile_s, "peak_memory_bytes": peak_memory_bytes(),
            "transposed_stack_copies": transposed_stack_copies(compiled.as_text(), clients, biggest)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="6 clients of 100 samples, 2 timed rounds")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per variant (default 3; --quick 2)")
    args = p.parse_args(argv)
    clients, per_client = (6, 100) if args.quick else (40, 300)
    repeats = args.repeats or (2 if args.quick else 3)
    records = [time_variant(v, clients, per_client, repeats) for v in VARIANTS]
    base = records[VARIANTS.index("tensordot")]["s_per_round"]
    for r in records:
        r["speedup_vs_tensordot"] = base / r["s_per_round"]
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
