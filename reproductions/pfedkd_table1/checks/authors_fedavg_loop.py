"""The pFedKD-WCL authors' FedAvg loop, written per client in PyTorch, on this library's Synthetic data.

A check of the table's FedAvg gap, not part of the library: if the authors'
algorithm, run client after client as their code does (10 of 100 clients a
round, 20 full epochs of B=20 SGD at lr 0.01, n_i-weighted average, the global
model evaluated on every client, unweighted mean), lands where
`python -m fedjax_pfl.train --config configs/pfedkd_synthetic.yaml --method
fedavg --seed S` does on the same data, the gap to the paper lies in the data.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/pfedkd_table1/checks/authors_fedavg_loop.py SEED ROUNDS
"""
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedjax_pfl.data.synthetic import load_synthetic

CLIENTS, PER_ROUND, EPOCHS, BATCH, LR = 100, 10, 20, 20, 0.01


def client_tensors(seed: int) -> list[tuple]:
    """(x_train, y_train, x_test, y_test) per client of the preset's data (size factor 5, data seed = seed)."""
    d = load_synthetic(num_clients=CLIENTS, seed=seed, size_factor=5)
    out = []
    for k in range(CLIENTS):
        tr, te = d.client_ids_train == k, d.client_ids_test == k
        out.append((torch.tensor(d.x_train[tr]), torch.tensor(d.y_train[tr]).long(),
                    torch.tensor(d.x_test[te]), torch.tensor(d.y_test[te]).long()))
    return out


def accuracies(model, clients) -> list[float]:
    with torch.no_grad():
        return [(model(c[2]).argmax(1) == c[3]).float().mean().item() for c in clients]


def weighted_round(server: dict, clients, train_one) -> dict:
    """One round of the authors' servers: PER_ROUND clients drawn uniformly, each trained by
    ``train_one(server, client)`` (-> its state dict), averaged with weights n_i / sum_j n_j."""
    selected = random.sample(range(CLIENTS), PER_ROUND)
    total = sum(len(clients[i][0]) for i in selected)
    average = {k: torch.zeros_like(v) for k, v in server.items()}
    for i in selected:
        trained = train_one(server, clients[i])
        for k in average:
            average[k] += trained[k] * (len(clients[i][0]) / total)
    return average


def main(seed: int, rounds: int) -> None:
    torch.manual_seed(0), random.seed(0), torch.set_num_threads(1)
    clients = client_tensors(seed)
    model = torch.nn.Linear(60, 10)  # MLR; PyTorch's default initialisation, as the authors'
    server = {k: v.clone() for k, v in model.state_dict().items()}

    def train_one(start_from: dict, client) -> dict:
        x, y = client[:2]
        model.load_state_dict(start_from)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for _ in range(EPOCHS):
            order = torch.randperm(len(x))
            for s in range(0, len(x), BATCH):
                b = order[s:s + BATCH]
                opt.zero_grad()
                F.cross_entropy(model(x[b]), y[b]).backward()
                opt.step()
        return {k: v.clone() for k, v in model.state_dict().items()}

    start = time.time()
    for r in range(rounds):
        server = weighted_round(server, clients, train_one)
        if (r + 1) % 10 == 0:
            model.load_state_dict(server)
            acc = accuracies(model, clients)
            weights = [len(c[3]) for c in clients]
            print(f"round {r + 1} unweighted {np.mean(acc):.4f} weighted {np.average(acc, weights=weights):.4f} "
                  f"({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
