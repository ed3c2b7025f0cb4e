"""train.augment (kernels/augmentation.py, local_training): crop + flip against an exhaustive search,
its offsets and flips drawn uniformly, and its place in local training (before normalize, own key stream)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.data.client_data import ClientData
from fedjax_pfl.kernels import local_training
from fedjax_pfl.kernels.augmentation import random_crop_flip


def _which_transform(image, out, padding):
    """(top, left, flipped) such that ``out`` is that crop of the zero-padded ``image``; None if none is."""
    h, w = image.shape[:2]
    padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
    found = [(t, l, f) for t in range(2 * padding + 1) for l in range(2 * padding + 1) for f in (False, True)
             if np.array_equal(out, (lambda c: c[:, ::-1] if f else c)(padded[t:t + h, l:l + w]))]
    return found[0] if found else None


def test_each_image_is_a_crop_of_its_zero_padded_self_maybe_flipped():
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, size=(400, 5, 6, 3), dtype=np.uint8)  # no zeros: padding is recognisable
    out = np.asarray(random_crop_flip(jax.random.key(1), jnp.asarray(images), padding=2))
    assert out.dtype == np.uint8 and out.shape == images.shape
    found = [_which_transform(i, o, 2) for i, o in zip(images, out)]
    assert all(f is not None for f in found)
    offsets = {(t, l) for t, l, _ in found}
    assert offsets == {(t, l) for t in range(5) for l in range(5)}  # all 25 offsets drawn over 400 images
    flips = np.mean([f for _, _, f in found])
    assert 0.4 < flips < 0.6, flips
    assert (out == 0).any()  # off-centre crops bring in black padding


def test_different_keys_different_batches_same_key_same_batch():
    images = jnp.asarray(np.random.default_rng(1).integers(0, 256, size=(8, 8, 8, 1), dtype=np.uint8))
    a, b = random_crop_flip(jax.random.key(0), images), random_crop_flip(jax.random.key(0), images)
    c = random_crop_flip(jax.random.key(1), images)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def _train(augment, normalize=lambda x: x.astype(jnp.float32) / 255.0, seen=None):
    x = jnp.asarray(np.random.default_rng(2).integers(0, 256, size=(10, 4, 4, 1), dtype=np.uint8))
    data = ClientData(x, jnp.zeros(10, jnp.int32), jnp.asarray(9))

    def objective(variables, batch, key):
        if seen is not None:
            jax.debug.callback(lambda v: seen.append(np.asarray(v)), batch.x)
        pred = jnp.sum(batch.x * variables["params"]["w"], axis=(1, 2, 3))
        loss = jnp.sum(jnp.where(batch.mask, (pred - 1.0) ** 2, 0.0)) / jnp.maximum(batch.mask.sum(), 1)
        return loss + 0.0 * jax.random.uniform(key), None

    variables = {"params": {"w": jnp.zeros((4, 4, 1))}}
    out, loss, _ = local_training.train_with_state(objective, optax.sgd(0.05), variables, data, jax.random.key(3),
                                                   batch_size=4, max_epochs=2, epochs=2, normalize=normalize, drop_last=False,
                                                   augment=augment)
    return np.asarray(out["params"]["w"]), float(loss)


def test_local_training_augments_each_stored_batch_before_normalize():
    plain = _train(None)
    assert np.array_equal(_train(lambda key, x: x)[0], plain[0])  # an identity augmentation changes nothing
    assert not np.allclose(_train(random_crop_flip)[0], plain[0])  # crop + flip changes the steps
    seen = []
    _train(lambda key, x: jnp.zeros_like(x), normalize=lambda x: x.astype(jnp.float32) + 1.0, seen=seen)
    assert seen and all(np.all(b == 1.0) for b in seen)  # augment saw the stored batch, normalize came after


def test_augmented_fedpac_run_trains_and_differs(data_dir):
    method = "fedpac"  # the preset that augments (configs/fedpac_cifar10.yaml); a CNN on FMNIST here
    import pfl_reference as ref

    plain = ref.run_engine(ref.fmnist_engine(data_dir, method, ("model.name=fedavgcnn", "model.hidden=null", "train.local_epochs=1")), 1)
    aug = ref.run_engine(ref.fmnist_engine(data_dir, method, ("model.name=fedavgcnn", "model.hidden=null", "train.local_epochs=1",
                                                              "train.augment=crop_flip")), 1)
    assert np.isfinite(float(aug[2]["train_loss"]))
    assert float(aug[2]["train_loss"]) != float(plain[2]["train_loss"])


def test_step_counted_random_batches_are_augmented_too():
    from fedjax_pfl.methods.step_counted import random_batch

    x = jnp.asarray(np.random.default_rng(3).integers(1, 256, size=(7, 4, 4, 1), dtype=np.uint8))
    data = ClientData(x, jnp.zeros(7, jnp.int32), jnp.asarray(7))
    key, normalize = jax.random.key(4), lambda v: v.astype(jnp.float32)
    plain = random_batch(key, data, 3, normalize)
    assert np.array_equal(random_batch(key, data, 3, normalize, lambda k, v: v).x, plain.x)  # same rows drawn
    blacked = random_batch(key, data, 3, normalize, lambda k, v: jnp.zeros_like(v))
    assert np.all(np.asarray(blacked.x) == 0.0) and np.array_equal(blacked.y, plain.y)
