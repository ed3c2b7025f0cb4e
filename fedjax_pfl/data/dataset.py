"""The `Dataset` record every loader returns: train/test arrays plus metadata.

Images are uint8, channel-last [n, H, W, C]; feature datasets (Synthetic) are
float32 [n, D]; images that arrive already normalised (PFLlib folders) are
float32 [n, H, W, C] and normalise like features. Labels are int32 [n]. This file holds only the container, its
validation and normalisation helpers; it reads no files and does no partitioning.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_pfl.core.errors import UserError


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A centralised dataset (train and test split) with normalisation statistics.

    `mean`/`std` are per-channel: uint8 images normalise as (x / 255 - mean) / std,
    float32 data (features, or already normalised images) as (x - mean) / std. `client_ids_*` (int32 [n]) are set only
    for naturally federated data such as Synthetic(alpha, beta).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    client_ids_train: np.ndarray | None = None
    client_ids_test: np.ndarray | None = None

    def __post_init__(self):
        name = self.name
        for split in ('train', 'test'):
            x = getattr(self, f'x_{split}')
            y = getattr(self, f'y_{split}')
            if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
                raise TypeError(f'{name}: x_{split} and y_{split} must be numpy arrays')
            image_ok = x.dtype == np.uint8 and x.ndim == 4
            float_ok = x.dtype == np.float32 and x.ndim in (2, 4)
            if not (image_ok or float_ok):
                raise ValueError(
                    f'{name}: x_{split} must be uint8 [n, H, W, C] or float32 '
                    f'[n, D] / [n, H, W, C], got {x.dtype} {x.shape}')
            if y.dtype != np.int32 or y.shape != (x.shape[0],):
                raise ValueError(
                    f'{name}: y_{split} must be int32 [{x.shape[0]}], '
                    f'got {y.dtype} {y.shape}')
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(
                    f'{name}: y_{split} holds labels outside [0, {self.num_classes})')
            ids = getattr(self, f'client_ids_{split}')
            if ids is not None and (
                    not isinstance(ids, np.ndarray) or ids.dtype != np.int32
                    or ids.shape != y.shape):
                raise ValueError(f'{name}: client_ids_{split} must be int32 {y.shape}')
        if (self.x_train.dtype != self.x_test.dtype
                or self.x_train.shape[1:] != self.x_test.shape[1:]):
            raise ValueError(
                f'{name}: train and test examples differ: {self.x_train.dtype} '
                f'{self.x_train.shape[1:]} vs {self.x_test.dtype} {self.x_test.shape[1:]}')
        if (self.client_ids_train is None) != (self.client_ids_test is None):
            raise ValueError(
                f'{name}: set both client_ids_train and client_ids_test, or neither')
        channels = self.x_train.shape[-1] if self.is_image else 1
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(
                f'{name}: mean/std need {channels} entries, '
                f'got {len(self.mean)}/{len(self.std)}')
        if min(self.std) <= 0:
            raise ValueError(f'{name}: std must be positive, got {self.std}')

    @property
    def is_image(self) -> bool:
        """True for uint8 [n, H, W, C] images (scaled by 1/255), False for float32 data."""
        return self.x_train.dtype == np.uint8

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. (28, 28, 1) or (60,)."""
        return tuple(self.x_train.shape[1:])

    @property
    def nbytes(self) -> int:
        """Bytes of its samples, labels and client ids."""
        arrays = (self.x_train, self.y_train, self.x_test, self.y_test, self.client_ids_train, self.client_ids_test)
        return sum(a.nbytes for a in arrays if a is not None)

    def without_samples(self) -> "Dataset":
        """This dataset's record with none of its samples (its shapes, classes and statistics): what a run keeps
        once its clients' arrays are made, so the samples' memory is freed."""
        empty = {name: getattr(self, name)[:0].copy() for name in ("x_train", "y_train", "x_test", "y_test",
                                                                     "client_ids_train", "client_ids_test")
                 if getattr(self, name) is not None}  # (copies: an empty view would keep its samples alive)
        return dataclasses.replace(self, **empty)

    @property
    def is_federated(self) -> bool:
        """True when the data carries its own client ids."""
        return self.client_ids_train is not None

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """Float32 (x/255 - mean)/std for images, (x - mean)/std for features."""
        x = np.asarray(x, np.float32)
        if self.is_image:
            x = x / np.float32(255.0)
        mean = np.asarray(self.mean, np.float32)
        std = np.asarray(self.std, np.float32)
        return (x - mean) / std


NORMALIZATIONS = ('dataset', 'half')


def with_normalization(dataset: Dataset, how: str) -> Dataset:
    """``dataset`` normalised as ``how``: 'dataset', its own per-channel mean and std; 'half',
    (x/255 - 0.5) / 0.5 per channel (torchvision's Normalize(0.5, 0.5), which PFLlib's dataset
    generators apply: PFAKD's and FedAS's authors' data)."""
    if how not in NORMALIZATIONS:
        raise UserError(f"data.normalization must be one of {', '.join(NORMALIZATIONS)}, got {how!r}")
    if how == 'dataset':
        return dataset
    if not dataset.is_image:
        raise UserError(f"data.normalization=half applies to image datasets; {dataset.name} holds feature "
                        "vectors: leave it at 'dataset'")
    channels = len(dataset.mean)
    return dataclasses.replace(dataset, mean=(0.5,) * channels, std=(0.5,) * channels)


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and std of uint8 images [n, H, W, C], scaled to [0, 1].

    Counts a 256-bin histogram per channel: exact, and no float copy of `x`.
    """
    if x.dtype != np.uint8 or x.ndim != 4:
        raise ValueError(f'channel_stats needs uint8 [n, H, W, C], got {x.dtype} {x.shape}')
    levels = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for c in range(x.shape[-1]):
        counts = np.bincount(x[..., c].ravel(), minlength=256).astype(np.float64)
        total = counts.sum()
        m = float(counts @ levels / total)
        means.append(m)
        stds.append(float(counts @ (levels - m) ** 2 / total) ** 0.5)
    return tuple(means), tuple(stds)
