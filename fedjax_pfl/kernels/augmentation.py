"""Random augmentation of training image batches (``train.augment``).

``crop_flip`` is the CIFAR training transform of FedPAC's authors (and of
most CIFAR code): torchvision's ``RandomCrop(32, padding=4)`` then
``RandomHorizontalFlip()``. Each image of a [B, H, W, C] batch is padded
with ``padding`` zero pixels on every side (black, as torchvision pads the
stored image before ``ToTensor``), cropped back to H x W at an offset drawn
uniformly from the (2 * padding + 1)^2 possible ones, and mirrored
left-right with probability 1/2. It runs on the batch as stored (uint8),
before normalisation, so a padded pixel normalises like a black one.

Every SGD step on a client's train data applies it, with a key of its own
per step, as a PyTorch train loader with this transform would: local
training (kernels/local_training.py), the random batches of the
step-counted methods (methods/step_counted.py) and the fine-tuning or
adaptation some methods run before evaluation. Evaluation and statistics
passes (prototypes, Fisher traces, pFedKD's server gradient) see the images
as stored. Pure and jit-able.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

AUGMENTATIONS = ("none", "crop_flip")


def random_crop_flip(key, images, padding: int = 4):
    """[B, H, W, C] images, each zero-padded by ``padding``, randomly cropped back to H x W and
    flipped left-right with probability 1/2.

    Examples:
        >>> images = jnp.arange(1, 10, dtype=jnp.uint8).reshape(1, 3, 3, 1)
        >>> out = random_crop_flip(jax.random.key(0), images, padding=1)
        >>> out.shape, out.dtype
        ((1, 3, 3, 1), dtype('uint8'))
        >>> bool(jnp.all(random_crop_flip(jax.random.key(0), images, padding=0)[..., ::-1, :] == images)
        ...      or jnp.all(random_crop_flip(jax.random.key(0), images, padding=0) == images))  # no room: flip only
        True
    """
    b, h, w, c = images.shape
    k_top, k_left, k_flip = jax.random.split(key, 3)
    top = jax.random.randint(k_top, (b,), 0, 2 * padding + 1)
    left = jax.random.randint(k_left, (b,), 0, 2 * padding + 1)
    flip = jax.random.bernoulli(k_flip, 0.5, (b,))
    padded = jnp.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))

    def one(image, t, l, f):
        crop = jax.lax.dynamic_slice(image, (t, l, 0), (h, w, c))
        return jnp.where(f, crop[:, ::-1], crop)

    return jax.vmap(one)(padded, top, left, flip)


def augmentation(name: str) -> Callable | None:
    """The ``(key, images) -> images`` function of ``train.augment=name``, or None for 'none'.

    Examples:
        >>> augmentation("none") is None, augmentation("crop_flip") is random_crop_flip
        (True, True)
    """
    if name == "none":
        return None
    if name == "crop_flip":
        return random_crop_flip
    raise ValueError(f"augmentation must be one of {AUGMENTATIONS}, got {name!r}")
