"""The FedAS authors' training loop, written per client in PyTorch, on this library's clients.

A check of the table's FedAS cells, not part of the library: it tells a gap to
the paper that lies in the data or the setting from one that lies in this
library's FedAS. It follows the authors' released code (the FedAS repository
of Yang, Huang and Ye, a PFLlib fork: system/flcore/servers/serveras.py and
system/flcore/clients/clientas.py) as `main.py -algo FedAS -m cnn -lbs 16 -ls 5
-lr 0.005 -nc 20 -jr 0.6` runs it (no lr decay: its -ld default), rewritten
here client by client:

- The model is PFLlib's FedAvgCNN split into a base (two conv5x5 + ReLU +
  maxpool layers, the 512-unit dense layer) and a head (the last linear layer);
  the server and every client start from one initialisation.
- Round i = 0, 1, ..., R: int(N P) clients are drawn; every client is tested
  with its own model (accuracy pooled over the test samples; this comes before
  the round's training, so the test of round i sees i rounds of training);
  then each drawn client, in id order, receives the server's model: it takes
  the mean feature of each class of its own current base over its train
  batches, trains the SERVER's base in place for one epoch of SGD (lr 0.01) on
  the sum over the classes in a batch of the mean squared distance of the
  features to their class mean, and copies that base into its own model (so
  the second client aligns the base the first one aligned: the released code
  hands every client the same server object). Then each drawn client trains
  E epochs of cross-entropy (SGD lr 0.005, batch 16) and measures its Fisher
  trace: the sum over its train batches of the squared norm of the gradient
  of the batch-mean NLL with respect to all parameters (the released code
  measures it on every client, and uses the drawn ones' only). The server
  model becomes the average of the drawn clients' whole models weighted by
  their Fisher traces (only the base is ever sent back).
- Batches: PFLlib's loaders as the fork sets them, in storage order (no
  shuffling) and without the last partial batch (drop_last).

So that its rounds can be set beside the library's run round by round, the
initial parameters are this library's for the seed (`Engine.init` on the
run's init key, its FedAvgCNN weights laid out as PyTorch's) and each round's
drawn clients are the ones the library draws for the seed (its round keys):
the numbers then differ only by what the two codes do differently (the
batches' order and the last partial batch, the alignment's chaining and its
round 0, float arithmetic), which the notes beside this file list.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/fedas_table3/checks/authors_fedas_loop.py ROUNDS [SEED] \\
        [key.sub=value ...]    (overrides of configs/fedas_cifar10.yaml; data.name=cifar10_jpeg is set)

It prints one line per test (round, pooled and unweighted accuracy, seconds), the clients drawn and their
Fisher weights. THREADS (environment, default 2): PyTorch's threads. READING=library (environment) runs
the same loop the way this library reads FedAS instead (each drawn client aligns its own copy of the
received base, none in round 0, batches shuffled every epoch with the last partial one kept), so that what
the readings change can be told from what the two codes' batch orders change.
"""
import copy
import os
import sys
import time
from typing import NamedTuple

import jax
import numpy as np
import torch
import torch.nn.functional as F

from fedjax_pfl.data import client_data
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import build_experiment, validate

PRESET = "configs/fedas_cifar10.yaml"
ALIGN_LR, ALIGN_BATCH = 0.01, 16


