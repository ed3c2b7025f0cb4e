"""Write a preset's clients in PFLlib's folder layout, so the authors' PFLlib-based code trains on them.

A check, not part of the library: the clients are the ones a run of the
preset trains on (this library's data loading, normalisation and partition
code), written as PFLlib's dataset generators write theirs (train/<i>.npz,
test/<i>.npz, config.json; images float32 NCHW, normalised as the run
normalises them). authors_code.py, beside this file, trains on the folder.

    FEDJAX_PFL_DATA_DIR=../shared/data python reproductions/pfakd_table1/checks/pfllib_clients.py \\
        --config configs/pfakd_cifar10.yaml --out PFLlib/dataset/Cifar10 data.name=cifar10_jpeg
"""
import argparse

from fedjax_pfl.data import client_data, pfllib
from fedjax_pfl.data.dataset import with_normalization
from fedjax_pfl.data.registry import load_dataset
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs.experiment import partition_dataset


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a preset's clients as a PFLlib dataset folder.")
    ap.add_argument("--config", required=True, help="a run preset, e.g. configs/pfakd_cifar10.yaml")
    ap.add_argument("--out", required=True, help="the folder to write (new or empty)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the preset, as for fedjax_pfl.train")
    args = ap.parse_args()
    cfg = config_lib.build(args.config, args.overrides)
    cfg.partition.scheme = config_lib.partition_scheme(cfg)  # (an 'auto' resolved, as a run's validation does)
    seed = config_lib.drawn_data_seed(cfg.seed, cfg.data_seed)
    ds = with_normalization(load_dataset(cfg.data.name), cfg.data.normalization)
    fed = partition_dataset(ds, cfg.partition, seed)

    def clients(data):
        return [(pfllib.to_pfllib_images(ds, x), y)
                for x, y in (client_data.unpad(data, i) for i in range(data.num_clients))]

    folder = pfllib.write_pfllib_folder(args.out, clients(fed.train), clients(fed.test), ds.num_classes,
                                        dataset=ds.name, partition=cfg.partition.scheme,
                                        alpha=cfg.partition.alpha, data_seed=seed)
    print(f"wrote {fed.train.num_clients} clients of {ds.name} to {folder}")
    print(fed.text)


if __name__ == "__main__":
    main()
