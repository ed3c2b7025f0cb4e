"""papers/weight_notes.py: a table's note on how unequal its cells' per-client aggregation weights were."""

import json

import pytest

from fedjax_pfl.papers import weight_notes
from fedjax_pfl.papers.table_spec import load_table


def _record(round_index, weights, align=None):
    diag = {"weight": {str(i): w for i, w in enumerate(weights)}}
    if align is not None:
        diag["align_loss"] = {str(i): a for i, a in enumerate(align)}
    return {"round": round_index, "accuracy": 0.5, "client_diagnostics": diag}


@pytest.mark.parametrize("weights, half", [([0.5, 0.3, 0.2], 1), ([0.4, 0.3, 0.3], 2), ([0.25] * 4, 2),
                                           ([0.1] * 10, 5), ([1.0], 1)])
def test_half_carriers_is_the_fewest_clients_holding_half_the_weight(weights, half):
    assert weight_notes.half_carriers(sorted(weights, reverse=True)) == half


def test_summary_over_rounds_ignores_dropped_uploads_and_reads_the_alignment_loss():
    records = [_record(1, [0.7, 0.2, 0.1, 0.0], align=[0.0, 0.0, 0.0, 0.0]),  # round 0's: no alignment yet
               _record(2, [0.4, 0.4, 0.1, 0.1], align=[2.0, 4.0, 6.0, 0.0]),
               _record(3, [0.97, 0.01, 0.01, 0.01], align=[1.0, 1.0, 1.0, 1.0]),
               {"round": 4, "accuracy": 0.6}]  # a record without weights (e.g. an evaluation-only line)
    s = weight_notes.weight_summary(records)
    assert s["rounds"] == 3 and s["half"] == (1, 1, 2) and s["clients"] == 4  # the 0.0 upload is not a client
    assert s["top"] == pytest.approx(0.7) and s["spread"] == pytest.approx((7.0, 97.0))
    assert s["align_loss"] == ((2, 3.0), (3, 1.0))
    line = weight_notes.cell_note("fedas-x/seed0", s)
    assert "half the aggregation weight on 1 of 4" in line and "x97" in line and "3 in round 2, 1 in round 3" in line
    assert weight_notes.weight_summary([{"round": 1, "accuracy": 0.1}]) is None


def test_the_tables_note_names_each_cell_with_weights(tmp_path):
    table = tmp_path / "t.yaml"
    table.write_text("paper: P\ntable: T\nmetric: best\nseeds: [0]\nsettings:\n  - {name: s, overrides: "
                     "[data.name=synthetic]}\nmethods:\n  - fedas\n  - fedavg\n")
    spec = load_table(table)
    runs = tmp_path / "runs"
    for cell in spec.cells():
        folder = runs / cell.folder_name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"config": {}}))
        lines = [_record(1, [0.6, 0.4])] if cell.method.name == "fedas" else [{"round": 1, "accuracy": 0.3}]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    [note] = weight_notes.notes(spec.cells(), runs)
    assert "fedas-s/seed0 (1 round): half the aggregation weight on 1 of 2" in note and "fedavg" not in note
