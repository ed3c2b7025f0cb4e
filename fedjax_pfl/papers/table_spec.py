"""A paper's table as data: configs/tables/NAME.yaml -> `TableSpec` and its cells.

A table file names the paper and table, the accuracy it reports (``metric``:
``best``, ``last`` or ``mean_last_10`` of summary.json, each also as
``..._weighted``: pooled over the clients' test samples; ``also_metrics``:
more of them shown beside, without paper numbers), the seeds, the settings
(columns), the methods (rows), the paper's numbers (papers/paper_numbers.py)
and free-text ``notes``::

    paper: "FedPAC (Xu et al., ICLR 2023)"
    table: "Table 1"
    metric: last
    seeds: [0, 1, 2]
    settings:
      - {name: fmnist_20, group: FMNIST, label: 20 clients, config: ../fedpac_fmnist.yaml}
      - {name: fmnist_100, group: FMNIST, label: 100 clients, config: ../fedpac_fmnist.yaml,
         overrides: [partition.num_clients=100, train.join_ratio=0.3]}
    methods:
      - fedavg
      - {name: fedavg_p, label: "fedavg_p (FedAvg-FT)", method: fedavg, overrides: [method.finetune_epochs=5]}
      - {name: pfedme, overrides: [method.lamda=15], per_setting: {fmnist_100: [train.lr=0.01]}}
      - {name: fedpac, label: "fedpac (paper)"}
      - {name: fedpac_replicate, label: "fedpac (Replicate)", runs_of: fedpac}
    paper_results: {fedpac: [91.83, 92.72], fedpac_replicate: {fmnist_20: 91.95}}
    headline: {row: fedpac, settings: [fmnist_20]}
    notes: |
      Free text printed under the table.

Settings: a preset file (relative paths are read from the table file's
folder) plus dotted overrides; ``group`` heads a block of columns and
``label`` names the column within it (default: the name). Instead of a list,
``grid`` spans the product of axes over one preset, the first axis outermost,
each setting named ``<axis><value>_<axis><value>`` and grouped by all axes
but the last::

    grid:
      config: ../fedas_cifar10.yaml
      overrides: [train.lr_decay=0.999]
      axes:
        - {name: beta, key: partition.alpha, values: [0.1, 0.3, 0.5]}
        - {name: P, key: train.join_ratio, values: [0.2, 0.4, 0.6, 1]}

Rows: a library method (default: the row's name) plus dotted overrides,
optionally per setting; ``label`` is the row as the paper prints it. A row
with ``runs_of: OTHER`` runs nothing: it shows OTHER's runs against its own
paper numbers (a paper printing two numbers for one method, e.g. its own and
a rerun). ``settings: [NAME, ...]`` (optional) lists the settings a row runs
in, where a method cannot run the others (its validation refuses them: a
model it cannot train); the others show no runs. A cell is one (row, setting, seed); its run is the training
command's ``--config``, ``--method``, ``--seed`` and the overrides, in that
order of precedence (setting, then row, then per-setting). ``headline``
(optional) marks the paper's own row and the setting(s) it leads with: a
run plan (cells/run_plan.py) runs those cells first, then the rows whose
published numbers lie nearest the headline row's (they decide its rank).
Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

from fedjax_pfl.runs.config import load_yaml
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.papers.paper_numbers import PaperNumber, parse_row

TABLES_DIR = Path(__file__).resolve().parents[2] / "configs" / "tables"
METRICS = {"best": "best accuracy over rounds (optimistic: the round is picked by test accuracy)",
           "last": "accuracy at the last round",
           "mean_last_10": "mean accuracy of the last 10 evaluations",
           "best_weighted": "best sample-weighted accuracy over rounds (optimistic)",
           "last_weighted": "sample-weighted accuracy at the last round",
           "mean_last_10_weighted": "mean sample-weighted accuracy of the last 10 evaluations"}
NO_DATA = "no data"  # the state of a cell whose dataset files were not found (reproduce.py, paper_table.py)
_NAME = re.compile(r"^[A-Za-z0-9_.]+$")
_KEYS = ("paper", "table", "metric", "also_metrics", "seeds", "settings", "grid", "methods", "paper_results",
         "headline", "notes", "note")


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    config: Path | None  # preset file, resolved
    overrides: tuple[str, ...] = ()
    label: str = ""  # the column's heading within its group (default: the name)
    group: str = ""  # the block of columns it belongs to ('' : none)

    @property
    def column(self) -> str:
        return self.label or self.name


@dataclasses.dataclass(frozen=True)
class MethodRow:
    name: str  # row key and folder name
    method: str  # library method
    overrides: tuple[str, ...] = ()
    per_setting: dict = dataclasses.field(default_factory=dict)  # setting name -> overrides
    label: str = ""  # the row as the paper prints it (default: the name)
    runs_of: str | None = None  # another row whose runs this one shows
    settings: tuple[str, ...] = ()  # the settings it runs in (empty: every one)

    @property
    def shown(self) -> str:
        return self.label or self.name


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
    paper_results: dict  # row name -> setting name -> PaperNumber (the cells the paper gives)
    notes: str = ""
    also_metrics: tuple[str, ...] = ()
    headline_row: str | None = None  # the paper's own row (``headline.row``)
    headline_settings: tuple[str, ...] = ()  # the setting(s) the paper leads with (``headline.settings``)

    def row(self, name: str) -> MethodRow:
        return next(m for m in self.methods if m.name == name)

    def run_row(self, row: MethodRow) -> MethodRow:
        """The row whose runs ``row`` shows: itself, or its ``runs_of`` row."""
        return self.row(row.runs_of) if row.runs_of else row

    def shown_rows(self, methods=None) -> list[MethodRow]:
        """The rows a table of ``methods`` (row names; None: all) shows: those, and the rows showing their runs."""
        return [m for m in self.methods
                if methods is None or m.name in methods or (m.runs_of is not None and m.runs_of in methods)]

    def cells(self, methods=None, settings=None, seeds=None) -> list[Cell]:
        """Every (row that runs, setting, seed), rows outermost, in the file's order (``methods``: row names;
        a ``runs_of`` row stands for the row it shows)."""
        names = dict.fromkeys(self.run_row(m).name for m in self.methods if methods is None or m.name in methods)
        rows = [self.row(n) for n in names]
        columns = [s for s in self.settings if settings is None or s.name in settings]
        return [Cell(m, s, k) for m in rows for s in columns if not m.settings or s.name in m.settings
                for k in (self.seeds if seeds is None else seeds)]

    def paper_value(self, method: str, setting: str) -> PaperNumber | None:
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


def _text(value, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise UserError(f"{where} must be text, got {value!r}")
    return str(value)


def _mapping(entry, keys: tuple[str, ...], where: str) -> dict:
    if not isinstance(entry, dict):
        raise UserError(f"{where} must be a mapping with {', '.join(keys)}")
    unknown = set(entry) - set(keys)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(keys)}")
    return entry


def _setting(entry, folder: Path, where: str) -> Setting:
    entry = _mapping(entry, ("name", "config", "overrides", "label", "group"), where)
    config = entry.get("config")
    return Setting(_name(entry.get("name"), f"{where}.name"), (folder / config).resolve() if config else None,
                   _strings(entry.get("overrides"), f"{where}.overrides"), _text(entry.get("label"), f"{where}.label"),
                   _text(entry.get("group"), f"{where}.group"))


def _axis(entry, where: str) -> tuple[str, str, list]:
    entry = _mapping(entry, ("name", "key", "values"), where)
    values = entry.get("values")
    key = entry.get("key")
    if not isinstance(key, str) or "." not in key or not isinstance(values, list) or not values or not all(
            isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in values):
        raise UserError(f"{where} needs key (a dotted config key) and values (a list of numbers or names)")
    return _name(entry.get("name"), f"{where}.name"), key, values


def grid_settings(entry, folder: Path, where: str) -> tuple[Setting, ...]:
    """The settings of a ``grid``: one per combination of its axes' values, the first axis outermost."""
    entry = _mapping(entry, ("config", "overrides", "axes"), where)
    raw_axes = entry.get("axes")
    if not isinstance(raw_axes, list) or not raw_axes:
        raise UserError(f"{where}.axes must be a list of {{name, key, values}}")
    axes = [_axis(a, f"{where}.axes[{i}]") for i, a in enumerate(raw_axes)]
    config = entry.get("config")
    base = _strings(entry.get("overrides"), f"{where}.overrides")
    settings = []
    for combo in itertools.product(*(values for _, _, values in axes)):
        parts = [f"{name}{value}" for (name, _, _), value in zip(axes, combo)]
        settings.append(Setting(_name("_".join(parts), f"{where} setting"),
                                (folder / config).resolve() if config else None,
                                (*base, *(f"{key}={value}" for (_, key, _), value in zip(axes, combo))),
                                label=parts[-1], group="_".join(parts[:-1])))
    return tuple(settings)


