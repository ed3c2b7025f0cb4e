"""A paper's table as data: configs/tables/NAME.yaml -> `TableSpec` and its cells.

A table file names the paper and table, the accuracy it reports (``metric``:
``best``, ``last`` or ``mean_last_10`` of summary.json), the seeds, the
settings (columns: a preset file plus dotted overrides) and the methods (rows:
a library method plus dotted overrides, optionally per setting), and the
paper's reported numbers in percent where known::

    paper: "FedAS (Yang et al., CVPR 2024)"
    table: "Table 2"
    metric: best
    seeds: [0, 1, 2]
    settings:
      - {name: beta0.1, config: ../fedas_cifar10.yaml, overrides: [partition.alpha=0.1]}
    methods:
      - fedas
      - {name: fedavg_ft, method: fedavg, overrides: [method.finetune_epochs=1]}
      - {name: pfedme, overrides: [method.lamda=15], per_setting: {beta0.1: [train.lr=0.01]}}
    paper_results: {fedas: {beta0.1: 72.1}}

Relative preset paths are read from the table file's folder. A cell is one
(method, setting, seed); its run is the training command's ``--config``,
``--method``, ``--seed`` and the overrides, in that order of precedence
(setting, then method, then per-setting). Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from fedjax_pfl.runs.config import load_yaml
from fedjax_pfl.core.errors import UserError

TABLES_DIR = Path(__file__).resolve().parents[2] / "configs" / "tables"
METRICS = {"best": "best accuracy over rounds (optimistic: the round is picked by test accuracy)",
           "last": "accuracy at the last round",
           "mean_last_10": "mean accuracy of the last 10 evaluations"}
_NAME = re.compile(r"^[A-Za-z0-9_.]+$")


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    config: Path | None  # preset file, resolved
    overrides: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class MethodRow:
    name: str  # row label and folder name
    method: str  # library method
    overrides: tuple[str, ...] = ()
    per_setting: dict = dataclasses.field(default_factory=dict)  # setting name -> overrides


@dataclasses.dataclass(frozen=True)
class Cell:
    method: MethodRow
    setting: Setting
    seed: int

    @property
    def group_name(self) -> str:
        """The folder of the cell's seeds: ``<method>-<setting>``."""
        return f"{self.method.name}-{self.setting.name}"

    @property
    def folder_name(self) -> str:
        """``<method>-<setting>/seed<k>``: the layout a ``--seeds`` run writes (runs/sweep.py)."""
        return f"{self.group_name}/seed{self.seed}"

    @property
    def overrides(self) -> tuple[str, ...]:
        return (*self.setting.overrides, *self.method.overrides, *self.method.per_setting.get(self.setting.name, ()))


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    path: Path
    paper: str
    table: str
    metric: str
    seeds: tuple[int, ...]
    settings: tuple[Setting, ...]
    methods: tuple[MethodRow, ...]
    paper_results: dict  # method name -> setting name -> percent (or None)
    note: str = ""

    def cells(self, methods=None, settings=None, seeds=None) -> list[Cell]:
        """Every (method, setting, seed), methods outermost, in the file's order."""
        rows = [m for m in self.methods if methods is None or m.name in methods]
        columns = [s for s in self.settings if settings is None or s.name in settings]
        return [Cell(m, s, k) for m in rows for s in columns for k in (self.seeds if seeds is None else seeds)]

    def paper_value(self, method: str, setting: str):
        return (self.paper_results.get(method) or {}).get(setting)


def _strings(value, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise UserError(f"{where} must be a list of key.sub=value overrides")
    return tuple(value)


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise UserError(f"{where} must be a name of letters, digits, '_' and '.', got {value!r}")
    return value


def _setting(entry, folder: Path, where: str) -> Setting:
    if not isinstance(entry, dict):
        raise UserError(f"{where} must be a mapping with name, config and overrides")
    unknown = set(entry) - {"name", "config", "overrides"}
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; valid: name, config, overrides")
    config = entry.get("config")
    return Setting(_name(entry.get("name"), f"{where}.name"), (folder / config).resolve() if config else None,
                   _strings(entry.get("overrides"), f"{where}.overrides"))


def _method(entry, settings: set, where: str) -> MethodRow:
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict):
        raise UserError(f"{where} must be a method name or a mapping with name, method, overrides, per_setting")
    unknown = set(entry) - {"name", "method", "overrides", "per_setting"}
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                        "valid: name, method, overrides, per_setting")
    name = _name(entry.get("name"), f"{where}.name")
    per_setting = entry.get("per_setting") or {}
    if not isinstance(per_setting, dict) or set(per_setting) - settings:
        raise UserError(f"{where}.per_setting must map setting names ({', '.join(sorted(settings))}) to overrides")
    return MethodRow(name, str(entry.get("method") or name), _strings(entry.get("overrides"), f"{where}.overrides"),
                     {k: _strings(v, f"{where}.per_setting.{k}") for k, v in per_setting.items()})


def _unique(names: list[str], what: str, path: Path) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"{path}: {what} named twice: {', '.join(repeated)}")


def load_table(path: str | Path) -> TableSpec:
    """Read and check a table file (one-line UserError naming the problem)."""
    path = Path(path)
    data = load_yaml(path)
    metric = data.get("metric", "best")
    if metric not in METRICS:
        raise UserError(f"{path}: metric must be one of {', '.join(METRICS)}, got {metric!r}")
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise UserError(f"{path}: seeds must be a list of whole numbers >= 0")
    raw_settings = data.get("settings") or []
    raw_methods = data.get("methods") or []
    if not isinstance(raw_settings, list) or not raw_settings or not isinstance(raw_methods, list) or not raw_methods:
        raise UserError(f"{path}: a table needs a list of settings and a list of methods")
    settings = tuple(_setting(s, path.parent, f"{path}: settings[{i}]") for i, s in enumerate(raw_settings))
    names = {s.name for s in settings}
    methods = tuple(_method(m, names, f"{path}: methods[{i}]") for i, m in enumerate(raw_methods))
    _unique([s.name for s in settings], "settings", path)
    _unique([m.name for m in methods], "methods", path)
    paper_results = data.get("paper_results") or {}
    if not isinstance(paper_results, dict) or not all(
            m in {r.name for r in methods} and isinstance(v, dict) and set(v) <= names
            for m, v in paper_results.items()):
        raise UserError(f"{path}: paper_results must map method names to {{setting name: percent}}")
    return TableSpec(name=path.stem, path=path, paper=str(data.get("paper", "")), table=str(data.get("table", "")),
                     metric=metric, seeds=tuple(seeds), settings=settings, methods=methods,
                     paper_results=paper_results, note=str(data.get("note", "")).strip())


def table_names(folder: Path = TABLES_DIR) -> list[str]:
    return sorted(p.stem for p in Path(folder).glob("*.yaml"))


def find_table(name: str, folder: Path = TABLES_DIR) -> TableSpec:
    """The table called ``name`` in configs/tables/, or UserError listing the names."""
    names = table_names(folder)
    if name not in names:
        raise UserError(f"unknown table {name!r}; choose one of: {', '.join(names) or 'none'} (see --list)")
    return load_table(Path(folder) / f"{name}.yaml")


def parse_list(text: str | None, valid, what: str) -> list | None:
    """``'a,b'`` -> ['a', 'b'] checked against ``valid`` (UserError naming the valid ones); None stays None."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if not items or bad:
        raise UserError(f"unknown {what} {', '.join(bad) or repr(text)}; choose from: {', '.join(map(str, valid))}")
    return items
