"""FLOPs and FLOP/s for the benchmarks: XLA's count of one SGD step, a measured matmul peak, the isolated step's speed.

* `step_flops`: XLA's cost analysis of ONE lowered (not compiled) SGD step of
  a model on a batch of B, convolutions native, lowered for the CPU whatever
  the default backend (a GPU's module counts no FLOPs in its library
  convolutions), no compile, and the same count for every convolution implementation (within
  0.4% of the compiled CPU count for FedAvgCNN). FedAvgCNN on 28x28x1: 24.9
  MFLOP per sample (forward + both gradients; the first layer's input
  gradient is not computed); on 32x32x3: 43.6; LeNet on 32x32x3: 3.3.
* `step_bytes`: XLA's count of the bytes one SGD step, compiled for the
  device with a given convolution and precision, reads and writes.
* `matmul_peak`: the best FLOP/s of a jitted chain of square matmuls: what
  this device's GEMM reaches, the bar an SGD step is held against;
  `copy_bandwidth`: the best bytes/s of an elementwise pass, the bar for
  the bytes a step moves.
* `sgd_steps_seconds`: seconds per SGD step of a model inside one jitted
  ``lax.scan`` (no engine, no data movement): the "conv step".
"""

from __future__ import annotations

import time


def sgd_step(model_name: str, input_shape, num_classes: int, batch: int, **model_options):
    """(one SGD step ``(params, x, y) -> params`` of a model, its arguments on ``batch`` zero samples)."""
    import jax
    import jax.numpy as jnp

    from fedjax_pfl import losses
    from fedjax_pfl.models.networks import build_model

    model = build_model(model_name, input_shape, num_classes, **model_options)
    variables = model.init(jax.random.key(0))

    def step(params, x, y):
        loss = lambda p: losses.cross_entropy(model.apply({**variables, "params": p}, x, train=True).logits, y)  # noqa: E731
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, jax.grad(loss)(params))

    return step, (variables["params"], jnp.zeros((batch, *model.input_shape), jnp.float32),
                  jnp.zeros((batch,), jnp.int32))


def step_flops(model_name: str, input_shape, num_classes: int, batch: int, **model_options) -> float | None:
    """XLA's FLOP count of one SGD step (forward, backward, update) on ``batch`` samples, or None
    (``model_options``: build_model's, e.g. ``hidden`` for mlp)."""
    import jax

    step, args = sgd_step(model_name, input_shape, num_classes, batch, conv_impl="native", **model_options)
    # Counted for the CPU whatever the default backend: arguments committed to a CPU device make jit lower (and
    # compile) for it. On the H200 the GPU's compiled module counted 86 MFLOP for FedAvgCNN's 698 MFLOP step,
    # since its convolutions are library calls whose FLOPs XLA does not count.
    lowered = jax.jit(step).lower(*jax.device_put(args, jax.devices("cpu")[0]))
    return cost_flops(lowered.cost_analysis) or cost_flops(lambda: lowered.compile().cost_analysis())


def step_bytes(model_name: str, input_shape, num_classes: int, batch: int, **model_options) -> float | None:
    """XLA's 'bytes accessed' of one SGD step compiled for the default device (``model_options``: build_model's,
    e.g. ``conv_impl``, ``precision``): what the compiled step's kernels read and write, the traffic a
    memory-bound step is held against; None where the backend gives no count."""
    import jax

    step, args = sgd_step(model_name, input_shape, num_classes, batch, **model_options)
    try:
        cost = jax.jit(step).lower(*args).compile().cost_analysis()
    except Exception:  # noqa: BLE001 (some backends have no cost model)
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    value = (cost or {}).get("bytes accessed")
    return float(value) if value and value > 0 else None