def _method(entry, settings: set, where: str) -> MethodRow:
    if isinstance(entry, str):
        entry = {"name": entry}
    keys = ("name", "method", "overrides", "per_setting", "label", "runs_of", "settings")
    entry = _mapping(entry, keys, where)
    name = _name(entry.get("name"), f"{where}.name")
    per_setting = entry.get("per_setting") or {}
    if not isinstance(per_setting, dict) or set(per_setting) - settings:
        raise UserError(f"{where}.per_setting must map setting names ({', '.join(sorted(settings))}) to overrides")
    runs_in = entry.get("settings") or []
    if not isinstance(runs_in, list) or not all(isinstance(n, str) for n in runs_in) or set(runs_in) - settings:
        raise UserError(f"{where}.settings must list setting names ({', '.join(sorted(settings))})")
    runs_of = entry.get("runs_of")
    if runs_of is not None and (set(entry) - {"name", "label", "runs_of"}):
        raise UserError(f"{where}: a row with runs_of shows another row's runs; give it only name, label, runs_of")
    return MethodRow(name, str(entry.get("method") or name), _strings(entry.get("overrides"), f"{where}.overrides"),
                     {k: _strings(v, f"{where}.per_setting.{k}") for k, v in per_setting.items()},
                     _text(entry.get("label"), f"{where}.label"),
                     None if runs_of is None else _name(runs_of, f"{where}.runs_of"), tuple(runs_in))


