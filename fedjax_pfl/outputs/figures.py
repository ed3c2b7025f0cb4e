"""Figures of runs, drawn with matplotlib's object-oriented API.

One function per picture, each returning a `matplotlib.figure.Figure` built
from plain data (metrics records, the partition summary, clients.csv rows);
`save_png` writes one atomically. Figures never go through pyplot, so drawing
in a background thread neither needs nor changes a global backend, and a
notebook that imports this keeps its own. Accuracy is shown in percent, the x
axis counts rounds from 1 (metrics ``round``: the evaluation after that round). Needs the ``plots``
extra (``pip install 'fedjax_pfl[plots]'``); importing this module without
matplotlib raises ImportError, which callers turn into a one-line note.
"""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from fedjax_pfl.outputs import metrics_file
from fedjax_pfl.outputs.run_folder import partition_label
from fedjax_pfl.outputs.atomic_file import atomic_write

DPI = 120
RUN_FIGURES = ("accuracy.png", "loss.png", "client_accuracy.png", "partition.png")
DIAGNOSTICS_FIGURE = "diagnostics.png"  # drawn for a method that reports diagnostics (metrics_file.diagnostics)


def _new(width: float = 6.4, height: float = 4.0) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


LONG_LABEL = 30  # characters: a legend with a longer label (or more than 4 entries) goes below the axes
LEGEND_CHARACTERS_PER_INCH = 12  # of a "small" legend label: longer labels are wrapped to the figure's width


def _legend_below(labels: list[str]) -> bool:
    return len(labels) > 4 or any(len(label) > LONG_LABEL for label in labels)


def _wrapped(label: str, width_inches: float) -> str:
    return textwrap.fill(label, int(LEGEND_CHARACTERS_PER_INCH * (width_inches - 0.8)), break_on_hyphens=False)


def _legend(fig: Figure, ax, inside: str = "best") -> None:
    """The axes' legend: inside (``inside``) when short, else below the axes, across the figure's width,
    labels wrapped to it, so long labels neither squeeze the plot nor cover its data (constrained layout
    makes room)."""
    handles, labels = ax.get_legend_handles_labels()
    if not _legend_below(labels):
        ax.legend(loc=inside, fontsize="small")
        return
    columns = 2 if max(len(label) for label in labels) <= 40 and len(labels) > 2 else 1
    width = fig.get_figwidth() / columns
    fig.legend(handles, [_wrapped(label, width) for label in labels], loc="outside lower center", ncols=columns,
               fontsize="small", frameon=False)


def _height_with_legend(height: float, width: float, labels: list[str]) -> float:
    """Figure height that keeps the axes' height when the legend goes below (about 0.2 inch per text line)."""
    if not _legend_below(labels):
        return height
    return height + 0.2 * sum(_wrapped(label, width).count("\n") + 1 for label in labels)


def _rounds_axis(ax) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _percent_axis(ax, label: str) -> None:
    """Percent labels; the range follows the data but stays within 0-100%."""
    ax.set_ylabel(label)
    ax.yaxis.set_major_formatter(PercentFormatter(100, decimals=0))
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, 0), min(high, 100))


def _column(records: list[dict], key: str) -> np.ndarray:
    return np.array([r.get(key, np.nan) for r in records], float)


def accuracy_curves(records: list[dict], title: str = "") -> Figure:
    """Mean over clients with a +-1 std band over clients, and the sample-weighted accuracy."""
    fig = _new(6.4, _height_with_legend(4.0, 6.4, ["", "", "all test samples pooled (weighted by client size)"]))
    ax = fig.add_subplot()
    x = _column(records, "round")
    mean, std = 100 * _column(records, "accuracy"), 100 * _column(records, "accuracy_std")
    weighted = 100 * _column(records, "accuracy_weighted")
    line, = ax.plot(x, mean, marker="." if len(x) <= 30 else None, label="mean over clients")
    ax.fill_between(x, np.clip(mean - std, 0, 100), np.clip(mean + std, 0, 100), color=line.get_color(),
                    alpha=0.2, linewidth=0, label="± 1 std over clients")
    ax.plot(x, weighted, linestyle="--", color="0.25", label="all test samples pooled (weighted by client size)")
    _rounds_axis(ax)
    _percent_axis(ax, "test accuracy")
    _legend(fig, ax, "lower right")
    eval_model = records[-1].get("eval_model") if records else None
    ax.set_title(title or f"test accuracy of {evaluated_model(eval_model)}, per client", fontsize="medium")
    return fig


