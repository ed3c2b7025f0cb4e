"""Train with the PFAKD authors' code on a folder written by pfllib_clients.py.

A check, not part of the library, and not their code: this driver only sets
the arguments and picks the classes. The authors released their PFAKD client
and server and the base classes of their PFLlib fork (fei0829/PFAKD,
system/); the baselines and the rest are PFLlib's at the fork's date
(TsingZ0/PFLlib, commit 52dec86, 2024-04-23). Their released main.py lacks
most of PFLlib's arguments, so they are set here: PFLlib's defaults, with the
fork's (batch 128, lr 0.01, SGD momentum 0.9 and weight decay 5e-4, lr decay
0.9 per round) and the paper's setting (10 clients, all every round).

Setup (torch, scikit-learn and matplotlib installed, cvxpy for FedPAC; the fork imports opacus and h5py,
which these runs never use, so they are stubbed when missing):

    git clone https://github.com/TsingZ0/PFLlib && git -C PFLlib checkout 52dec86
    git clone https://github.com/fei0829/PFAKD && cp -r PFAKD/system/. PFLlib/system/
    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/pfakd_table1/checks/pfllib_clients.py \\
        --config configs/pfakd_cifar10.yaml --out PFLlib/dataset/Cifar10 data.name=cifar10_jpeg
    cd PFLlib/system && python $REPO/reproductions/pfakd_table1/checks/authors_code.py PFAKD 10 8

Fashion-MNIST: write the clients with ``--config configs/pfakd_fmnist.yaml --out PFLlib/dataset/FMNIST``
and pass DATASET FMNIST; the model is then the fork's CNN as the preset's pfakd_cnn builds it for a
1-channel 28x28 input (first conv 1 -> 16, a 64-d flattened feature); the fork's own CNN takes 3-channel
32x32 images only.

Arguments: ALGORITHM (FedAvg; PFAKD; FedPer, the fork's PFAKD client without
the distillation term; FedPAC, PFLlib's, lambda 1) E ROUNDS [SEED, default 42 as their main.py]
[DATASET, Cifar10 (default) or FMNIST]. With LOG_LOSSES=1 in the environment each FedPAC client
prints the mean and largest batch cross-entropy and prototype MSE of its round. The fork
trains ROUNDS + 1 rounds and prints "Averaged Test Accurancy" (test samples
pooled over clients) after each; FedAvg's and FedPAC's first print is the
initial model. FedPAC then stops in the fork's save_results (its plot of a
train loss FedPAC never records): every accuracy is printed before that.
Wiring of the released code: its server and clients branch on the name
"FedPer" (the global model is the body; evaluation unpacks (feature,
logits)), its BaseHeadSplit returns (feature, logits) for "PFAKD", and its
PFAKD server creates FedPer clients; so PFAKD here is that server with the
fork's PFAKD client, algorithm "FedPer", BaseHeadSplit "PFAKD".
"""
import argparse
import copy
import os
import random
import sys
import time
import types

import numpy as np
import torch

for missing in ("opacus", "h5py"):  # imported at module level by the fork, unused by these runs
    try:
        __import__(missing)
    except ImportError:
        sys.modules[missing] = types.SimpleNamespace(PrivacyEngine=None)
sys.path.insert(0, os.getcwd())  # PFLlib/system

from flcore.trainmodel.models import CNN, BaseHeadSplit  # noqa: E402


