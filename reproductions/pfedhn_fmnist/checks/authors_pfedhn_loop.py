"""The pFedHN authors' training loop, written in PyTorch, on this library's Fashion-MNIST partition.

A check of how far pFedHN gets in a few hundred hypernetwork steps, not part of
the library: the loop of the authors' experiments/pfedhn/trainer.py (draw one
client, generate its model from its embedding, train it ``inner`` steps on
fresh random batches with the gradient norm clipped at 50, take the
vector-Jacobian product of theta - theta~ through the hypernetwork, clip at 50,
step SGD(1e-2, momentum 0.9, wd 1e-3)), with the authors' hypernetwork (an
embedding, 3 hidden ReLU layers of 100, one Linear head per target tensor,
PyTorch's default initialisation) generating the library's `mlp` (784-200-200-10).
Data: the partition of

    python -m fedjax_pfl.train --method pfedhn --dataset fmnist --model mlp --num-clients 10 \
        --rounds R --batch-size 32 --lr 0.05

(Dirichlet 0.1, 75/25 split, 6 of 10 clients a round; the partition of
``--seed S``, which also seeds the loop), built by the library's own partition code. ``--draw rounds`` visits 6 distinct clients per
"round" as the library does; ``--draw uniform`` draws each step's client
uniformly, as the authors. Prints the unweighted mean of per-client test
accuracy of the generated models after each 6 steps.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/pfedhn_fmnist/checks/authors_pfedhn_loop.py \
        --steps 48 --draw rounds
"""
import argparse
import random

import numpy as np
import torch
import torch.nn.functional as F

from fedjax_pfl.data import client_data
from fedjax_pfl.data.registry import load_dataset
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import partition_dataset

CLIENTS, PER_ROUND, SHAPES = 10, 6, [(200, 784), (200,), (200, 200), (200,), (10, 200), (10,)]


def clients(seed: int) -> list[tuple]:
    """Client i's (x_train, y_train, x_test, y_test), normalized, of the run with ``--seed seed``."""
    cfg = config_lib.build(overrides=["data.name=fmnist", "partition.scheme=dirichlet", "partition.num_clients=10"])
    ds = load_dataset("fmnist")
    fed = partition_dataset(ds, cfg.partition, seed)
    mean, std = np.asarray(ds.mean, np.float32), np.asarray(ds.std, np.float32)
    prep = lambda x: torch.tensor(((x.astype(np.float32) / 255.0 - mean) / std).reshape(len(x), -1))
    out = []
    for i in range(CLIENTS):
        (xtr, ytr), (xte, yte) = client_data.unpad(fed.train, i), client_data.unpad(fed.test, i)
        out.append((prep(xtr), torch.tensor(ytr).long(), prep(xte), torch.tensor(yte).long()))
    return out


class Hyper(torch.nn.Module):
    def __init__(self, embed_dim: int, hidden: int = 100, n_hidden: int = 3):
        super().__init__()
        self.embeddings = torch.nn.Embedding(CLIENTS, embed_dim)
        layers = [torch.nn.Linear(embed_dim, hidden)]
        for _ in range(n_hidden):
            layers += [torch.nn.ReLU(), torch.nn.Linear(hidden, hidden)]
        self.mlp = torch.nn.Sequential(*layers)
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden, int(np.prod(s))) for s in SHAPES)

    def forward(self, i: int) -> list[torch.Tensor]:
        h = self.mlp(self.embeddings(torch.tensor([i])))
        return [head(h).view(s) for head, s in zip(self.heads, SHAPES)]


def mlp(w, x):
    x = F.relu(F.linear(x, w[0], w[1]))
    x = F.relu(F.linear(x, w[2], w[3]))
    return F.linear(x, w[4], w[5])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=18)
    ap.add_argument("--inner", type=int, default=50)
    ap.add_argument("--inner-lr", type=float, default=0.05)
    ap.add_argument("--inner-momentum", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--draw", choices=["rounds", "uniform"], default="rounds")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed), random.seed(a.seed), torch.set_num_threads(1)
    data = clients(a.seed)
    hnet = Hyper(int(1 + CLIENTS / 4))
    opt = torch.optim.SGD(hnet.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-3)
    order: list[int] = []
    for step in range(a.steps):
        if a.draw == "uniform":
            i = random.randrange(CLIENTS)
        else:
            if not order:
                order = random.sample(range(CLIENTS), PER_ROUND)
            i = order.pop(0)
        generated = hnet(i)
        theta = [g.detach().clone().requires_grad_(True) for g in generated]
        inner = torch.optim.SGD(theta, lr=a.inner_lr, momentum=a.inner_momentum or 0)
        x, y = data[i][:2]
        for _ in range(a.inner):
            b = torch.randint(len(x), (min(a.batch, len(x)),)) if len(x) > a.batch else torch.arange(len(x))
            inner.zero_grad()
            F.cross_entropy(mlp(theta, x[b]), y[b]).backward()
            torch.nn.utils.clip_grad_norm_(theta, 50)
            inner.step()
        delta = [g.detach() - t.detach() for g, t in zip(generated, theta)]
        opt.zero_grad()
        grads = torch.autograd.grad(generated, list(hnet.parameters()), grad_outputs=delta)
        for p, g in zip(hnet.parameters(), grads):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(hnet.parameters(), 50)
        opt.step()
        if (step + 1) % PER_ROUND == 0:
            with torch.no_grad():
                acc = [(mlp(hnet(k), data[k][2]).argmax(1) == data[k][3]).float().mean().item()
                       for k in range(CLIENTS)]
            print(f"step {step + 1} (round {(step + 1) // PER_ROUND}) unweighted {np.mean(acc):.4f}", flush=True)


if __name__ == "__main__":
    main()
