"""A table's notes on how its cells weighed their clients: the per-client aggregation weights of each round.

A method whose rounds record one aggregation weight per selected client
(``client_diagnostics.weight`` in metrics.jsonl: FedAS's Fisher weights
alpha_i) claims that the weighting is what makes the difference; a cell's
accuracy alone does not show how unequal the weights were. For each run
folder of the table's cells that has them, `weight_summary` reads, round by
round, over the clients that uploaded (weight > 0): how many carry half the
weight (the fewest whose weights sum to 0.5), the largest weight, and the
largest over the smallest; the note gives their medians over rounds and
ranges, and, where the rounds record ``align_loss`` (FedAS's alignment), its
mean over clients in the first and the last round that aligned.
Nothing here imports JAX.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from fedjax_pfl.outputs import run_folder
from fedjax_pfl.papers.table_spec import Cell


def _weights_of(record: dict) -> list[float]:
    weights = ((record.get("client_diagnostics") or {}).get("weight") or {}).values()
    return sorted((float(w) for w in weights if float(w) > 0), reverse=True)


def half_carriers(weights: list[float]) -> int:
    """The fewest clients whose weights (largest first) sum to half the total."""
    total, running = sum(weights), 0.0
    for count, w in enumerate(weights, 1):
        running += w
        if running >= 0.5 * total:
            return count
    return len(weights)


def weight_summary(records: list[dict]) -> dict | None:
    """Per-round weight statistics of a run's records (module docstring), or None without weights."""
    rounds = [(r, w) for r in records if len(w := _weights_of(r)) > 0]
    if not rounds:
        return None
    half = [half_carriers(w) for _, w in rounds]
    clients = [len(w) for _, w in rounds]
    top = [w[0] / sum(w) for _, w in rounds]
    spread = [w[0] / w[-1] for _, w in rounds]
    summary = {"rounds": len(rounds), "half": (statistics.median(half), min(half), max(half)),
               "clients": statistics.median(clients), "top": statistics.median(top),
               "spread": (statistics.median(spread), max(spread))}
    aligned = [(r["round"], statistics.mean(float(v) for v in r["client_diagnostics"]["align_loss"].values()))
               for r, _ in rounds if any(float(v) > 0 for v in (r["client_diagnostics"].get("align_loss") or {}).values())]
    if aligned:
        summary["align_loss"] = (aligned[0], aligned[-1])
    return summary


def cell_note(name: str, s: dict) -> str:
    """One line for a cell's summary."""
    median, low, high = s["half"]
    rounds = f"{s['rounds']} round{'' if s['rounds'] == 1 else 's'}"
    text = (f"{name} ({rounds}): half the aggregation weight on {median:g} of {s['clients']:g} uploading clients "
            f"(median over rounds; {low}-{high}), the largest weight {s['top']:.2f} of the "
            f"total (median), the largest over the smallest x{s['spread'][0]:,.0f} (median; up to "
            f"x{s['spread'][1]:,.0f})")
    if "align_loss" in s:
        (first_round, first), (last_round, last) = s["align_loss"]
        text += (f"; alignment loss (mean over the round's clients) {first:.4g} in round {first_round}, "
                 f"{last:.4g} in round {last_round}")
    return text + "."


def notes(cells: list[Cell], runs_dir: Path) -> list[str]:
    """The table's note on its cells' aggregation weights (none when no run records them)."""
    lines = []
    for cell in cells:
        folder = Path(runs_dir) / cell.folder_name
        summary = weight_summary(run_folder.read_records(folder)) if run_folder.is_run(folder) else None
        if summary:
            lines.append(cell_note(cell.folder_name, summary))
    if not lines:
        return []
    return ["Aggregation weights of the cells run (client_diagnostics.weight of each round, over the clients "
            "that uploaded; papers/weight_notes.py): " + " ".join(lines)]
