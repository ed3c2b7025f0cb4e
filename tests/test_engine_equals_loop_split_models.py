"""The engine equals a per-client Python loop for the split-model baselines: LG-FedAvg,
FedBABU, FedRoD and FedALA, two rounds each on tests/split_model_federation.py's clients.

The loop shares only the documented key contract with the engine (how a round
key becomes client keys, each method's key splits, local_training's per-epoch
shuffling); it trains over real batches only and averages in float64. One loop
serves the four methods, whose rounds differ only in what a client trains and
uploads.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import split_model_federation as fed
from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.fedala import FedALAConfig
from settings_records import engine_config


def _reference_train(loss_fn, params, x, y, key, epochs, optimizer):
    """Unpadded per-batch loop with local_training's shuffling contract (max_epochs = epochs)."""
    n, n_max = x.shape[0], max(fed.SIZES)
    epoch_keys = jax.random.split(jax.random.split(key)[0], epochs)
    grad = jax.value_and_grad(loss_fn)  # eager: tiny MLP, and no compile per closure
    state = optimizer.init(params)
    epoch_losses = []
    for e in range(epochs):
        order = np.asarray(local_training.epoch_order(epoch_keys[e], n, n_max))[:n]
        batch_losses = []
        for s in range(math.ceil(n / fed.B)):
            b = order[s * fed.B:(s + 1) * fed.B]
            loss, g = grad(params, fed.normalize(x[b]), y[b])
            updates, state = optimizer.update(g, state, params)
            params = optax.apply_updates(params, updates)
            batch_losses.append(float(loss))
        epoch_losses.append(np.mean(batch_losses) if batch_losses else 0.0)
    return params, epoch_losses


def _mean64(trees, weights):
    w = np.asarray(weights, np.float64) / np.sum(weights)
    return jax.tree.map(lambda *a: sum(wi * np.asarray(ai, np.float64) for wi, ai in zip(w, a)), *trees)


def _ce(model, part_of_params):
    def loss(p, xb, yb):
        return losses.cross_entropy(model.apply({"params": part_of_params(p)}, xb).logits, yb)
    return loss


def _rod_loss(model, counts):
    shift = jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.0)), -jnp.inf)

    def loss(p, xb, yb):
        out = model.apply({"params": {"body": p["body"], "head": p["head"]}}, xb)
        personal = model.apply_head({"params": {"head": p["personal"]}}, jax.lax.stop_gradient(out.features))
        return (losses.cross_entropy(out.logits + shift, yb)
                + losses.cross_entropy(jax.lax.stop_gradient(out.logits) + personal, yb))
    return loss


def _ala_reference(model, hp, local, glob, w, started, x, y, key):
    """FedALA's initialisation as the authors' loop, on the random slice the key picks."""
    if all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(local), jax.tree.leaves(glob))):
        return local, w, started
    k_slice, k_epochs = jax.random.split(key)
    n = x.shape[0]
    size = int(hp.rand_percent / 100.0 * n)
    start = int(jax.random.randint(k_slice, (), 0, n - size + 1))
    xs, ys = x[start:start + size], y[start:start + size]
    top = lambda p: {"head": p["head"]}  # layers=1: the logits layer  # noqa: E731

    def loss(wt, xb, yb):
        mixed = jax.tree.map(lambda l, g, a: l + (g - l) * a, top(local), top(glob), wt)
        return losses.cross_entropy(model.apply({"params": {"body": glob["body"], **mixed}}, xb).logits, yb)

    project = optax.GradientTransformation(
        lambda p: optax.EmptyState(),
        lambda g, s, p: (jax.tree.map(lambda gi, pi: jnp.clip(pi - hp.eta * gi, 0, 1) - pi, g, p), s))
    history = []
    for e in range(1 if started else hp.max_start_epochs):
        w, epoch_loss = _reference_train(loss, w, xs, ys, jax.random.fold_in(k_epochs, e), 1, project)
        history += epoch_loss
        if not started and len(history) > hp.num_pre_loss and np.std(history[-hp.num_pre_loss:]) < hp.threshold:
            break
    mixed = jax.tree.map(lambda l, g, a: l + (g - l) * a, top(local), top(glob), w)
    return {"body": glob["body"], **mixed}, w, True