class FedAvgCNN(torch.nn.Module):
    """PFLlib's FedAvgCNN for 32x32x3 inputs as base + head (main.py's BaseHeadSplit)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.base = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(1600, 512), torch.nn.ReLU())
        self.head = torch.nn.Linear(512, num_classes)

    def forward(self, x):
        return self.head(self.base(x))


def torch_state(params: dict) -> dict:
    """This library's FedAvgCNN parameters (Flax, NHWC) as the PyTorch model's state dict (NCHW: the dense
    layer's inputs reordered from (h, w, c) to (c, h, w))."""
    body, head = params["body"], params["head"]["logits"]
    conv = lambda k: torch.tensor(np.asarray(k).transpose(3, 2, 0, 1))  # noqa: E731  HWIO -> OIHW
    dense = np.asarray(body["mlp"]["dense0"]["kernel"]).reshape(5, 5, 64, 512).transpose(2, 0, 1, 3)
    return {"base.0.weight": conv(body["conv0"]["kernel"]), "base.0.bias": torch.tensor(np.asarray(body["conv0"]["bias"])),
            "base.3.weight": conv(body["conv1"]["kernel"]), "base.3.bias": torch.tensor(np.asarray(body["conv1"]["bias"])),
            "base.7.weight": torch.tensor(dense.reshape(1600, 512).T.copy()),
            "base.7.bias": torch.tensor(np.asarray(body["mlp"]["dense0"]["bias"])),
            "head.weight": torch.tensor(np.asarray(head["kernel"]).T.copy()),
            "head.bias": torch.tensor(np.asarray(head["bias"]))}


class Reading(NamedTuple):
    """How the loop reads FedAS: the released code's way (the default) or this library's (READING=library)."""

    chained: bool  # each drawn client aligns the server's base in place (True) or its own copy of it
    align_first_round: bool  # round 0 aligns too (True) or skips it (no previous local base)
    shuffle: torch.Generator | None  # None: batches in storage order; else a new order every epoch
    drop_last: bool  # the last partial batch dropped

    @staticmethod
    def named(name: str, seed: int) -> "Reading":
        if name == "authors":
            return Reading(True, True, None, True)
        if name == "library":
            return Reading(False, False, torch.Generator().manual_seed(seed), False)
        raise SystemExit(f"READING must be authors or library, got {name!r}")


def batches(x, y, size: int, reading: Reading, shuffled: bool = True):
    """The batches of one pass: the fork's DataLoader(shuffle=False, drop_last=True), or shuffled (training and
    alignment passes, when ``reading`` shuffles) with the partial last batch kept."""
    order = (torch.randperm(len(x), generator=reading.shuffle) if shuffled and reading.shuffle is not None
             else torch.arange(len(x)))
    for s in range(0, len(x) - size + 1 if reading.drop_last else len(x), size):
        yield x[order[s:s + size]], y[order[s:s + size]]


def class_means(model, x, y, num_classes: int, size: int, reading: Reading) -> list:
    """Mean base feature of each class over the client's train batches (None for a class it lacks)."""
    sums, counts = [None] * num_classes, [0] * num_classes
    with torch.no_grad():
        for xb, yb in batches(x, y, size, reading, shuffled=False):
            feats = model.base(xb)
            for c in yb.unique().tolist():
                rows = feats[yb == c]
                sums[c] = rows.sum(0) if sums[c] is None else sums[c] + rows.sum(0)
                counts[c] += len(rows)
    return [None if counts[c] == 0 else sums[c] / counts[c] for c in range(num_classes)]


def align(server, means, x, y, size: int, reading: Reading) -> None:
    """One epoch of SGD on the server's base: per batch, the sum over its classes of MSE(features, class mean)."""
    opt = torch.optim.SGD(server.base.parameters(), lr=ALIGN_LR)
    for xb, yb in batches(x, y, size, reading):
        feats = server.base(xb)
        loss = sum(F.mse_loss(feats[yb == c], means[c].expand_as(feats[yb == c]))
                   for c in yb.unique().tolist() if means[c] is not None)
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(model, x, y, epochs: int, size: int, lr: float, reading: Reading) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for xb, yb in batches(x, y, size, reading):
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()


def fisher_trace(model, x, y, size: int, reading: Reading) -> float:
    """Sum over the train batches of the squared gradient norm of the batch-mean NLL (all parameters)."""
    total = 0.0
    for xb, yb in batches(x, y, size, reading, shuffled=False):
        nll = -F.log_softmax(model(xb), dim=1)[torch.arange(len(yb)), yb].mean()
        total += sum(float((g ** 2).sum()) for g in torch.autograd.grad(nll, list(model.parameters())))
    return total


def test(models, clients) -> tuple[float, float]:
    """(pooled accuracy over all test samples, unweighted mean of the clients' accuracies)."""
    correct, sizes = [], []
    with torch.no_grad():
        for model, c in zip(models, clients):
            correct.append(int((model(c["x_test"]).argmax(1) == c["y_test"]).sum()))
            sizes.append(len(c["y_test"]))
    return sum(correct) / sum(sizes), float(np.mean(np.asarray(correct) / np.asarray(sizes)))


def library_clients(exp) -> list[dict]:
    """The library run's clients as float32 NCHW tensors, normalised as its runs normalise them."""
    out = []
    for i in range(exp.data.train.num_clients):
        (xtr, ytr), (xte, yte) = client_data.unpad(exp.data.train, i), client_data.unpad(exp.data.test, i)
        prep = lambda x: torch.tensor(exp.dataset.normalize(x).transpose(0, 3, 1, 2).copy())  # noqa: E731
        out.append({"x_train": prep(xtr), "y_train": torch.tensor(ytr).long(),
                    "x_test": prep(xte), "y_test": torch.tensor(yte).long()})
    return out


def main(rounds: int, seed: int, overrides: list[str]) -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    reading = Reading.named(os.environ.get("READING", "authors"), seed)
    cfg = config_lib.build(PRESET, ["data.name=cifar10_jpeg", f"seed={seed}", *overrides])
    exp = build_experiment(validate(cfg))
    print(exp.partition_text, flush=True)
    clients = library_clients(exp)
    init_key, key = jax.random.split(jax.random.key(cfg.seed))
    _, state = exp.engine.init(init_key)
    first = jax.tree.map(lambda a: a[0], state["variables"]["params"])
    server = FedAvgCNN()
    server.load_state_dict(torch_state(first))
    models = [FedAvgCNN() for _ in clients]
    for m in models:
        m.load_state_dict(server.state_dict())
    n, b, e = len(clients), cfg.train.batch_size, cfg.train.local_epochs
    count = engine_lib.clients_per_round(n, cfg.train.join_ratio)
    start = time.time()
    for r in range(rounds + 1):
        pooled, mean = test(models, clients)
        print(f"round {r} accuracy_weighted {pooled:.4f} accuracy {mean:.4f} ({time.time() - start:.0f} s)", flush=True)
        if r == rounds:
            break
        k_sel = jax.random.split(engine_lib.round_keys(key, r)[0], 3)[0]
        drawn = sorted(int(i) for i in engine_lib.select_clients(k_sel, n, count))
        print(f"round {r + 1} drawn: {drawn}", flush=True)
        for i in drawn:
            c = clients[i]
            received = server if reading.chained else copy.deepcopy(server)
            if r > 0 or reading.align_first_round:
                align(received, class_means(models[i], c["x_train"], c["y_train"], 10, ALIGN_BATCH, reading),
                      c["x_train"], c["y_train"], ALIGN_BATCH, reading)
            for mine, theirs in zip(models[i].base.parameters(), received.base.parameters()):
                mine.data = theirs.data.clone()
        traces = {}
        for i in drawn:  # (the released code measures every client's trace; only the drawn ones' are used)
            c = clients[i]
            train(models[i], c["x_train"], c["y_train"], e, b, cfg.train.lr, reading)
            traces[i] = fisher_trace(models[i], c["x_train"], c["y_train"], b, reading)
        weights = np.asarray([traces[i] for i in drawn]) / sum(traces[i] for i in drawn)
        print(f"round {r + 1} fisher weights: {', '.join(f'{w:.3f}' for w in weights)}", flush=True)
        averaged = {k: sum(float(w) * models[i].state_dict()[k] for w, i in zip(weights, drawn))
                    for k in server.state_dict()}
        server.load_state_dict(averaged)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 and "=" not in sys.argv[2] else 0,
         [a for a in sys.argv[2:] if "=" in a])
