"""Seconds a round of a program of table cells takes on a device kind, modelled from measurements.

A table's cells of one method run as rows of one program (engine/rows.py;
one cell alone is a program of one). A round of a program of cells (each a
federation f: N_f clients of train sizes n, S_f of them training a round) in
packed lanes runs about max(L, T / W) steps of W lanes (engine/packed_loops.py):
T the rows' expected real client-steps (the sum over f of S_f / N_f times the
sum over its clients of E ceil(n / B)), L the largest client's steps, W the
lane width the engine takes for them (`client_mapping.packed_width`). A step of
W lanes takes t(W) = fixed + per_lane x W seconds, the device kind's
``lane_step_seconds`` in benchmarks/seconds_per_round.json (a line through its
measured rows: seconds over sequential steps of FedAvg on FedAvgCNN, B=16, at
several widths), and a method's round is its work (`round_work`: its passes, in
client-epochs) over plain training's times that. So the batching factor of k
cells as rows (their seconds alone over their seconds together: less padding,
fewer fixed step costs) comes out of the model instead of k cells being charged
as k times one. The table's own runs made on that device kind are measured
programs (`measured_programs`: config.json names the program's runs): their
seconds per round over their modelled seconds, the median, scale every estimate
(`calibration`). Nothing here imports JAX until client sizes or a method's
options are read.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.registry import load_dataset
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.runs import config as config_lib

RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "seconds_per_round.json"


@dataclasses.dataclass(frozen=True)
class LaneLaw:
    """Seconds of one step of W lanes: ``fixed + per_lane * W`` (the record's ``lane_step_seconds``)."""

    fixed: float
    per_lane: float
    source: str

    def step(self, lanes: int) -> float:
        return self.fixed + self.per_lane * lanes


def load_record(path: Path | None = None) -> dict:
    """The seconds-per-round record (default `RECORD`)."""
    path = RECORD if path is None else path
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read the seconds-per-round record {path}: {e}") from None


def kind_record(record: dict, kind: str) -> dict:
    """The record of one device kind; UserError naming the kinds it has."""
    kinds = record.get("kinds") or {}
    if kind not in kinds:
        raise UserError(f"no measurements for device kind {kind!r} in benchmarks/seconds_per_round.json; "
                        f"choose one of: {', '.join(kinds) or 'none'}")
    return kinds[kind]


def setting(config: dict, key: str, default=None):
    """``config``'s value at dotted ``key``: a key of its own (the record's flat configs) or a path through a
    run's nested config (config.json, ``config_lib.to_dict``)."""
    if key in config:
        return config[key]
    value = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def _option(options, name: str) -> float:
    value = getattr(options, name, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"the work model names option {name!r}, which this method has not as a number")
    return float(value)


def clients_per_round(config: dict) -> int:
    """The engine's round(N * join ratio), at least 1 (engine.clients_per_round, without importing JAX)."""
    n = int(setting(config, "partition.num_clients") or 1)
    return max(1, min(n, int(round(n * float(setting(config, "train.join_ratio", 1.0))))))


def round_work(config: dict, work: dict) -> float:
    """Client-epochs of one round of ``config`` under the record's work model ``work``."""
    from fedjax_pfl.methods import get_method  # (imports JAX: not with this module)

    name = str(setting(config, "method_name"))
    options = config_lib.method_options(get_method(name).hparams_type, dict(setting(config, "method") or {}))
    model = (work.get("methods") or {}).get(name, {})
    epochs = float(setting(config, "train.local_epochs", 1))
    extra = sum(_option(options, x) if isinstance(x, str) else float(x) for x in model.get("extra_epochs", ()))
    selected = epochs * float(model.get("epochs_factor", 1)) + extra
    rounds = max(1, int(setting(config, "train.rounds") or 1))
    every = float(model.get("every_client_epochs", 0)) + float(model.get("once_every_client_epochs", 0)) / rounds
    every += getattr(options, "finetune_epochs", 0) / max(1, int(setting(config, "eval_every") or 1))
    n = int(setting(config, "partition.num_clients") or 1)
    return clients_per_round(config) * selected + n * every


def steady_seconds(records: list[dict]) -> float | None:
    """Seconds per round of a run's first segment after its first call (compiling excluded), from the
    ``seconds`` of metrics.jsonl; None with fewer than two calls' records."""
    first = records[0] if records else None
    segment = []
    for r in records:
        if segment and r["seconds"] < segment[-1]["seconds"]:
            break  # a resumed segment starts its clock again
        segment.append(r)
    later = [r for r in segment if first is not None and r["seconds"] > first["seconds"]]
    if not later or later[-1]["round"] <= first["round"]:
        return None
    return (later[-1]["seconds"] - first["seconds"]) / (later[-1]["round"] - first["round"])


def lane_law(kind: dict) -> LaneLaw | None:
    """The device kind's step law, or None when the record has none."""
    raw = kind.get("lane_step_seconds")
    return None if not raw else LaneLaw(float(raw["fixed"]), float(raw["per_lane"]), str(raw.get("source", "")))


class ClientSizes:
    """Every cell's clients' train sizes, from its partition (the dataset loaded once a name; no model built)."""

    def __init__(self):
        self.datasets, self.sizes = {}, {}

    def __call__(self, cfg) -> np.ndarray:
        from fedjax_pfl.runs.experiment import partition_dataset  # (imports JAX: not with this module)

        seed = config_lib.drawn_data_seed(cfg.seed, cfg.data_seed)
        key = repr((cfg.data.name, cfg.data.data_dir, dataclasses.asdict(cfg.partition), seed))
        if key not in self.sizes:
            if cfg.data.name not in self.datasets:
                extra = ({"num_clients": cfg.partition.num_clients, "seed": seed}
                         if cfg.data.name == "synthetic" else {})
                self.datasets[cfg.data.name] = load_dataset(cfg.data.name, data_dir=cfg.data.data_dir,
                                                            allow_download=False, source=cfg.data.source, **extra)
            data = partition_dataset(self.datasets[cfg.data.name], cfg.partition, seed)
            self.sizes[key] = np.asarray(data.train.n)
        return self.sizes[key]


def program_seconds(cfgs: list, law: LaneLaw, work: dict, sizes: ClientSizes, one_lane: bool = False) -> float:
    """Modelled seconds a round of the cells ``cfgs`` (RunConfigs of one method) as rows of one program take
    (module docstring); ``one_lane``: the kind maps clients one at a time (``map``, a CPU's plan), so a round
    is its real steps one after another."""
    from fedjax_pfl.engine.client_mapping import packed_width  # (imports JAX: not with this module)

    counts, rows, expected, training_work, round_work_sum = [], 0, 0.0, 0.0, 0.0
    for cfg in cfgs:
        n, t = sizes(cfg), cfg.train
        steps = t.local_epochs * (n // t.batch_size if t.drop_last else -(-n // t.batch_size))
        config = config_lib.to_dict(cfg)
        training = len(n) if t.all_clients_train else clients_per_round(config)
        counts.append(steps)
        rows += training
        expected += training / len(n) * float(steps.sum())
        training_work += training * t.local_epochs
        round_work_sum += round_work(config, work)
    counts = np.concatenate(counts)
    lanes = 1 if one_lane else packed_width(counts, rows, backend="gpu")
    return max(float(counts.max()), expected / lanes) * law.step(lanes) * round_work_sum / max(training_work, 1e-9)


def measured_programs(runs_dir: Path, machine: str, unfinished: bool = False,
                      skip: frozenset = frozenset()) -> list[tuple[list, float]]:
    """(the cells' RunConfigs, measured seconds per round) of each program whose finished runs under
    ``runs_dir`` were made on ``machine`` (config.json's resolved client mapping names a program's runs);
    ``unfinished``: runs still going or cut count too (a background plan's cells, measured as they run);
    ``skip``: run folders (``<method>-<setting>/seed<k>``) measured elsewhere already."""
    found: dict[tuple, tuple[list, float]] = {}
    folders = sorted(Path(runs_dir).glob("*/seed*")) if Path(runs_dir).is_dir() else []
    for folder in [f for f in folders if f"{f.parent.name}/{f.name}" not in skip]:
        status = (run_folder.read_summary(folder) or {}).get("status") if run_folder.is_run(folder) else None
        if (not run_folder.is_run(folder) or machine not in run_folder.read_provenance(folder)["machines"]
                or not (status == "finished" or unfinished and status != "failed")):
            continue
        seconds = steady_seconds(run_folder.read_records(folder))
        saved = json.loads((folder / "config.json").read_text())
        mapping = (saved.get("resolved") or {}).get("train.client_mapping") or {}
        program = tuple(mapping.get("program") or [f"{folder.parent.name}/{folder.name}"])
        if seconds and (program in found or all((Path(runs_dir) / name).is_dir() for name in program)):
            cfgs, _ = found.get(program, ([], seconds))
            found[program] = (cfgs + [config_lib.build(base=saved["config"])], seconds)
    return [(cfgs, seconds) for program, (cfgs, seconds) in found.items() if len(cfgs) == len(program)]


def calibration(measured: list, law: LaneLaw, work: dict, sizes: ClientSizes,
                one_lane: bool = False) -> tuple[float, str]:
    """(factor, what it comes from): the median of measured over modelled seconds of ``measured`` programs,
    else 1."""
    ratios = [seconds / program_seconds(cfgs, law, work, sizes, one_lane) for cfgs, seconds in measured]
    if not ratios:
        return 1.0, "modelled, no measurement of a program of cells on this kind yet (the kind's lane_step_seconds)"
    return statistics.median(ratios), (f"modelled, calibrated on {len(ratios)} measured program(s) of this table "
                                       f"(measured / modelled, median {statistics.median(ratios):.2f})")