def loss_curves(records: list[dict], title: str = "") -> Figure:
    """Test loss (per sample, all clients pooled) and the mean local training loss of the selected clients."""
    fig = _new()
    ax = fig.add_subplot()
    x = _column(records, "round")
    ax.plot(x, _column(records, "loss"), label="test (per sample, all clients)")
    if any("train_loss" in r for r in records):
        ax.plot(x, _column(records, "train_loss"), linestyle="--", label="local training (selected clients)")
    _rounds_axis(ax)
    ax.set_ylabel("cross-entropy loss")
    ax.set_ylim(bottom=0)
    _legend(fig, ax)
    ax.set_title(title or "loss", fontsize="medium")
    return fig


# The model each evaluation protocol (a record's ``eval_model``: eval.model) tests, as an axis names it.
MODEL_EVALUATED = {"global": "the global model", "local": "a client's own model",
                   "global_adapted": "the global model adapted to a client", "global_knn": "the global model with a "
                   "client's kNN memory", "local_ala": "a client's ALA mix of its model and the global one"}


def evaluated_model(eval_model: str | None) -> str:
    """What an evaluation protocol tests, in words ('a client's model' when not recorded)."""
    return MODEL_EVALUATED.get(eval_model, f"a client's model ({eval_model})" if eval_model else "a client's model")


DIAGNOSTIC_LABELS = {  # kernels/collaboration.py's names; any other diagnostic is drawn under its own name
    "self_weight": "mean self-weight",
    "other_weight": "mean weight mass on other clients",
    "all_zero_share": "share of clients with all weights 0",
    "distance_mean": "mean pairwise model distance",
    "distance_max": "largest pairwise model distance",
}


def diagnostics_curves(records: list[dict], title: str = "") -> Figure:
    """One panel per diagnostic the method reported (`Method.round_diagnostics`), over the rounds."""
    series = metrics_file.diagnostics(records)
    known = list(DIAGNOSTIC_LABELS)
    series = dict(sorted(series.items(), key=lambda item: known.index(item[0]) if item[0] in known else len(known)))
    columns = min(3, max(len(series), 1))
    rows = -(-len(series) // columns)
    fig = _new(3.2 * columns, 2.6 * rows + 0.4)
    x = _column(records, "round")
    for i, (name, values) in enumerate(series.items()):
        ax = fig.add_subplot(rows, columns, i + 1)
        ax.plot(x, np.asarray(values, float), marker="." if len(x) <= 30 else None)
        ax.set_title(DIAGNOSTIC_LABELS.get(name, name), fontsize="small")
        _rounds_axis(ax)
    fig.suptitle(title or "what the method reports about each round", fontsize="medium")
    return fig


def client_accuracy_histogram(clients: list[dict], title: str = "", eval_model: str | None = None) -> Figure:
    """How many clients reach each test accuracy (5-point bins), with the mean and median marked; the axis
    names the model ``eval_model`` evaluates."""
    fig = _new()
    ax = fig.add_subplot()
    acc = 100 * np.array([c["accuracy"] for c in clients], float)
    acc = acc[np.isfinite(acc)]
    ax.hist(acc, bins=np.linspace(0, 100, 21), color="tab:blue", edgecolor="white")
    if acc.size:
        ax.axvline(acc.mean(), color="black", label=f"mean {acc.mean():.1f}% (std {acc.std():.1f})")
        ax.axvline(np.median(acc), color="black", linestyle=":", label=f"median {np.median(acc):.1f}%")
        ax.legend(loc="best", fontsize="small")
    ax.set_xlim(0, 100)
    ax.xaxis.set_major_formatter(PercentFormatter(100, decimals=0))
    ax.set_xlabel(f"test accuracy of {evaluated_model(eval_model)}, per client")
    ax.set_ylabel("clients")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title or "per-client test accuracy at the latest evaluation", fontsize="medium")
    return fig


MAX_BARS = 500  # clients drawn as one bar each in the partition picture; more are drawn as filled outlines


