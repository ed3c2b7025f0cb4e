"""How FedPAC (its QP) and the prototype-loss variant (its softmax) weigh the 20 clients' heads on the table's
FMNIST preset.

Runs the preset (configs/fedpac_fmnist.yaml) for a few rounds and records, each round, the combination
weights a_ij the server step computes, then prints per round: the mean weight a client gives its own head,
the mean total weight on the clients of its own group (client i is in group i % 5: the same three dominant
classes, 86% of its data; 4 of the 20 clients), and the accuracy after the round.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/fedpac_table1/checks/proto_weights.py \
        --method fedpac_proto --rounds 3 [method.temperature=0.2] [method.direction=reverse]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from fedjax_pfl.methods import fedpac, get_method
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import build_experiment, validate


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--method", default="fedpac_proto", choices=["fedpac", "fedpac_proto"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("overrides", nargs="*", help="key=value options, e.g. method.temperature=0.2")
    args = p.parse_args()
    recorded = []
    get_method(args.method)  # (a fedpac variant: its server step calls fedpac.head_weights)
    original = fedpac.head_weights

    def recording(m, uploads, info):
        w = original(m, uploads, info)
        jax.debug.callback(lambda w_: recorded.append(np.asarray(w_)), w)
        return w

    fedpac.head_weights = recording
    cfg = config_lib.build("configs/fedpac_fmnist.yaml", [f"method_name={args.method}", *args.overrides])
    eng = build_experiment(validate(cfg)).engine
    init_key, key = jax.random.split(jax.random.key(0))
    server, clients = eng.init(init_key)
    print(f"{args.method} {' '.join(args.overrides)}")
    print("| round | own head | own group (4 of 20 clients) | accuracy after the round (%) |\n|---|---|---|---|")
    for t in range(args.rounds):
        server, clients, _ = eng.round(server, clients, jax.random.fold_in(key, t), t)
        acc = eng.evaluate_summary(server, clients, key)["accuracy"]
        w = recorded[-1]
        group = np.arange(w.shape[0]) % 5
        same = group[:, None] == group[None, :]
        print(f"| {t + 1} | {np.mean(np.diag(w)):.3f} | {np.mean((w * same).sum(1)):.3f} | {100 * acc:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
