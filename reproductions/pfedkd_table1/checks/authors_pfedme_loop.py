"""The pFedKD-WCL authors' copy of pFedMe, written per client in PyTorch, on this library's Synthetic data.

A check of the table's pFedMe cell, not part of the library (as
authors_fedavg_loop.py): every client trains each round, R = 20 local steps,
each on one random batch of 20 with K = 5 inner steps on its personalized
model theta_i (plain SGD at personal_lr on the loss plus lamda (theta_i - w_i)),
then w_i <- w_i - lr lamda (w_i - theta_i); theta_i is never reset (it starts a
round where the last one ended), w_i starts from the global model; the server
averages 10 sampled clients' w_i with weight 1/10 (beta = 1); evaluation is
each client's theta_i on its test set, averaged over clients unweighted.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/pfedkd_table1/checks/authors_pfedme_loop.py SEED ROUNDS
"""
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from authors_fedavg_loop import CLIENTS, PER_ROUND, client_tensors  # noqa: E402

LR, PERSONAL_LR, LAMDA, K, STEPS, BATCH = 0.01, 0.01, 20.0, 5, 20, 20


def main(seed: int, rounds: int) -> None:
    torch.manual_seed(0), random.seed(0), torch.set_num_threads(1)
    clients = client_tensors(seed)
    thetas = [torch.nn.Linear(60, 10) for _ in range(CLIENTS)]  # each user's own model, PyTorch's init
    server = {k: v.clone() for k, v in torch.nn.Linear(60, 10).state_dict().items()}
    start = time.time()
    for r in range(rounds):
        uploads = []
        for theta, (x, y, _, _) in zip(thetas, clients):
            local = {k: v.clone() for k, v in server.items()}
            opt = torch.optim.SGD(theta.parameters(), lr=PERSONAL_LR)
            for _ in range(STEPS):
                pick = torch.randperm(len(x))[:BATCH]
                for _ in range(K):
                    opt.zero_grad()
                    F.cross_entropy(theta(x[pick]), y[pick]).backward()
                    for name, p in theta.named_parameters():
                        p.grad += LAMDA * (p.detach() - local[name])
                    opt.step()
                with torch.no_grad():
                    for name, p in theta.named_parameters():
                        local[name] -= LR * LAMDA * (local[name] - p)
            uploads.append(local)
        selected = random.sample(range(CLIENTS), PER_ROUND)
        server = {k: sum(uploads[i][k] for i in selected) / PER_ROUND for k in server}
        if (r + 1) % 10 == 0:
            with torch.no_grad():
                acc = [(t(c[2]).argmax(1) == c[3]).float().mean().item() for t, c in zip(thetas, clients)]
            print(f"round {r + 1} unweighted {np.mean(acc):.4f} ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
