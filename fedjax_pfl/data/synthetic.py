"""Synthetic(alpha, beta): the FedProx generator (Li et al., MLSys 2020).

Per client k: u_k ~ N(0, alpha), W_k ~ N(u_k, 1) [60 x 10], b_k ~ N(u_k, 1);
B_k ~ N(0, beta), v_k ~ N(B_k, 1) [60]; x ~ N(v_k, Sigma) with Sigma diagonal,
Sigma_jj = j^-1.2; y = argmax softmax(x W_k + b_k). As in the FedProx code, the
second argument of N(., .) is a standard deviation. Client sizes are
lognormal(4, 2) + 50 unless fixed, times `size_factor`. With `iid`, every
client shares one W, b and v_k = B_k * 1 (the FedProx Synthetic-IID setting,
alpha = beta = 0). Each client's samples are shuffled and split train/test
(75/25 by default). Needs no files; deterministic for a seed
(numpy.random.default_rng).

The pFedKD-WCL authors' generator (HengruiH/pFedKD utils/synthetic.py) computes
the same distribution with client sizes 5 x (lognormal(4, 2) + 50):
`size_factor=5`. Their script is unseeded; the draws here come in another order,
so the same seed does not give their file.
"""

from __future__ import annotations

import numpy as np

from fedjax_pfl.data.dataset import Dataset
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_limits import check_fits

DIMENSION = 60
NUM_CLASSES = 10


def client_sizes(rng: np.random.Generator, num_clients: int) -> np.ndarray:
    """FedProx client sizes: int(lognormal(4, 2)) + 50."""
    return rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + 50


def _check(alpha, beta, num_clients, samples_per_client, train_fraction, size_factor) -> None:
    if alpha < 0 or beta < 0:
        raise UserError(f'Synthetic needs alpha, beta >= 0, got ({alpha}, {beta}).')
    if num_clients < 1:
        raise UserError(f'Synthetic needs num_clients >= 1, got {num_clients}.')
    if samples_per_client is not None and samples_per_client < 2:
        raise UserError('Synthetic needs samples_per_client >= 2 (one train, one test), '
                        f'got {samples_per_client}.')
    if not 0.0 < train_fraction < 1.0:
        raise UserError(f'train_fraction must be in (0, 1), got {train_fraction}.')
    if int(size_factor) != size_factor or size_factor < 1:
        raise UserError(f'Synthetic size_factor must be a whole number >= 1, got {size_factor}.')
    if size_factor != 1 and samples_per_client is not None:
        raise UserError('Synthetic size_factor scales the lognormal client sizes; with samples_per_client set, '
                        'leave it at 1.')


def _sizes(rng: np.random.Generator, num_clients: int, samples_per_client: int | None, size_factor: int):
    if samples_per_client is None:
        return client_sizes(rng, num_clients) * int(size_factor)
    return np.full(num_clients, samples_per_client, np.int64)


def train_sizes(sizes: np.ndarray, train_fraction: float) -> np.ndarray:
    """Each client's train samples: max(1, floor(train_fraction * n_k)), leaving at least one test sample."""
    sizes = np.asarray(sizes, np.int64)
    return np.minimum(np.maximum(1, np.floor(train_fraction * sizes).astype(np.int64)), sizes - 1)


def planned_sizes(num_clients: int = 30, seed: int = 0, samples_per_client: int | None = None,
                  train_fraction: float = 0.75, size_factor: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) sample counts per client of `load_synthetic` with these arguments, without drawing a sample
    (the sizes are its first draws): what a run checks against memory before generating anything."""
    _check(0.0, 0.0, num_clients, samples_per_client, train_fraction, size_factor)
    sizes = _sizes(np.random.default_rng(seed), num_clients, samples_per_client, size_factor)
    train = train_sizes(sizes, train_fraction)
    return train, sizes - train


def load_synthetic(alpha: float = 0.5, beta: float = 0.5, *, num_clients: int = 30,
                   seed: int = 0, samples_per_client: int | None = None,
                   train_fraction: float = 0.75, iid: bool = False, size_factor: int = 1) -> Dataset:
    """Synthetic(alpha, beta) features float32 [n, 60] with client ids, 10 classes.

    `samples_per_client` fixes every client's size (else size_factor x
    (lognormal(4, 2) + 50)).
    Each client gets max(1, floor(train_fraction * n_k)) train samples and at
    least one test sample. The samples are written into their float32 arrays
    client by client (no float64 copy of the pool); a pool larger than the
    memory available is refused before any sample is drawn (data/client_limits.py).
    """
    _check(alpha, beta, num_clients, samples_per_client, train_fraction, size_factor)
    rng = np.random.default_rng(seed)
    sizes = _sizes(rng, num_clients, samples_per_client, size_factor)
    n_train = train_sizes(sizes, train_fraction)
    total = int(sizes.sum())
    check_fits(total * (4 * DIMENSION + 4 + 4),
               f'Synthetic with {num_clients} clients draws {total:,} samples ({DIMENSION} float32 features each); '
               'they',
               'use fewer clients, or clients of a fixed size (samples_per_client)')
    u = rng.normal(0.0, alpha, num_clients)
    big_b = rng.normal(0.0, beta, num_clients)
    scale_x = np.arange(1, DIMENSION + 1, dtype=np.float64) ** -0.6  # sqrt(j^-1.2)
    if iid:
        v = np.repeat(big_b[:, None], DIMENSION, axis=1)
        w_shared = rng.normal(0.0, 1.0, (DIMENSION, NUM_CLASSES))
        b_shared = rng.normal(0.0, 1.0, NUM_CLASSES)
    else:
        v = rng.normal(big_b[:, None], 1.0, (num_clients, DIMENSION))
    out = {}
    for split, counts in (('train', n_train), ('test', sizes - n_train)):
        rows = int(counts.sum())
        out[split] = (np.empty((rows, DIMENSION), np.float32), np.empty(rows, np.int32),
                      np.repeat(np.arange(num_clients, dtype=np.int32), counts))
    at = {'train': 0, 'test': 0}
    for k in range(num_clients):
        if iid:
            w, b = w_shared, b_shared
        else:
            w = rng.normal(u[k], 1.0, (DIMENSION, NUM_CLASSES))
            b = rng.normal(u[k], 1.0, NUM_CLASSES)
        n = int(sizes[k])
        x = v[k] + scale_x * rng.standard_normal((n, DIMENSION))
        y = np.argmax(x @ w + b, axis=1)  # argmax of softmax = argmax of logits
        order = rng.permutation(n)
        for split, idx in (('train', order[:n_train[k]]), ('test', order[n_train[k]:])):
            start, stop = at[split], at[split] + idx.size
            out[split][0][start:stop] = x[idx]
            out[split][1][start:stop] = y[idx]
            at[split] = stop
    name = 'synthetic_iid' if iid else f'synthetic_{alpha:g}_{beta:g}'
    (x_train, y_train, c_train), (x_test, y_test, c_test) = out['train'], out['test']
    return Dataset(name=name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                   num_classes=NUM_CLASSES, mean=(0.0,), std=(1.0,), client_ids_train=c_train,
                   client_ids_test=c_test)