class GrayscaleCNN(CNN):
    """The fork's CNN for 1-channel 28x28 images (the preset's pfakd_cnn): its layers with a 1-channel
    first conv, whose last maxpool leaves 64 x 1 x 1 (the fork's view(-1, 64 * 2 * 2) assumes 32x32).
    A subclass, not a patched instance: PFLlib deep-copies the model for every client."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        self.features[0] = torch.nn.Conv2d(1, 16, kernel_size=3)
        self.fc[0] = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


MODELS = {"Cifar10": lambda: CNN(num_classes=10), "FMNIST": lambda: GrayscaleCNN(num_classes=10)}


def arguments(algorithm: str, epochs: int, rounds: int, dataset: str) -> argparse.Namespace:
    return argparse.Namespace(
        goal="test", device="cpu", device_id="0", dataset=dataset, num_classes=10, model=MODELS[dataset](),
        batch_size=128, local_learning_rate=0.01, weight_decay=True, learning_rate_decay=True,
        learning_rate_decay_gamma=0.9, global_rounds=rounds, local_epochs=epochs, algorithm=algorithm,
        join_ratio=1.0, random_join_ratio=False, num_clients=10, prev=0, times=1, eval_gap=1, privacy=False,
        dp_sigma=0.0, save_folder_name="items", auto_break=False, dlg_eval=False, dlg_gap=100,
        batch_num_per_client=2, num_new_clients=0, fine_tuning_epoch_new=0, client_drop_rate=0.0,
        train_slow_rate=0.0, send_slow_rate=0.0, time_select=False, time_threthold=10000, top_cnt=100,
        distill=True, B=1.0)


def log_fedpac_losses() -> None:
    """Wrap PFLlib's FedPAC client so that each round prints its batch losses (CE and prototype MSE)."""
    from flcore.clients.clientpac import clientPAC
    init, train = clientPAC.__init__, clientPAC.train

    def recorded(loss, name, log):
        def call(*tensors):
            value = loss(*tensors)
            log.setdefault(name, []).append(value.item())
            return value
        return call

    def logged_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.batch_losses = {}
        self.loss = recorded(self.loss, "ce", self.batch_losses)
        self.loss_mse = recorded(self.loss_mse, "mse", self.batch_losses)

    def logged_train(self):
        self.batch_losses.clear()
        train(self)
        parts = [f"{name} mean {np.mean(v):.3f} max {np.max(v):.3f}" for name, v in self.batch_losses.items()]
        print(f"client {self.id}: " + "; ".join(parts), flush=True)

    clientPAC.__init__, clientPAC.train = logged_init, logged_train


def server(algorithm: str, args: argparse.Namespace):
    if algorithm == "FedAvg":
        from flcore.servers.serveravg import FedAvg
        return FedAvg(args, 0)
    if algorithm == "FedPAC":  # PFLlib's FedPAC (needs cvxpy); lambda 1, the paper's for CIFAR-10
        from flcore.servers.serverpac import FedPAC
        args.lamda = 1.0
        args.head = copy.deepcopy(args.model.fc)
        args.model.fc = torch.nn.Identity()
        args.model = BaseHeadSplit(args.model, args.head, algorithm)
        if os.environ.get("LOG_LOSSES") == "1":
            log_fedpac_losses()
        return FedPAC(args, 0)
    from flcore.clients.clientpfakd import clientPFAKD
    from flcore.servers.serverpfakd import FedPFAKD

    class PFAKDServer(FedPFAKD):
        def set_clients(self, client_class):
            super().set_clients(clientPFAKD)

    args.distill = algorithm == "PFAKD"
    args.head = copy.deepcopy(args.model.fc)
    args.model.fc = torch.nn.Identity()
    args.model = BaseHeadSplit(args.model, args.head, "PFAKD")
    args.algorithm = "FedPer"
    return PFAKDServer(args, 0)


def main() -> None:
    algorithm, epochs, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if algorithm not in ("FedAvg", "PFAKD", "FedPer", "FedPAC"):
        sys.exit(f"ALGORITHM must be FedAvg, PFAKD, FedPer or FedPAC, got {algorithm!r}")
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 42
    dataset = sys.argv[5] if len(sys.argv) > 5 else "Cifar10"
    if dataset not in MODELS:
        sys.exit(f"DATASET must be one of {sorted(MODELS)}, got {dataset!r}")
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
    os.makedirs("../results", exist_ok=True)
    start = time.time()
    server(algorithm, arguments(algorithm, epochs, rounds, dataset)).train()
    print(f"wall {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
