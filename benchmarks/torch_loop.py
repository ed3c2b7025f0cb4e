"""The usual PyTorch PFL simulator, written here to time against (needs the `bench` extra).

Its shape is PFLlib's: one model copy per client, a shuffled DataLoader per
client (``drop_last=False``, so the last batch of an epoch may be partial), one
optimizer step per batch, clients one after another in a Python loop; the
server sends its model (FedAvg) or its body (FedPer), averages what comes back
with weights n_i, and every client is evaluated on its own test set (FedAvg:
the global model; FedPer: global body + own head). The models match
``fedjax_pfl.models.networks`` layer for layer (conv 5x5 VALID, ReLU, 2x2 max-pool,
twice, Dense 512 ReLU, Dense C for ``fedavgcnn``; the same with 6 and 16
channels and Dense 120, 84 for ``lenet``; the CIFAR ResNet-8 (3x3 stem, one
BasicBlock per stage of 16/32/64 channels, BatchNorm, 1x1 shortcut where the
shape changes, global average pool) for ``resnet8``; Dense+ReLU per hidden
size, Dense C for ``mlp``); their initial values are PyTorch's own, which
does not change the time of a step. Data arrive as NumPy arrays already normalised,
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


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN layers with a residual connection; a 1x1 conv + BN shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.main(x) + self.shortcut(x))


def _conv_pool_body(c, h, w, channels, hidden):
    """conv 5x5 VALID + ReLU + 2x2 max-pool per channel count, flatten, Dense + ReLU per hidden size."""
    layers, side_h, side_w = [], h, w
    for cout in channels:
        layers += [nn.Conv2d(c, cout, 5), nn.ReLU(), nn.MaxPool2d(2)]
        c, side_h, side_w = cout, (side_h - 4) // 2, (side_w - 4) // 2
    layers.append(nn.Flatten())
    width = c * side_h * side_w
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return nn.Sequential(*layers), width


def build_model(name: str, input_shape, num_classes: int, hidden=(200, 200)) -> BodyHead:
    """``fedavgcnn``, ``lenet``, ``resnet8``, ``mlp`` or ``mlr`` as fedjax_pfl.models.networks builds them;
    ``input_shape`` is (H, W, C)."""
    if name in ("fedavgcnn", "lenet"):
        h, w, c = input_shape
        channels, dense = ((32, 64), (512,)) if name == "fedavgcnn" else ((6, 16), (120, 84))
        body, width = _conv_pool_body(c, h, w, channels, dense)
        return BodyHead(body, nn.Linear(width, num_classes))
    if name == "resnet8":
        c = input_shape[-1]
        body = nn.Sequential(nn.Conv2d(c, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                             BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten())
        return BodyHead(body, nn.Linear(64, num_classes))
    if name in ("mlp", "mlr"):  # the MLR: no hidden layer
        layers, width = [nn.Flatten()], int(np.prod(input_shape))
        for size in (hidden if name == "mlp" else ()):
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        return BodyHead(nn.Sequential(*layers), nn.Linear(width, num_classes))
    raise ValueError(f"no PyTorch twin of model {name!r} (fedavgcnn, lenet, resnet8, mlp, mlr)")


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


def sgd_steps_seconds(name: str, input_shape, num_classes: int, batch: int, steps: int = 50, reps: int = 3) -> float:
    """Seconds per SGD step (zero_grad, forward, cross-entropy, backward, step) of a model on random batches,
    best of ``reps`` loops of ``steps`` after a warm-up loop: the PyTorch twin of flops.sgd_steps_seconds."""
    model = build_model(name, input_shape, num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.005)
    h, w, c = input_shape
    x = torch.randn(steps, batch, c, h, w)
    y = torch.randint(0, num_classes, (steps, batch))

    def run():
        for i in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i]), y[i]).backward()
            opt.step()

    run()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best / steps


def matmul_peak(n: int = 2048, reps: int = 3, chain: int = 10) -> float:
    """Best FLOP/s of ``chain`` n x n float32 matmuls with torch.mm (this process's thread count)."""
    a, b = torch.randn(n, n), torch.randn(n, n) / n ** 0.5
    best = float("inf")
    for _ in range(reps + 1):
        start = time.perf_counter()
        c = a
        for _ in range(chain):
            c = torch.mm(c, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n ** 3 * chain / best