def cost_flops(analysis) -> float | None:
    """The 'flops' of ``analysis()`` (an XLA cost analysis), or None where the backend gives none.

    The lowered (unoptimised) module's analysis is backend-neutral and cheap, but on GPU (jax 0.11) it gave
    no FLOP count, so `step_flops` then asks the compiled module's."""
    try:
        cost = analysis()
    except Exception:  # noqa: BLE001 (some backends have no cost model)
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def best_seconds(fn, args: tuple, reps: int) -> float:
    """The fastest of ``reps`` timed calls ``fn(*args)`` after one untimed (compiling) call."""
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak(n: int, dtype_name: str = "fp32", reps: int = 3, chain: int = 10) -> dict:
    """Best FLOP/s of a jitted chain of ``chain`` n x n matmuls in ``dtype_name`` ('fp32' or 'bf16')."""
    import jax
    import jax.numpy as jnp

    dtype = {"bf16": jnp.bfloat16, "fp32": jnp.float32}[dtype_name]
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), dtype)
    b = (jax.random.normal(kb, (n, n), jnp.float32) / n ** 0.5).astype(dtype)

    @jax.jit
    def run(a, b):
        return jax.lax.fori_loop(0, chain, lambda i, c: c @ b, a)

    best = best_seconds(run, (a, b), reps)
    return {"dtype": dtype_name, "n": n, "seconds": best, "flops_per_s": 2.0 * n ** 3 * chain / best}


def copy_bandwidth(mib: int, reps: int = 3) -> dict:
    """Best bytes/s of a jitted elementwise pass over ``mib`` MiB of float32 (each byte read once and written
    once: 2 x mib MiB moved): what this device's memory streams, the bar a memory-bound step is held against."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((mib * 2**18,), jnp.float32)
    best = best_seconds(jax.jit(lambda x: x * 0.5 + 1.0), (x,), reps)
    return {"mib": mib, "seconds": best, "bytes_per_s": 2.0 * mib * 2**20 / best}


def sgd_steps_seconds(model_name: str, input_shape, num_classes: int, batch: int, steps: int = 50,
                      reps: int = 3, devices: int = 1, lanes: int = 1, **model_options) -> float:
    """Seconds per SGD step (lr 0.005) of a model built with the default convolution (or ``model_options``,
    e.g. ``conv_impl``), inside one jitted ``lax.scan`` of ``steps`` steps on random data; best of ``reps``
    calls after a compiling one.

    ``devices`` > 1: as the engine trains clients on several (host) devices, each of the first
    ``devices`` devices scans its own client's steps (its own parameters and data) under
    ``jax.shard_map``, side by side; the result is seconds per client-step of the whole machine
    (wall time / (steps * devices)). ``lanes`` > 1: each step is one ``vmap`` of ``lanes`` clients'
    steps, each on its own parameters and data (the step of the ``packed`` client mapping's lanes); the
    result is seconds per such step of all the lanes."""
    import jax
    import numpy as np

    from fedjax_pfl import losses
    from fedjax_pfl.models.networks import build_model

    model = build_model(model_name, input_shape, num_classes, **model_options)
    variables = model.init(jax.random.key(0))
    lead = (devices,) if devices > 1 else ()
    wide = (lanes,) if lanes > 1 else ()
    x = jax.random.normal(jax.random.key(1), lead + (steps,) + wide + (batch, *model.input_shape))
    y = jax.random.randint(jax.random.key(2), lead + (steps,) + wide + (batch,), 0, num_classes)
    params = variables["params"]
    if lanes > 1:
        params = jax.tree.map(lambda a: np.broadcast_to(a, (lanes,) + a.shape), params)

    def one_step(p, x, y):
        loss = lambda q: losses.cross_entropy(model.apply({**variables, "params": q}, x, train=True).logits, y)  # noqa: E731
        return jax.tree.map(lambda a, g: a - 0.005 * g, p, jax.grad(loss)(p))

    lane_step = jax.vmap(one_step) if lanes > 1 else one_step

    def scan_steps(params, x, y):
        return jax.lax.scan(lambda p, xy: (lane_step(p, *xy), None), params, (x, y))[0]

    if devices > 1:
        mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:devices]), ("clients",))
        spec = jax.sharding.PartitionSpec("clients")
        params = jax.tree.map(lambda a: np.broadcast_to(a, (devices,) + a.shape), params)
        params, x, y = jax.device_put((params, x, y), jax.sharding.NamedSharding(mesh, spec))
        one_each = lambda p, x, y: jax.tree.map(lambda a: a[None], scan_steps(*jax.tree.map(lambda a: a[0], (p, x, y))))  # noqa: E731
        run = jax.jit(jax.shard_map(one_each, mesh=mesh, in_specs=spec, out_specs=spec))
    else:
        run = jax.jit(scan_steps)

    return best_seconds(run, (params, x, y), reps) / (steps * devices)
