"""configs/tables/*.yaml against the published tables: rows, settings, metric and the transcribed numbers.

Facts here are typed from the papers' tables (rows in printed order, grid sizes, a few cells each), so a
table file that drifts from its paper fails; the settings are checked on the configs the cells really run.
"""

import pytest

from fedjax_pfl.cells import reproduce

from fedjax_pfl.papers import table_spec

ROWS = {
    "fedas_table2": ["fedavg_p", "fedprox_p", "fedper", "ditto", "lgfedavg", "fedbabu", "fedproto", "fedala", "fedpac",
                     "fedas"],
    "pfakd_table1": ["local", "fedavg", "fedper", "fedrep", "fedpac", "gpfl", "pfakd"],
    "pfakd_table2": ["pfakd", "pfakd_at"],
    "diversifed_table1": ["fedavg", "local", "perfedavg", "pfedme", "fedamp", "fedfomo", "apple", "fedrep", "fedproto",
                          "fedrod", "fedcac", "diversifed"],
    "pfedkd_table1": ["fedavg", "fedprox", "perfedavg", "pfedme", "pfedkd"],
    "fedpac_table1": ["local", "fedavg", "fedavg_p", "fedper", "lgfedavg", "fedrep", "fedbabu", "fedrod", "knnper",
                      "apfl", "pfedme", "ditto", "fedfomo", "pfedhn", "fedpac", "fedpac_replicate", "fedpac_proto"],
}
ROWS["fedas_table3"] = ROWS["fedas_table2"]
ROWS["fedas_table4"] = ["fedas", "align_only", "sync_only", "fedper"]  # both parts, one each, neither
ROWS["diversifed_table2"] = ROWS["diversifed_table1"]
METRIC = {"fedas_table2": "best_weighted", "fedas_table3": "best_weighted", "fedas_table4": "best_weighted", "pfakd_table1": "mean_last_10_weighted",
          "pfakd_table2": "mean_last_10_weighted", "diversifed_table1": "best", "diversifed_table2": "best",
          "pfedkd_table1": "last", "fedpac_table1": "last"}
# (row, setting) -> (mean, std) as printed
CELLS = {
    "fedas_table3": {("fedas", "beta0.1_P0.2"): (89.92, None), ("fedavg_p", "beta0.5_P1"): (73.59, None),
                     ("fedpac", "beta0.1_P1"): (87.08, None), ("fedproto", "beta0.3_P0.4"): (74.13, None)},
    "fedas_table4": {("fedas", "beta0.1_P0.6"): (90.81, None), ("fedper", "beta0.1_P0.2"): (88.51, None)},
    "fedas_table2": {("fedas", "beta0.5_P1"): (39.57, None), ("fedavg_p", "beta0.1_P0.2"): (27.61, None),
                     ("fedproto", "beta0.5_P0.2"): (17.62, None), ("lgfedavg", "beta0.3_P0.6"): (33.26, None)},
    "pfakd_table1": {("local", "cifar10_E20"): (68.70, None), ("fedrep", "cifar10_E10"): (75.37, None),
                     ("pfakd", "cifar100_E20"): (49.94, None), ("gpfl", "cifar100_E5"): (40.85, None)},
    "pfakd_table2": {("pfakd", "cifar10_E5"): (76.02, None), ("pfakd_at", "cifar100_E20"): (50.10, None)},
    "diversifed_table1": {("diversifed", "cifar100"): (93.19, 0.10), ("fedavg", "cifar10"): (51.19, 1.05),
                          ("pfedme", "cifar100"): (82.52, 1.64)},
    "diversifed_table2": {("diversifed", "cifar100_a1.0"): (40.42, 0.71), ("local", "cifar10_a0.1"): (78.94, 1.91),
                          ("fedcac", "cifar10_a0.1"): (80.32, 4.04), ("perfedavg", "cifar100_a0.5"): (24.85, 1.31)},
    "pfedkd_table1": {("pfedkd", "synthetic_mlp"): (89.12, 0.02), ("fedavg", "synthetic_mlr"): (67.76, 0.09)},
    "fedpac_table1": {("fedpac", "cifar10_100"): (83.36, None), ("fedpac_replicate", "cifar10_100"): (78.53, None),
                      ("fedpac_proto", "fmnist_20"): (92.03, None), ("pfedhn", "fmnist_100"): (87.93, None)},
}
# how many cells the paper gives a number for (only those are transcribed)
GIVEN = {"fedas_table2": 120, "fedas_table3": 120, "fedas_table4": 4, "pfakd_table1": 42, "pfakd_table2": 12, "diversifed_table1": 24,
         "diversifed_table2": 72, "pfedkd_table1": 10, "fedpac_table1": 68}


@pytest.fixture(scope="module")
def specs():
    return {name: table_spec.find_table(name) for name in table_spec.table_names()}


def built(spec, row: str, setting: str):
    """The configuration the cell (row, setting, seed 0) runs."""
    cell = next(c for c in spec.cells(methods=[row], settings=[setting], seeds=[0]))
    return reproduce.build_config(reproduce.base_argv(cell)).config