def partition_picture(partition: dict, title: str = "") -> Figure:
    """Label counts per client and class (heat map) beside each client's train and test size."""
    hist = np.asarray(partition["train"]["histograms"])
    n_clients, n_classes = hist.shape
    train = np.asarray(partition["train"]["sizes"])
    test = np.asarray(partition["test"]["sizes"]) if partition.get("test") else np.zeros_like(train)
    fig = _new(7.5, max(3.5, min(9.0, 1.5 + 0.2 * n_clients)))
    heat, sizes = fig.subplots(1, 2, sharey=True, width_ratios=[max(2, 0.4 * n_classes), 2.5])
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # a class the client lacks stays blank
    image = heat.imshow(np.ma.masked_equal(hist, 0), aspect="auto", cmap=cmap, interpolation="nearest",
                        vmin=0, vmax=max(int(hist.max()), 1))
    if n_clients * n_classes <= 400:
        bright = hist > 0.6 * max(hist.max(), 1)
        for (i, c), count in np.ndenumerate(hist):
            if count:
                heat.text(c, i, str(count), ha="center", va="center", fontsize=6,
                          color="black" if bright[i, c] else "white")
    fig.colorbar(image, ax=heat, label="train samples of the class", location="right", pad=0.01, fraction=0.05)
    heat.set_xlabel("class")
    heat.set_ylabel("client")
    heat.xaxis.set_major_locator(MaxNLocator(integer=True))
    heat.yaxis.set_major_locator(MaxNLocator(integer=True))
    heat.set_title("train label counts", fontsize="medium")
    y = np.arange(n_clients)
    if n_clients <= MAX_BARS:
        sizes.barh(y, train, color="tab:blue", label="train")
        sizes.barh(y, test, left=train, color="tab:orange", label="test")
    else:  # one filled outline per part instead of a bar per client (100,000 bars take minutes to draw)
        sizes.fill_betweenx(y, 0, train, step="mid", color="tab:blue", label="train", linewidth=0)
        sizes.fill_betweenx(y, train, train + test, step="mid", color="tab:orange", label="test", linewidth=0)
    sizes.set_xlabel("samples")
    sizes.set_title("client size", fontsize="medium")
    sizes.legend(loc="best", fontsize="small")
    sizes.grid(axis="x", alpha=0.3)
    heat.set_ylim(n_clients - 0.5, -0.5)
    info = partition.get("info") or {}
    fig.suptitle(title or f"partition of {info.get('dataset', 'the data')}: {n_clients} clients, {n_classes} classes"
                 + (f", {partition_label(info)}" if "scheme" in info else ""), fontsize="medium")
    return fig


def overlaid_accuracy(curves: list[dict], title: str = "") -> Figure:
    """Accuracy curves of several runs or seed groups: each dict has label, rounds, mean, std (or None).

    Long labels (or more than four curves) put the legend below the axes, which keep the figure's width."""
    fig = _new(7.0, _height_with_legend(4.3, 7.0, [c["label"] for c in curves]))
    ax = fig.add_subplot()
    for curve in curves:
        x = np.asarray(curve["rounds"], float)
        mean = 100 * np.asarray(curve["mean"], float)
        line, = ax.plot(x, mean, label=curve["label"])
        if curve.get("std") is not None:
            std = 100 * np.asarray(curve["std"], float)
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    _rounds_axis(ax)
    _percent_axis(ax, "test accuracy (mean over clients)")
    _legend(fig, ax, "lower right")
    ax.set_title(title, fontsize="medium")
    return fig


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def save_png(fig: Figure, path: Path) -> None:
    """Write ``fig`` as PNG; readers never see a half-written file."""
    with atomic_write(path, "wb") as f:
        f.write(png_bytes(fig))


def draw_run(plots_dir: Path, records: list[dict], partition: dict | None, clients: list[dict] | None,
             title: str = "") -> list[Path]:
    """The figures of one run into ``plots_dir``; those whose data is missing are left out."""
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    todo = {}
    if records:
        todo["accuracy.png"] = lambda: accuracy_curves(records, f"test accuracy: {title}" if title else "")
    if any("loss" in r for r in records):  # (a compact record keeps accuracies only)
        todo["loss.png"] = lambda: loss_curves(records, f"loss: {title}" if title else "")
    if metrics_file.diagnostics(records):
        todo[DIAGNOSTICS_FIGURE] = lambda: diagnostics_curves(records, f"diagnostics: {title}" if title else "")
    if clients:
        eval_model = records[-1].get("eval_model") if records else None
        todo["client_accuracy.png"] = lambda: client_accuracy_histogram(
            clients, f"per-client accuracy: {title}" if title else "", eval_model)
    written = []
    for name, make in todo.items():
        save_png(make(), plots_dir / name)
        written.append(plots_dir / name)
    if partition:
        with atomic_write(plots_dir / "partition.png", "wb") as f:
            f.write(partition_png(partition))
        written.append(plots_dir / "partition.png")
    return written


_last_partition: tuple[str, bytes] = ("", b"")  # the last partition picture drawn: its partition (JSON), its PNG


def partition_png(partition: dict) -> bytes:
    """`partition_picture` as PNG bytes; drawn once for runs that share a partition (a sweep's seeds)."""
    global _last_partition
    key = json.dumps(partition, sort_keys=True)
    if _last_partition[0] != key:
        _last_partition = (key, png_bytes(partition_picture(partition)))
    return _last_partition[1]
