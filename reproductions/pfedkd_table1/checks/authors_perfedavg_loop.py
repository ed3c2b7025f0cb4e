"""The pFedKD-WCL authors' Per-FedAvg loop, written per client in PyTorch, on this library's Synthetic data.

A check of the table's Per-FedAvg gap, not part of the library (as
authors_fedavg_loop.py): 10 of 100 clients a round, each 20 first-order MAML
steps (an alpha = 0.01 step on one random batch of 20, then a beta = 0.002
step from the start with the gradient at the adapted point on another batch),
n_i-weighted average; evaluation adapts the global model on each client with
one alpha step and one beta step on train batches (the authors'
``train_one_step``) and averages the clients' test accuracy unweighted.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/pfedkd_table1/checks/authors_perfedavg_loop.py SEED ROUNDS
"""
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from authors_fedavg_loop import client_tensors, weighted_round  # noqa: E402

ALPHA, BETA, BATCH, STEPS = 0.01, 0.002, 20, 20
MODEL = torch.nn.Linear(60, 10)


def gradient(params: dict, client) -> dict:
    """The cross-entropy gradient at ``params`` on one random train batch of ``client``."""
    MODEL.load_state_dict(params)
    MODEL.zero_grad()
    pick = torch.randperm(len(client[0]))[:BATCH]
    F.cross_entropy(MODEL(client[0][pick]), client[1][pick]).backward()
    return {k: p.grad.clone() for k, p in MODEL.named_parameters()}


def maml_step(params: dict, client, from_adapted: bool) -> dict:
    """One alpha step, then a beta step with the gradient at the adapted point: from the start (training) or
    from the adapted point (the evaluation's one-step adaptation)."""
    g = gradient(params, client)
    adapted = {k: params[k] - ALPHA * g[k] for k in params}
    g2 = gradient(adapted, client)
    base = adapted if from_adapted else params
    return {k: base[k] - BETA * g2[k] for k in params}


def main(seed: int, rounds: int) -> None:
    torch.manual_seed(0), random.seed(0), torch.set_num_threads(1)
    MODEL.reset_parameters()  # PyTorch's default initialisation, drawn after the seed
    clients = client_tensors(seed)
    server = {k: v.clone() for k, v in MODEL.state_dict().items()}
    start = time.time()
    def train_one(w: dict, client) -> dict:
        for _ in range(STEPS):
            w = maml_step(w, client, from_adapted=False)
        return w

    for r in range(rounds):
        server = weighted_round(server, clients, train_one)
        if (r + 1) % 50 == 0:
            acc = []
            for c in clients:
                MODEL.load_state_dict(maml_step(server, c, from_adapted=True))
                with torch.no_grad():
                    acc.append((MODEL(c[2]).argmax(1) == c[3]).float().mean().item())
            print(f"round {r + 1} unweighted {np.mean(acc):.4f} ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