def _reference_rounds(name, model, rounds, key, hp=None):
    x, y, idx = fed.raw()
    opt = optax.sgd(0.1, momentum=0.9)
    init_key, key = jax.random.split(key)
    v0 = model.init(init_key)["params"]
    glob, local = v0, [v0] * len(fed.SIZES)
    personal = [v0["head"]] * len(fed.SIZES)
    ala_w = [{"head": jax.tree.map(jnp.ones_like, v0["head"])}] * len(fed.SIZES)
    started = [False] * len(fed.SIZES)
    for t in range(rounds):
        k_sel, _, k_clients = jax.random.split(jax.random.fold_in(key, t), 3)
        selected = np.asarray(engine_lib.select_clients(k_sel, len(fed.SIZES), fed.S))
        keys = jax.random.split(k_clients, fed.S)
        uploads = []
        for j, c in enumerate(selected):
            xc, yc, kc = x[idx[c]], y[idx[c]], keys[j]
            if name == "lgfedavg":
                start = {"body": local[c]["body"], "head": glob["head"]}
                local[c], _ = _reference_train(_ce(model, lambda p: p), start, xc, yc, kc, fed.E, opt)
                uploads.append(local[c]["head"])
            elif name == "fedbabu":
                head = local[c]["head"]
                body, _ = _reference_train(_ce(model, lambda p: {"body": p, "head": head}), glob["body"],
                                           xc, yc, kc, fed.E, opt)
                local[c] = {"body": body, "head": head}
                uploads.append(body)
            elif name == "fedrod":
                counts = jnp.asarray(np.bincount(yc, minlength=fed.C), jnp.float32)
                start = {**glob, "personal": personal[c]}
                trained, _ = _reference_train(_rod_loss(model, counts), start, xc, yc, kc, fed.E, opt)
                personal[c] = trained.pop("personal")
                uploads.append(trained)
            elif name == "fedala":  # trains from its model of the last ALA step
                local[c], _ = _reference_train(_ce(model, lambda p: p), local[c], xc, yc, kc, fed.E, opt)
                uploads.append(local[c])
        mean = _mean64(uploads, [fed.SIZES[c] for c in selected])
        glob = {**glob, "head": mean} if name == "lgfedavg" else {**glob, "body": mean} if name == "fedbabu" else mean
        if name == "fedala":  # ALA on EVERY client with the new global model, as the authors' server
            every = engine_lib.every_client_keys(jax.random.fold_in(key, t), len(fed.SIZES))
            for c in range(len(fed.SIZES)):
                local[c], ala_w[c], started[c] = _ala_reference(model, hp, local[c], glob, ala_w[c], started[c],
                                                                x[idx[c]], y[idx[c]], every[c])
    return glob, local, personal


@pytest.mark.parametrize("name", ["lgfedavg", "fedbabu", "fedrod", "fedala"])
def test_engine_equals_per_client_loop(name):
    """Two rounds, ragged clients (sizes 1..23, B=5), SGD with momentum, chunked vmap (S=3, chunks of 2)."""
    model = fed.mlp()
    key = jax.random.key(3)
    hp = FedALAConfig(max_start_epochs=3, num_pre_loss=2, threshold=0.02) if name == "fedala" else None
    glob, local, personal = _reference_rounds(name, model, 2, key, hp)
    x, y, idx = fed.raw()
    train = stack_clients(x, y, idx)
    method = get_method(name)(fed.setup(model), hp)
    eng = engine_lib.Engine(method, train, train,
                            engine_config(fed.S, client_mapping="chunked", chunk_size=2))
    server, clients = fed.run(eng, 2, key)
    if name == "lgfedavg":
        fed.close(server["head"]["params"], glob["head"])
    elif name == "fedbabu":
        fed.close(server["body"]["params"], glob["body"])
    else:
        fed.close(server["variables"]["params"], glob)
    for c in range(len(fed.SIZES)):
        if name == "fedrod":
            fed.close(tree_ops.gather(clients["head"], c), personal[c])
        else:
            fed.close(tree_ops.gather(clients["variables"]["params"], c), local[c])