def _unique(names: list[str], what: str, path: Path) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"{path}: {what} named twice: {', '.join(repeated)}")


def _check_runs_of(methods: tuple[MethodRow, ...], path: Path) -> None:
    own = {m.name for m in methods if m.runs_of is None}
    bad = [m.name for m in methods if m.runs_of is not None and m.runs_of not in own]
    if bad:
        raise UserError(f"{path}: runs_of of {', '.join(bad)} must name a row that runs ({', '.join(sorted(own))})")


def _read_settings(data: dict, path: Path) -> tuple[Setting, ...]:
    if ("settings" in data) == ("grid" in data):
        raise UserError(f"{path}: give either settings (a list) or grid (axes over one preset), not both or neither")
    if "grid" in data:
        return grid_settings(data["grid"], path.parent, f"{path}: grid")
    raw = data.get("settings")
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{path}: settings must be a non-empty list")
    return tuple(_setting(s, path.parent, f"{path}: settings[{i}]") for i, s in enumerate(raw))


def _metrics(data: dict, path: Path) -> tuple[str, tuple[str, ...]]:
    metric = data.get("metric", "best")
    also = data.get("also_metrics") or []
    if metric not in METRICS or not isinstance(also, list) or set(also) - set(METRICS):
        raise UserError(f"{path}: metric and also_metrics must be among {', '.join(METRICS)}; "
                        f"got {metric!r}, {also!r}")
    return metric, tuple(m for m in also if m != metric)


def load_table(path: str | Path) -> TableSpec:
    """Read and check a table file (one-line UserError naming the problem)."""
    path = Path(path)
    data = load_yaml(path)
    unknown = set(data) - set(_KEYS)
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(_KEYS)}")
    metric, also = _metrics(data, path)
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise UserError(f"{path}: seeds must be a list of whole numbers >= 0")
    settings = _read_settings(data, path)
    raw_methods = data.get("methods") or []
    if not isinstance(raw_methods, list) or not raw_methods:
        raise UserError(f"{path}: a table needs a list of methods")
    names = [s.name for s in settings]
    methods = tuple(_method(m, set(names), f"{path}: methods[{i}]") for i, m in enumerate(raw_methods))
    _unique(names, "settings", path)
    _unique([m.name for m in methods], "methods", path)
    _unique([m.shown for m in methods], "row labels", path)
    _check_runs_of(methods, path)
    raw_paper = data.get("paper_results") or {}
    if not isinstance(raw_paper, dict) or set(raw_paper) - {m.name for m in methods}:
        raise UserError(f"{path}: paper_results must map method names (rows) to the paper's numbers per setting")
    paper_results = {m: parse_row(v, names, f"{path}: paper_results.{m}") for m, v in raw_paper.items()}
    headline_row, headline_settings = _headline(data.get("headline"), {m.name for m in methods if m.runs_of is None},
                                                names, path)
    return TableSpec(name=path.stem, path=path, paper=str(data.get("paper", "")), table=str(data.get("table", "")),
                     metric=metric, seeds=tuple(seeds), settings=settings, methods=methods,
                     paper_results=paper_results,
                     notes=_text(data.get("notes", data.get("note")), f"{path}: notes").strip(), also_metrics=also,
                     headline_row=headline_row, headline_settings=headline_settings)


def _headline(entry, rows: set, settings: list[str], path: Path) -> tuple[str | None, tuple[str, ...]]:
    """(row, settings) of the table's ``headline`` mapping; (None, ()) without one."""
    if entry is None:
        return None, ()
    entry = _mapping(entry, ("row", "settings"), f"{path}: headline")
    row, chosen = entry.get("row"), entry.get("settings")
    if row not in rows or not isinstance(chosen, list) or not chosen or set(chosen) - set(settings):
        raise UserError(f"{path}: headline needs row (one of {', '.join(sorted(rows))}) and settings (a list of "
                        f"the table's settings: {', '.join(settings)})")
    return row, tuple(chosen)


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