def test_every_table_has_the_papers_rows_metric_and_given_numbers(specs):
    assert set(specs) == set(ROWS)
    for name, spec in specs.items():
        assert [m.name for m in spec.methods] == ROWS[name], name
        assert spec.metric == METRIC[name], name
        assert sum(len(v) for v in spec.paper_results.values()) == GIVEN[name], name
        for (row, setting), (mean, std) in CELLS[name].items():
            number = spec.paper_value(row, setting)
            assert (number.mean, number.std) == (mean, std), (name, row, setting)


def test_no_number_is_transcribed_where_the_paper_gives_none(specs):
    """FMNIST / MNIST cells have no numbers in our copies of the papers (but FedPAC's)."""
    for name, spec in specs.items():
        if name == "fedpac_table1":
            assert len(spec.paper_results["local"]) == 4
            continue
        for row, cells in spec.paper_results.items():
            assert not [s for s in cells if s.startswith(("fmnist", "mnist"))], (name, row)


def test_fedas_tables_are_the_beta_by_P_grid_of_the_papers_setting(specs):
    for name, data in (("fedas_table3", "cifar10_jpeg"), ("fedas_table2", "cifar100")):
        spec = specs[name]
        assert len(spec.settings) == 12 and spec.settings[0].name == "beta0.1_P0.2"
        assert [s.group for s in spec.settings[::4]] == ["beta0.1", "beta0.3", "beta0.5"]
        grid = {(built(spec, "fedas", s.name).partition.alpha, built(spec, "fedas", s.name).train.join_ratio)
                for s in spec.settings}
        assert grid == {(b, p) for b in (0.1, 0.3, 0.5) for p in (0.2, 0.4, 0.6, 1.0)}
        cfg = built(spec, "fedavg_p", "beta0.3_P0.4")
        assert (cfg.data.name, cfg.partition.num_clients, cfg.train.rounds, cfg.train.local_epochs,
                cfg.train.batch_size, cfg.train.lr, cfg.train.lr_decay, cfg.model.name) == (
            data, 20, 40, 5, 16, 0.005, 0.999, "fedavgcnn")
        assert cfg.method_name == "fedavg" and cfg.method["finetune_epochs"] == 5
    assert "cifar10_jpeg" in specs["fedas_table3"].table  # the table says what data it ran on


def test_pfakd_rounds_and_hyperparameters_follow_the_paper(specs):
    spec = specs["pfakd_table1"]
    rounds = {s.name: built(spec, "pfakd", s.name).train.rounds for s in spec.settings}
    assert rounds == {"fmnist_E5": 50, "fmnist_E10": 50, "fmnist_E20": 30, "cifar10_E5": 100, "cifar10_E10": 100,
                      "cifar10_E20": 20, "cifar100_E5": 40, "cifar100_E10": 40, "cifar100_E20": 20}
    assert built(spec, "fedpac", "cifar100_E10").method["lam"] == 0.001
    assert built(spec, "fedpac", "cifar10_E10").method.get("lam", 1.0) == 1.0
    assert built(spec, "gpfl", "cifar100_E20").method["lamda"] == 1e-4
    cfg = built(spec, "local", "cifar100_E5")
    assert (cfg.model.name, cfg.partition.num_clients, cfg.partition.alpha, cfg.train.local_epochs) == (
        "resnet18", 10, 0.5, 5)
    assert [s.name for s in specs["pfakd_table2"].settings] == [s.name for s in spec.settings[3:]]


def test_diversifed_and_fedpac_columns(specs):
    t1, t2 = specs["diversifed_table1"], specs["diversifed_table2"]
    assert [s.name for s in t1.settings] == ["fmnist", "cifar10", "cifar100"]
    c100 = built(t1, "diversifed", "cifar100")
    assert (c100.data.name, c100.model.name, c100.partition.scheme, c100.partition.classes_per_client) == (
        "cifar100", "resnet8", "pathological", 2)
    alphas = [(built(t2, "fedavg", s.name).partition.scheme, built(t2, "fedavg", s.name).partition.alpha)
              for s in t2.settings]
    assert alphas == [("dirichlet", a) for a in (0.1, 0.5, 1.0)] * 3
    fedpac = specs["fedpac_table1"]
    many = built(fedpac, "fedpac", "cifar10_100")
    assert (many.partition.num_clients, many.train.join_ratio, many.train.rounds) == (100, 0.3, 200)
    assert built(fedpac, "fedpac", "fmnist_20").partition.num_clients == 20
    assert fedpac.row("fedpac_replicate").runs_of == "fedpac"
    assert fedpac.row("fedpac_replicate").shown == "fedpac (Replicate)"
    assert "fedpac_replicate" not in {c.method.name for c in fedpac.cells()}


def test_the_ablations_rows_are_fedas_with_its_switches_and_share_table_3s_cells(specs):
    """Table 4: alignment only = n_i weights, synchronisation only = no alignment, and the rows with both parts
    and with neither run exactly Table 3's cells (the same configuration, so their runs are copied, not rerun)."""
    spec, table3 = specs["fedas_table4"], specs["fedas_table3"]
    for setting in ("beta0.1_P0.2", "beta0.1_P0.6"):
        assert built(spec, "align_only", setting).method == {**built(spec, "fedas", setting).method,
                                                              "fisher_weights": False}
        assert built(spec, "sync_only", setting).method == {**built(spec, "fedas", setting).method, "align": False}
        for row in ("fedas", "fedper"):
            assert built(spec, row, setting) == built(table3, row, setting)
