"""Ragged clients of uniform random uint8 images, as the small test federations draw them, and
the pixel scaling they train on.

Each federation module (split_model_federation.py, personal_model_federation.py,
plain_sgd_federation.py) passes its own sizes, image shape and classes, so every test keeps its
numbers; shifted_pixel_federation.py draws its own images and shares the scaling.
"""

import jax.numpy as jnp
import numpy as np


def uniform_clients(sizes, shape, classes, seed=0):
    """(x, y, index per client): sum(sizes) uniform random uint8 images of ``shape`` and int32 labels
    in [0, classes), client i taking the next ``sizes[i]`` samples."""
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    x = rng.integers(0, 256, size=(total, *shape), dtype=np.uint8)
    y = rng.integers(0, classes, size=total).astype(np.int32)
    return x, y, np.split(np.arange(total), np.cumsum(sizes)[:-1])


def normalize(x):
    """Pixels in [0, 255] to [-0.5, 0.5]."""
    return x.astype(jnp.float32) / 255.0 - 0.5
