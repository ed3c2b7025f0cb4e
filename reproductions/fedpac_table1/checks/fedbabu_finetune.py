"""What FedBABU's fine-tuning protocol does to its FMNIST 100-client cell: the cell's round-200 model, evaluated
with other fine-tuning settings.

Restores the checkpoint of the table's run (runs/fedbabu-fmnist_100/seed0, or the run folder given as the one
argument, e.g. seed 1's; written by the reproduce command, checkpoints stay on the machine that ran it; the
cell's configuration, seed included, is read from the folder's config.json) and evaluates the same global body and head once per variant:
the table's protocol (the whole model, 10 epochs, the run's SGD lr 0.01 momentum 0.5), no fine-tuning, the
head alone, 5 and 20 epochs, and the FedBABU authors' (the whole model, 5 epochs, lr 1e-3 momentum 0.9).
Prints one Markdown line per variant: the mean over the 100 clients of their test accuracy.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/fedpac_table1/checks/fedbabu_finetune.py [RUN_FOLDER]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax

from fedjax_pfl.engine import checkpoint
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import build_experiment, validate

RUN = Path("reproductions/fedpac_table1/runs/fedbabu-fmnist_100/seed0")
VARIANTS = {
    "table: all, 10 epochs, lr 0.01 m 0.5": [],
    "no fine-tuning (global body and head)": ["method.finetune_epochs=0"],
    "head only, 10 epochs": ["method.finetune_part=head"],
    "all, 5 epochs": ["method.finetune_epochs=5"],
    "all, 20 epochs": ["method.finetune_epochs=20"],
    "authors: all, 5 epochs, lr 1e-3 m 0.9": ["method.finetune_epochs=5", "train.lr=0.001", "train.momentum=0.9"],
}


def main(run: Path = RUN):
    path = checkpoint.checkpoint_path(run)
    if not checkpoint.exists(path):
        sys.exit(f"error: no checkpoint in {run}; run the table's fedbabu fmnist_100 cell first")
    saved = json.loads((run / "config.json").read_text())["config"]
    seed = saved["seed"]
    print("| fine-tuning | accuracy (%) | seconds |\n|---|---|---|")
    for label, overrides in VARIANTS.items():
        began = time.perf_counter()
        cfg = config_lib.build(overrides=overrides, start=saved)
        engine = build_experiment(validate(cfg)).engine
        init_key, key = jax.random.split(jax.random.key(cfg.seed))
        template = engine.init(init_key)
        (server, clients), _, meta = checkpoint.restore(path, template, num_clients=engine.num_clients)
        accuracy = engine.evaluate_summary(server, clients, jax.random.fold_in(key, 200))["accuracy"]
        print(f"| {label} | {100 * accuracy:.2f} | {time.perf_counter() - began:.0f} |", flush=True)
    print(f"(seed {seed}, checkpoint after round {meta.get('rounds_done')})")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else RUN)
