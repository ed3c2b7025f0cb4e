"""What every benchmark record names: the device and its peak memory."""

import resource

import jax

from fedjax_pfl.outputs.machine import describe as device_name  # noqa: F401 (the benchmarks' name)


def peak_memory_bytes() -> int:
    """The accelerator's peak bytes in use, or the process's peak RSS on CPU."""
    d = jax.devices()[0]
    stats = d.memory_stats() if d.platform != "cpu" else None
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


CIFAR_SHAPE = (32, 32, 3)


def random_cifar_like(train_samples: int, test_samples: int, seed: int = 0):
    """A Dataset of random uint8 32x32x3 images with uniform labels over 10 classes (CIFAR-10's shapes: the
    time of a step does not depend on pixel values, and no files are needed)."""
    import numpy as np

    from fedjax_pfl.data.dataset import Dataset

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (train_samples + test_samples, *CIFAR_SHAPE), dtype=np.uint8)
    y = rng.integers(0, 10, train_samples + test_samples).astype(np.int32)
    return Dataset("random_cifar_shapes", x[:train_samples], y[:train_samples], x[train_samples:],
                   y[train_samples:], 10, (0.5,) * 3, (0.25,) * 3)


def run_config(**fields):
    """A fedjax_pfl RunConfig from dotted field names (``{"train.batch_size": 32, ...}``), built in code
    with typed values (no override strings to parse)."""
    from fedjax_pfl.runs import config as config_lib

    cfg = config_lib.RunConfig()
    for dotted, value in fields.items():
        *path, name = dotted.split(".")
        node = cfg
        for part in path:
            node = getattr(node, part)
        if not hasattr(node, name):
            raise AttributeError(f"RunConfig has no field {dotted}")
        setattr(node, name, value)
    return cfg
