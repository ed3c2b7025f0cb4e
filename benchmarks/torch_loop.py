"""The usual PyTorch PFL simulator, written here to time against (needs the `bench` extra).

Its shape is PFLlib's: one model copy per client, a shuffled DataLoader per
client (``drop_last=False``, so the last batch of an epoch may be partial), one
optimizer step per batch, clients one after another in a Python loop; the
server sends its model (FedAvg) or its body (FedPer), averages what comes back
with weights n_i, and every client is evaluated on its own test set (FedAvg:
the global model; FedPer: global body + own head). The models match
``fedjax_pfl.models.networks`` layer for layer (conv 5x5 VALID, ReLU, 2x2 max-pool,
twice, Dense 512 ReLU, Dense C for ``fedavgcnn``; Dense+ReLU per hidden size,
Dense C for ``mlp``); their initial values are PyTorch's own, which does not
change the time of a step. Data arrive as NumPy arrays already normalised,
NHWC, and are stored NCHW float32 as PFLlib stores them.
"""

from __future__ import annotations

import copy
import math
import os
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def set_threads() -> int:
    """torch.set_num_threads(cores of this machine, or $TORCH_BENCH_THREADS); returns the count.

    On a machine loaded by other work, more threads than free cores make PyTorch's
    steps several times slower (measured: 4x at 2 threads on 2 busy cores):
    time on a quiet machine, and read the load average in the record.
    """
    n = int(os.environ.get("TORCH_BENCH_THREADS") or os.cpu_count() or 1)
    torch.set_num_threads(n)
    return n


class BodyHead(nn.Module):
    def __init__(self, body: nn.Module, head: nn.Module):
        super().__init__()
        self.body, self.head = body, head

    def forward(self, x):
        return self.head(self.body(x))


def build_model(name: str, input_shape, num_classes: int, hidden=(200, 200)) -> BodyHead:
    """``fedavgcnn`` or ``mlp`` as fedjax_pfl.models.networks builds them; ``input_shape`` is (H, W, C)."""
    if name == "fedavgcnn":
        h, w, c = input_shape
        side = lambda s: ((s - 4) // 2 - 4) // 2  # noqa: E731 (two conv5 VALID + pool2)
        body = nn.Sequential(
            nn.Conv2d(c, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * side(h) * side(w), 512), nn.ReLU())
        return BodyHead(body, nn.Linear(512, num_classes))
    if name == "mlp":
        layers, width = [nn.Flatten()], int(np.prod(input_shape))
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        return BodyHead(nn.Sequential(*layers), nn.Linear(width, num_classes))
    raise ValueError(f"no PyTorch twin of model {name!r} (fedavgcnn, mlp)")


def to_tensors(x: np.ndarray, y: np.ndarray, device) -> TensorDataset:
    x = torch.from_numpy(np.ascontiguousarray(np.asarray(x, np.float32)))
    if x.ndim == 4:
        x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
    return TensorDataset(x.to(device), torch.from_numpy(np.asarray(y, np.int64)).to(device))


class Simulator:
    """FedAvg / FedPer over per-client (x, y) arrays, PFLlib style."""

    def __init__(self, method: str, model: BodyHead, train, test, *, batch_size: int, local_epochs: int,
                 lr: float, eval_batch_size: int = 256, device="cpu", seed: int = 0):
        if method not in ("fedavg", "fedper"):
            raise ValueError(f"the PyTorch loop has fedavg and fedper, not {method!r}")
        torch.manual_seed(seed)
        self.method, self.device = method, torch.device(device)
        self.global_model = model.to(self.device)
        self.clients = [copy.deepcopy(self.global_model) for _ in train]
        self.optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in self.clients]
        self.sizes = [len(y) for _, y in train]
        generator = torch.Generator().manual_seed(seed)
        self.train_loaders = [DataLoader(to_tensors(x, y, self.device), batch_size=batch_size, shuffle=True,
                                         drop_last=False, generator=generator) for x, y in train]
        self.test_loaders = [DataLoader(to_tensors(x, y, self.device), batch_size=eval_batch_size,
                                        shuffle=False) for x, y in test]
        self.local_epochs = local_epochs
        self.loss = nn.CrossEntropyLoss()

    def _shared(self, model: BodyHead) -> nn.Module:
        return model if self.method == "fedavg" else model.body

    def send(self, client: int) -> None:
        self._shared(self.clients[client]).load_state_dict(self._shared(self.global_model).state_dict())

    def train_client(self, client: int) -> None:
        model, opt = self.clients[client], self.optimizers[client]
        model.train()
        for _ in range(self.local_epochs):
            for x, y in self.train_loaders[client]:
                opt.zero_grad()
                self.loss(model(x), y).backward()
                opt.step()

    @torch.no_grad()
    def aggregate(self, selected) -> None:
        total = float(sum(self.sizes[c] for c in selected))
        target = self._shared(self.global_model)
        for p in target.parameters():
            p.zero_()
        for c in selected:
            for p, q in zip(target.parameters(), self._shared(self.clients[c]).parameters()):
                p.add_(q, alpha=self.sizes[c] / total)

    def train_round(self, selected) -> None:
        for c in selected:
            self.send(c)
            self.train_client(c)
        self.aggregate(selected)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Per-client correct / count / loss sum on each client's test set."""
        correct, count, loss_sum = [], [], []
        for c, loader in enumerate(self.test_loaders):
            self.send(c)
            model = self.clients[c]
            model.eval()
            right = seen = nll = 0.0
            for x, y in loader:
                logits = model(x)
                right += float((logits.argmax(1) == y).sum())
                seen += len(y)
                nll += float(self.loss(logits, y)) * len(y)
            correct.append(right)
            count.append(seen)
            loss_sum.append(nll)
        return {"correct": np.array(correct), "count": np.array(count), "loss_sum": np.array(loss_sum)}

    def warm_up(self) -> None:
        """One step of client 0 on a throwaway copy and one evaluation batch: no one-off costs in timings."""
        model = copy.deepcopy(self.clients[0])
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        x, y = next(iter(self.train_loaders[0]))
        self.loss(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            model(next(iter(self.test_loaders[0]))[0])

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def time_rounds(sim: Simulator, rounds: int, selected_per_round) -> dict:
    """Median train and evaluation seconds per round over ``rounds`` timed rounds."""
    sim.warm_up()
    train_s, eval_s = [], []
    evaluation = None
    for t in range(rounds):
        start = time.perf_counter()
        sim.train_round(selected_per_round(t))
        sim.synchronize()
        mid = time.perf_counter()
        evaluation = sim.evaluate()
        sim.synchronize()
        train_s.append(mid - start)
        eval_s.append(time.perf_counter() - mid)
    params = [p for m in (sim.global_model, *sim.clients) for p in m.parameters()]
    if not all(bool(torch.isfinite(p).all()) for p in params):
        raise RuntimeError("PyTorch loop: non-finite parameters")
    return {"train_s": float(np.median(train_s)), "eval_s": float(np.median(eval_s)), "evaluation": evaluation}


def steps_per_round(sizes, batch_size: int, epochs: int) -> int:
    return int(sum(epochs * math.ceil(n / batch_size) for n in sizes))
