"""The benchmarks report honest records (rounds/s, vs_pytorch, gpu_suite) and refuse to report a broken run."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rounds_per_second.py"
TINY = ["--models", "mlp", "--clients", "3", "--samples", "20", "--batch", "8", "--rounds", "1"]


def test_records_name_device_workload_and_ratio():
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--variants", "engine-map,loop"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    assert [r["variant"] for r in records] == ["engine-map", "loop"]
    for r in records:
        assert r["device"] and r["jax"] and r["workload"]["clients"] == 3
        assert r["s_per_round"] > 0 and r["compile_s"] >= 0 and r["peak_memory_bytes"] > 0
        assert abs(r["speedup_vs_loop"] - records[1]["s_per_round"] / r["s_per_round"]) < 1e-9


def test_non_finite_run_fails_loudly():
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--variants", "engine-vmap", "--lr", "1e38"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "non-finite" in proc.stderr and not proc.stdout.strip()


BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _finite_positive(record, keys):
    for k in keys:
        assert isinstance(record[k], (int, float)) and math.isfinite(record[k]) and record[k] >= 0, (k, record[k])


def test_vs_pytorch_tiny_reports_both_sides_or_says_why_not():
    proc = subprocess.run([sys.executable, str(BENCH / "vs_pytorch.py"), "--tiny"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    ours = record["fedjax_pfl"]
    _finite_positive(ours, ["train_s_per_round", "eval_s_per_round", "e2e_s_per_round", "compile_s",
                            "samples_per_s", "padding_efficiency", "peak_memory_bytes", "flops_per_sample",
                            "train_gflops", "matmul_peak_gflops", "mapping_choice_s"])
    assert ours["train_s_per_round"] > 0 and 0 < ours["padding_efficiency"] <= 1
    assert ours["train_samples_per_round"] == 2 * 20  # join ratio 0.5: 2 of 4
    tested = 4 * 10  # the mean over 4 clients of correct predictions among each one's 10 test samples
    assert 0 <= ours["accuracy"] <= 1 and ours["accuracy"] * tested == pytest.approx(round(ours["accuracy"] * tested))
    assert ours["flops_per_sample"] > 2 * 784 * 100  # the MLP 784-100-10's forward alone
    choice = ours["mapping_choice"]  # the engine's auto choice, timed
    assert choice["timed"] and ours["client_mapping"] == choice["mapping"] and ours["conv_impl"]
    assert record["peak_gflops"] >= ours["matmul_peak_gflops"] and ours["train_of_peak"] > 0
    assert record["device"] and record["workload"]["clients"] == 4 and record["workload"]["join_ratio"] == 0.5
    assert "| mlp, 10, 0.5 |" in proc.stdout  # the markdown table
    theirs = record["pytorch"]
    if theirs is None:  # torch not installed: the JAX side still stands, and the record says why
        assert "torch" in record["torch_note"] and record["ratio_train"] is None
    else:
        _finite_positive(theirs, ["train_s_per_round", "eval_s_per_round", "samples_per_s", "train_gflops",
                                  "matmul_peak_gflops"])
        assert theirs["train_samples_per_round"] == ours["train_samples_per_round"]  # the same 2 clients
        assert theirs["client_steps_per_round"] == ours["real_client_steps"]  # same steps on both sides
        assert record["ratio_train"] == theirs["train_s_per_round"] / ours["train_s_per_round"]
        assert record["ratio_e2e"] == theirs["e2e_s_per_round"] / ours["e2e_s_per_round"]


def test_vs_pytorch_reports_the_accuracy_of_the_trained_model(monkeypatch, data_dir):
    """On a workload that learns (4 IID Fashion-MNIST clients, 3 rounds) the accuracy a record reports clears
    the partition's majority-class baseline by far: it is the trained model's, evaluated on the real test
    samples (a model left at its initial parameters or a broken evaluation stays near the baseline)."""
    import majority_baseline

    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv("FEDJAX_PFL_DATA_DIR", str(data_dir))
    import vs_pytorch

    workload = dict(method="fedavg", model="mlp", batch=10, join_ratio=1.0, partition="iid", clients=4, epochs=2,
                    lr=0.05, train_per_client=100, test_per_client=50, mapping="map")
    record = vs_pytorch.measure_jax(workload, 2, 64, 10 ** 6)
    exp = vs_pytorch.build(workload)
    baseline = majority_baseline.from_client_data(exp.data.train, exp.data.test, exp.dataset.num_classes)
    assert record["accuracy"] > baseline + 0.3, (record["accuracy"], baseline)


BLOCKER = """
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"tqdm", "PIL", "torch"}:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: the GPU machine has none)")

sys.meta_path.insert(0, _Absent())
"""


def _suite(tmp_path, *args):
    """gpu_suite.py in a fresh process as the GPU machine runs it: PYTHONPATH=<repo> alone, from the repository
    root, with tqdm, Pillow and torch unimportable (a sitecustomize on the path blocks them; PyYAML stays:
    flax imports it, so a machine with flax has it)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(tmp_path)),
           "PYTHONPATH": f"{site}{os.pathsep}.", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}  # the suite's fast-compile flags (conftest.py)
    return subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--quick", "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=900, cwd=BENCH.parent, env=env)


def test_gpu_suite_quick_runs_with_only_the_core_packages_and_writes_markdown_and_json(tmp_path):
    proc = _suite(tmp_path, "--models", "mlp")  # the suite's structure; its CNN rows: the tests after this one
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    report = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert report["device"] and {p["dtype"] for p in report["matmul_peak"]} == {"bf16", "fp32"}
    _finite_positive(report["matmul_peak"][0], ["flops_per_s"])
    rows = report["records"]
    assert [(r["method"], r["mapping"]) for r in rows] == [("fedavg", "auto"), ("fedas", "auto")]
    assert not [r for r in rows if "error" in r], rows
    for r in rows:
        _finite_positive(r, ["rounds_per_s", "s_per_round", "compile_s", "peak_memory_bytes",
                             "padding_efficiency", "samples_per_s", "flops_per_step", "achieved_flops_per_s"])
    _finite_positive(report["copy_bandwidth"], ["bytes_per_s"])
    for r in rows:  # auto: every candidate timed (no budget in the suite), the fastest taken
        choice = r["mapping_choice"]
        assert choice["timed"] and r["client_mapping"] == choice["mapping"]
        assert set(choice["candidates"]) == {"map", "vmap"}
    assert "torch is not installed" in report["torch_note"]  # blocked: optional
    table = (tmp_path / "out" / "suite.md").read_text()
    chosen = rows[0]["client_mapping"]
    assert report["device"] in table and f"| jax | fedavg | mlp | 4 | auto ({chosen}) | direct |" in table
    assert "All 2 configurations completed." in table


def test_gpu_suite_exits_non_zero_when_a_configuration_fails(tmp_path):
    proc = _suite(tmp_path, "--methods", "fedavg", "--mappings", "map", "--models", "fedavgcnn,nosuchnet")
    assert proc.returncode == 1, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "out" / "suite.json").read_text())["records"]
    assert "error" not in rows[0] and "nosuchnet" in rows[1]["error"]
    assert "1 of 2 configurations failed." in (tmp_path / "out" / "suite.md").read_text()


def test_gpu_suite_variants_are_rows_of_known_names_with_their_precision_and_flags(monkeypatch):
    """--variants triples (or the product of --convs, --precisions, --xla-variants) become rows whose precision is
    a RunConfig setting and whose XLA flags go to the child's environment; unknown names are refused."""
    monkeypatch.syspath_prepend(str(BENCH))
    import argparse

    import gpu_suite

    ask = lambda **kw: gpu_suite.chosen_variants(argparse.Namespace(**{  # noqa: E731
        "variants": None, "convs": "direct", "precisions": "fp32,bf16", "xla_variants": "default", **kw}))
    assert ask() == [("direct", "fp32", "default"), ("direct", "bf16", "default")]
    for bad, message in [({"xla_variants": "default,fastest"}, "--xla-variants takes"),
                         ({"variants": "pallas:bf16"}, "--variants takes conv:precision:xla triples"),
                         ({"variants": "pallas:bf16:fastest"}, "--xla-variants takes")]:
        with pytest.raises(ValueError, match=message):
            ask(**bad)
    rows = gpu_suite.configurations({}, ["fedavg"], ["mlp"], ["4"], ["map"],
                                    ask(variants="pallas:bf16:default,direct:fp32:command_buffer"))
    assert [(s["conv"], s["variant"], s["settings"], s["xla"]) for _, s in rows] == [
        ("pallas", "bf16", {"train.precision": "bf16"}, "default"),
        ("direct", "command_buffer", {"train.precision": "fp32"}, "command_buffer")]
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d")
    assert gpu_suite.child_env("jax", "command_buffer")["XLA_FLAGS"] == (
        "--xla_dump_to=/tmp/d --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL")


def test_every_xla_variant_flag_is_one_this_jax_parses(monkeypatch):
    """XLA aborts a backend's start on a flag it does not know: every variant's flags at once start one here."""
    monkeypatch.syspath_prepend(str(BENCH))
    from xla_variants import XLA_VARIANTS

    env = {**os.environ, "XLA_FLAGS": " ".join(f for f in XLA_VARIANTS.values() if f)}
    proc = subprocess.run([sys.executable, "-c", "import jax; print(float(jax.jit(lambda x: x + 1)(1.0)))"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "2.0", proc.stderr[-2000:]


def test_step_bytes_grow_with_the_batch_and_a_row_gets_its_share_of_the_copy_bandwidth(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import flops
    import gpu_suite

    small, large = (flops.step_bytes("mlr", (12,), 10, batch) for batch in (4, 256))
    assert 0 < small < large, (small, large)
    row = {"side": "jax", "method": "fedavg", "model": "mlp", "clients": 4, "mapping": "map", "conv": "direct",
           "variant": "", "s_per_round": 2.0, "achieved_bytes_per_s": 3e11}
    gpu_suite.derived([row], {"fp32": 1e12}, 1.2e12)
    assert row["of_copy_bandwidth"] == pytest.approx(0.25)


def test_cnn_step_reports_the_step_and_its_op_families():
    proc = subprocess.run([sys.executable, str(BENCH / "cnn_step.py"), "--batches", "2", "--steps", "3"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    assert record["device"] and record["workload"]["batch"] == 2
    _finite_positive(record["jax"], ["samples_per_s", "ms_per_step"])
    ops = record["jax"]["xla_ms_per_step"]
    assert ops and all(v >= 0 for v in ops.values()) and not any(k.startswith("$") for k in ops)
    if record["pytorch"] is None:  # torch is the optional bench extra
        assert record["ratio"] is None
    else:
        _finite_positive(record["pytorch"], ["samples_per_s", "ms_per_step"])
        assert record["ratio"] > 0


def test_seeds_batched_quick_compares_both_modes_and_they_agree():
    proc = subprocess.run([sys.executable, str(BENCH / "seeds_batched.py"), "--quick", "--methods", "fedavg",
                           "--seeds", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    for side in ("batched", "one_after_another"):
        _finite_positive(record[side], ["seconds", "rounds_per_s", "first_call_s", "peak_rss_bytes"])
    assert record["speedup_batched_over_one_after_another"] == record["one_after_another"]["seconds"] / \
        record["batched"]["seconds"]
    assert record["max_final_accuracy_difference"] < 1e-4


def test_memory_quick_streamed_chunks_hold_less_than_the_whole_gather():
    proc = subprocess.run([sys.executable, str(BENCH / "memory.py"), "--quick"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = {r["variant"]: r for r in (json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{"))}
    assert set(records) == {"vmap", "chunked-whole", "chunked"}
    for r in records.values():
        assert r["device"] and r["workload"]["method"] == "fedas" and r["workload"]["clients"] == 6
        _finite_positive(r, ["temp_bytes", "argument_bytes", "output_bytes", "total_bytes", "client_state_bytes",
                             "temp_bytes_per_selected_client"])
        assert r["total_bytes"] == r["temp_bytes"] + r["argument_bytes"] + r["output_bytes"] - r["aliased_bytes"]
        assert r["temp_vs_chunked"] == r["temp_bytes"] / records["chunked"]["temp_bytes"]
    assert records["chunked"]["temp_bytes"] < records["chunked-whole"]["temp_bytes"]


def test_gpu_suite_sides_keeps_one_sides_rows_and_refuses_an_unknown_side(tmp_path):
    proc = _suite(tmp_path, "--methods", "fedavg", "--mappings", "map", "--sides", "torch")
    assert proc.returncode == 1, proc.stderr[-2000:]  # torch blocked here: nothing measured, still reported
    report = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert report["records"] == [] and "torch is not installed" in report["torch_note"]
    bad = _suite(tmp_path, "--sides", "pytorch")
    assert bad.returncode == 2 and "--sides takes jax, torch" in bad.stderr


PARENT_WITHOUT_BACKEND = BLOCKER + """
import os
# The suite's own process must start no JAX backend (on a GPU that takes 75% of the memory from every child):
# here any backend it started would be one that does not exist. Children measure on the CPU.
os.environ["JAX_PLATFORMS"] = "cpu" if "--child" in sys.argv else "no_such_platform"
"""


def test_gpu_suite_measures_in_children_only_so_the_suite_process_holds_no_device(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PARENT_WITHOUT_BACKEND)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(tmp_path)),
           "PYTHONPATH": f"{site}{os.pathsep}.", "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}  # fast compile
    tiny = ["--methods", "fedavg", "--mappings", "map", "--convs", "direct", "--clients", "4", "--train-samples", "96",
            "--test-samples", "32", "--epochs", "1", "--rounds", "1", "--matmul-size", "128"]
    proc = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--out", str(tmp_path / "out"), *tiny],
                          capture_output=True, text=True, timeout=600, cwd=BENCH.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    report = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert report["backend"] == "cpu" and report["device"].startswith("cpu: ")  # from the device child
    (row,) = report["records"]
    _finite_positive(row, ["rounds_per_s", "flops_per_step", "achieved_flops_per_s"])


def test_step_flops_asks_the_compiled_module_when_the_lowered_one_gives_no_count(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import flops

    lowered = flops.step_flops("fedavgcnn", (32, 32, 3), 10, 16)
    asked, real = [], flops.cost_flops

    def lowered_gives_none(analysis):
        asked.append(analysis)
        return None if len(asked) == 1 else real(analysis)

    monkeypatch.setattr(flops, "cost_flops", lowered_gives_none)
    compiled = flops.step_flops("fedavgcnn", (32, 32, 3), 10, 16)
    assert len(asked) == 2 and compiled == pytest.approx(lowered, rel=0.01)


def test_step_flops_counts_every_convolution_of_fedavgcnn(monkeypatch):
    """Against the count by hand (a GPU's compiled module once gave 1/8 of it: its library convolutions
    carry no FLOPs). Conv 5x5x3->32 to 28x28, conv 5x5x32->64 to 10x10, dense 1600->512->10, 2 FLOPs a
    multiply-add: forward, every weight gradient, and every input gradient but the first layer's."""
    monkeypatch.syspath_prepend(str(BENCH))
    import flops

    macs = [28 * 28 * 32 * 5 * 5 * 3, 10 * 10 * 64 * 5 * 5 * 32, 1600 * 512, 512 * 10]
    by_hand = 2 * (2 * sum(macs) + sum(macs[1:]))
    per_sample = flops.step_flops("fedavgcnn", (32, 32, 3), 10, 16) / 16
    assert by_hand <= per_sample <= 1.03 * by_hand  # the rest: biases, ReLU, pooling, softmax, the update


def test_gpu_suite_reports_its_comparisons_as_ratios(monkeypatch):
    """Each JAX row against the PyTorch loop (FedAvg, same model and clients) and against its twins with one label
    column at a baseline: native and direct conv, fp32 under XLA's defaults, the chunked:32 and vmap mappings."""
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_suite

    row = lambda side, conv, s, method="fedavg", clients=100, mapping="chunked", variant="": {  # noqa: E731
        "side": side, "method": method, "model": "fedavgcnn", "clients": clients, "mapping": mapping, "conv": conv,
        "variant": variant, "s_per_round": s}
    lines = gpu_suite.ratio_lines([row("jax", "native", 2.0), row("jax", "direct", 1.6), row("torch", "native", 26.0),
                                   row("jax", "direct", 3.0, method="fedas"), row("jax", "native", 5.0, clients=20),
                                   {**row("jax", "im2col", 1.0), "error": "out of memory"},
                                   row("jax", "direct", 0.8, mapping="chunked:32"), row("jax", "direct", 0.5, mapping="packed"),
                                   row("jax", "direct", 1.2, mapping="vmap"), row("jax", "direct", 0.8, variant="bf16"),
                                   row("jax", "pallas", 0.4, variant="bf16")])
    assert lines[3] == ("| method | model | clients | mapping | conv | variant | vs PyTorch loop | vs native conv | "
                        "vs direct conv | vs fp32 default variant | vs chunked:32 mapping | vs vmap mapping |")
    assert lines[5:] == ["| fedavg | fedavgcnn | 100 | chunked | native |  | 13.00x | - | 0.80x | - | - | - |",
                         "| fedavg | fedavgcnn | 100 | chunked | direct |  | 16.25x | 1.25x | - | - | 0.50x | 0.75x |",
                         "| fedavg | fedavgcnn | 100 | chunked:32 | direct |  | 32.50x | - | - | - | - | 1.50x |",
                         "| fedavg | fedavgcnn | 100 | packed | direct |  | 52.00x | - | - | - | 1.60x | 2.40x |",
                         "| fedavg | fedavgcnn | 100 | vmap | direct |  | 21.67x | - | - | - | 0.67x | - |",
                         "| fedavg | fedavgcnn | 100 | chunked | direct | bf16 | 32.50x | - | - | 2.00x | - | - |",
                         "| fedavg | fedavgcnn | 100 | chunked | pallas | bf16 | 65.00x | - | 2.00x | - | - | - |"]
    assert gpu_suite.ratio_lines([row("jax", "native", 2.0)]) == []


def test_gpu_suite_packed_rows_carry_steps_peak_shares_floor_and_the_difference_from_map(tmp_path):
    proc = _suite(tmp_path, "--methods", "fedavg", "--models", "mlp", "--mappings", "map,packed:2", "--no-torch")
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    rows = {r["mapping"]: r for r in json.loads((tmp_path / "out" / "suite.json").read_text())["records"]}
    packed, plain = rows["packed:2"], rows["map"]
    assert packed["client_mapping"] == "packed:2" and plain["max_param_diff_from_map"] == 0.0
    assert 0 <= packed["max_param_diff_from_map"] < 1e-5
    for r in rows.values():
        _finite_positive(r, ["sequential_steps_per_round", "ms_per_sequential_step", "us_per_executed_client_step",
                             "of_fp32_peak", "of_bf16_peak", "latency_floor_s", "padding_efficiency"])
        assert r["real_client_steps_per_round"] <= r["executed_client_steps_per_round"]
        assert r["latency_floor_s"] == pytest.approx(r["largest_client_steps"] * r["ms_per_sequential_step"] / 1e3)
    assert plain["sequential_steps_per_round"] == plain["real_client_steps_per_round"]  # one client at a time
    assert packed["sequential_steps_per_round"] * 2 == packed["executed_client_steps_per_round"]
    table = (tmp_path / "out" / "suite.md").read_text()
    assert "| jax | fedavg | mlp | 4 | packed:2 | direct |" in table and "max diff vs map" in table


def test_gpu_suite_sweep_width_times_one_step_at_each_width(tmp_path):
    proc = _suite(tmp_path, "--sweep-width", "--models", "mlp", "--widths", "1,3")
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    report = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert report["sweep"] and [r["lanes"] for r in report["records"]] == [1, 3]
    for r in report["records"]:
        _finite_positive(r, ["ms_per_step", "us_per_client_step", "achieved_flops_per_s"])
        assert r["us_per_client_step"] == pytest.approx(1e3 * r["ms_per_step"] / r["lanes"])
    assert "| mlp | direct |  | 3 |" in (tmp_path / "out" / "suite.md").read_text()


def test_padding_efficiency_counts_every_mapping_and_packed_stays_above_097():
    proc = subprocess.run([sys.executable, str(BENCH / "padding_efficiency.py"), "--clients", "100",
                           "--widths", "8,24,64"], capture_output=True, text=True, timeout=600, cwd=BENCH.parent,
                          env={**os.environ, "PYTHONPATH": str(BENCH.parent)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    eff, executed = record["padding_efficiency"], record["executed_client_steps"]
    assert executed["map"] == record["real_client_steps"] and eff["map"] == 1.0
    assert record["packed_at_least_target"] == {"target": 0.97, "widths": [8, 24], "holds": True}
    assert record["packed_width"] == int(record["total_over_largest"]) == 24
    assert eff["vmap"] < eff["chunked:24"] < eff["packed:24"] and eff["packed:64"] < 0.97  # the largest caps W=64
    assert executed["vmap"] == 100 * record["largest_client_steps"]


def test_gpu_suite_budget_lists_what_it_did_not_start_and_a_suite_that_measured_nothing_fails(tmp_path):
    proc = _suite(tmp_path, "--budget-s", "0")
    assert proc.returncode == 1, proc.stderr[-2000:]  # nothing measured is not a success
    report = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert report["records"] == [] and [r["method"] for r in report["not_run"]] == ["fedavg", "fedas"]
    assert "Not run (--budget-s 0 reached): jax fedavg fedavgcnn 4 auto direct; jax fedas" in (
        tmp_path / "out" / "suite.md").read_text()


def test_augmentation_quick_reports_both_variants_and_their_ratio():
    proc = subprocess.run([sys.executable, str(BENCH / "augmentation.py"), "--quick", "--clients", "3",
                           "--samples", "60"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    records = {r["variant"]: r for r in lines if "variant" in r}
    assert set(records) == {"train.augment=none", "train.augment=crop_flip"}
    for r in records.values():
        assert r["device"] and r["workload"]["clients"] == 3
        _finite_positive(r, ["s_per_round", "rounds_per_s", "compile_s", "peak_memory_bytes"])
    (ratio,) = [r["crop_flip_over_none_rounds_per_s"] for r in lines if "crop_flip_over_none_rounds_per_s" in r]
    assert ratio == records["train.augment=crop_flip"]["rounds_per_s"] / records["train.augment=none"]["rounds_per_s"]


def test_vs_pfl_tiny_runs_pfl_researchs_counts_and_says_why_when_the_peer_is_absent():
    """vs_pfl.py --tiny: pfl-research's CIFAR-10 benchmark counts (1,000 clients of 50 images, 50 a round, 1
    epoch of batches of 10) on random CIFAR-shaped data; the peer's row where pfl is installed, else one line."""
    proc = subprocess.run([sys.executable, str(BENCH / "vs_pfl.py"), "--tiny", "--client-mapping", "map"],
                          capture_output=True, text=True, timeout=900)  # (the timed choice: test_mapping_choice.py)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    *sides, comparison = rows
    ours = sides[-1]
    assert ours["side"] == "fedjax_pfl" and ours["workload"]["clients"] == 1000
    assert ours["clients_per_round"] == 50 and ours["train_images_per_client"] == [50, 50]  # [smallest, largest]
    assert ours["client_steps_per_round"] == 50 * 5  # 50 clients x ceil(50 / 10) steps x 1 epoch
    assert ours["test_images"] == 1000 and ours["rounds"] == 3  # block 0 (rounds 0, 1) and one timed block
    _finite_positive(ours, ["e2e_s_per_round", "train_s_per_round", "eval_s", "warmup_block_s", "peak_memory_bytes"])
    assert ours["e2e_s_per_round"] > ours["train_s_per_round"] > 0 and 0 <= ours["accuracy"] <= 1
    assert len(ours["accuracy_per_block"]) == 2 and comparison["accuracy_fedjax_pfl"] == ours["accuracy"]
    assert ours["dropout"] and ours["workload"]["dropout"]  # simple_cnn's dropout on fedjax_pfl's side too
    if len(sides) == 1:  # pfl-research not installed: fedjax_pfl's side stands, and the comparison says why
        assert "pfl" in comparison["peer_note"] and "\n" not in comparison["peer_note"]
        assert comparison["ratio_e2e"] is None and "vs_pfl: pfl-research not timed" in proc.stderr
    else:
        theirs = sides[0]
        assert theirs["side"] == "pfl" and theirs["rounds"] == ours["rounds"] and theirs["dropout"]
        assert theirs["client_steps_per_round"] == ours["client_steps_per_round"]
        assert comparison["ratio_e2e"] == theirs["e2e_s_per_round"] / ours["e2e_s_per_round"]


def test_vs_pfl_gives_each_client_its_images_in_a_random_order():
    """pfl-research iterates a user's images in the order given and the CIFAR-10 copy is stored by class: the
    clients' indices are the iid partition's, each client's shuffled (sorted ones gave pfl one-class batches)."""
    sys.path.insert(0, str(BENCH))
    import vs_pfl
    from fedjax_pfl.data import partition

    spec = {"data": "random", "clients": 40, "images_per_client": 50, "test_images": 10, "seed": 3}
    clients = vs_pfl.workload_arrays(spec)["clients"]
    cut = partition.iid(vs_pfl.workload_arrays(spec)["y_train"], 40, 3)
    assert [sorted(c) for c in clients.tolist()] == [sorted(c) for c in np.asarray(cut).tolist()]
    assert not any(np.all(np.diff(c) > 0) for c in clients)  # no client's images in stored order


@pytest.fixture
def x64():
    import jax

    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def test_vs_pfl_starts_both_sides_from_the_same_model(x64):
    """pfl_cnn with the parameters vs_pfl.py gives it computes pfl-research's simple_cnn (PyTorch's layout,
    NCHW flattening) on the same images: a float64 NumPy reference of the PyTorch model."""
    sys.path.insert(0, str(BENCH))
    try:
        import vs_pfl
    finally:
        sys.path.remove(str(BENCH))
    import jax

    from fedjax_pfl.models.networks import build_model

    torch_params = {k: v.astype(np.float64) for k, v in vs_pfl.initial_parameters(3).items()}
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3))

    def conv(x_nchw, w, b):  # VALID cross-correlation, PyTorch's Conv2d
        k = w.shape[-1]
        ho, wo = x_nchw.shape[2] - k + 1, x_nchw.shape[3] - k + 1
        out = sum(np.einsum("nchw,oc->nohw", x_nchw[:, :, i:i + ho, j:j + wo], w[:, :, i, j])
                  for i in range(k) for j in range(k))
        return out + b[None, :, None, None]

    h = np.maximum(conv(x.transpose(0, 3, 1, 2), torch_params["conv0.weight"], torch_params["conv0.bias"]), 0)
    h = np.maximum(conv(h, torch_params["conv1.weight"], torch_params["conv1.bias"]), 0)
    h = h.reshape(2, 64, 14, 2, 14, 2).max(axis=(3, 5)).reshape(2, -1)  # 2x2 max-pool, flatten (C, H, W)
    h = np.maximum(h @ torch_params["dense0.weight"].T + torch_params["dense0.bias"], 0)
    expected = h @ torch_params["logits.weight"].T + torch_params["logits.bias"]
    model = build_model("pfl_cnn", (32, 32, 3), 10, conv_impl="native")
    params = jax.tree.map(np.asarray, vs_pfl.as_flax_params(torch_params))
    logits = model.apply({"params": params}, x).logits
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-10, atol=1e-10)


def test_vs_fedjax_tiny_runs_fedjaxs_round_and_says_why_when_fedjax_is_absent():
    """vs_fedjax.py --tiny: FedJAX's EMNIST FedAvg round (10 clients, batches of 10, 28x28x1 images, 62 classes,
    an evaluation after round 1 and every 5) on random images; FedJAX's rows where its Python is given
    (FEDJAX_PFL_FEDJAX_PYTHON), else one line."""
    proc = subprocess.run([sys.executable, str(BENCH / "vs_fedjax.py"), "--tiny", "--client-mapping", "map"],
                          capture_output=True, text=True, timeout=900)  # (the timed choice: test_mapping_choice.py)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    sides = [r for r in rows if "side" in r]
    comparisons = [r for r in rows if "comparison" in r]
    ours = sides[-1]
    assert ours["side"] == "fedjax_pfl" and ours["method"] == "fedavg_server_adam" and ours["dropout"]
    assert ours["clients_per_round"] == 10 and ours["rounds"] == 10  # block 0 (rounds 1-5) and one timed block
    assert ours["test_images"] == 30 * 5 and ours["workload"]["fedjax_config"]["client_learning_rate"] == 0.001
    _finite_positive(ours, ["e2e_s_per_round", "train_s_per_round", "eval_s", "client_steps_per_round",
                            "peak_memory_bytes"])
    assert ours["mapping_check"]["chosen"] == "map" and len(ours["accuracy_per_block"]) == 2
    if len(sides) == 1:
        (comparison,) = comparisons
        assert "fedjax" in comparison["peer_note"] and "\n" not in comparison["peer_note"]
        assert comparison["ratio_train"] is None and "vs_fedjax: FedJAX not timed" in proc.stderr
    else:
        assert [s["side"] for s in sides] == ["fedjax", "fedjax_pmap", "fedjax_pfl"]
        for theirs, comparison in zip(sides, comparisons):
            assert theirs["rounds"] == ours["rounds"] and comparison["comparison"] == f"{theirs['side']} / fedjax_pfl"
            assert comparison["ratio_train"] == theirs["train_s_per_round"] / ours["train_s_per_round"]


def test_fedavg_server_adam_steps_the_global_model_as_fedjaxs_server_adam(x64):
    """benchmarks/fedavg_server_adam.py: Adam (bias-corrected) along the global parameters minus the uploads'
    mean weighted by n_i, two rounds against a float64 NumPy reference."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(BENCH))
    try:
        import fedavg_server_adam as sa
    finally:
        sys.path.remove(str(BENCH))
    from fedjax_pfl.methods.base import ServerRound

    m = type("Bound", (), {"hparams": sa.ServerAdamConfig(server_lr=0.5, b1=0.9, b2=0.99, eps=0.01)})()
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
    server = {"variables": {"params": jax.tree.map(jnp.asarray, params)},
              "opt_state": sa.server_optimizer(m).init(jax.tree.map(jnp.asarray, params))}
    mom = {k: np.zeros_like(v) for k, v in params.items()}
    sec = {k: np.zeros_like(v) for k, v in params.items()}
    for step in (1, 2):
        uploads = {k: rng.normal(size=(4, *v.shape)) for k, v in params.items()}
        n = np.array([10.0, 30.0, 0.0, 60.0])
        info = ServerRound(jnp.int32(step - 1), jnp.arange(4), jnp.asarray(n), jnp.array([True, True, True, False]))
        server, _ = sa.server_update(m, server, {}, {"variables": {"params": jax.tree.map(jnp.asarray, uploads)}},
                                     info)
        weights = np.where([True, True, True, False], n, 0.0)
        for k in params:
            delta = params[k] - np.tensordot(weights, uploads[k], 1) / weights.sum()
            mom[k] = 0.9 * mom[k] + 0.1 * delta
            sec[k] = 0.99 * sec[k] + 0.01 * delta ** 2
            m_hat, v_hat = mom[k] / (1 - 0.9 ** step), sec[k] / (1 - 0.99 ** step)
            params[k] = params[k] - 0.5 * m_hat / (np.sqrt(v_hat) + 0.01)
            np.testing.assert_allclose(np.asarray(server["variables"]["params"][k]), params[k], rtol=1e-7)  # optax: f32 factors


def test_the_fedas_round_split_subtracts_its_variants():
    """benchmarks/fedas_round_split.py: each phase is a difference of real rounds, local training the slope over
    epochs; the shares are of the FedAS round and its evaluation."""
    sys.path.insert(0, str(BENCH))
    import fedas_round_split

    rounds = {"fedas": 100.0, "no_alignment": 80.0, "fedper": 66.0, "fedper_E1": 18.0, "fedavg": 60.0}
    seconds = {name: {"round_s": s, "evaluation_s": 4.0} for name, s in rounds.items()}
    got = fedas_round_split.split(seconds, epochs=5)
    assert got["seconds"] == {"alignment": 20.0, "fisher_trace": 14.0, "local_training": 60.0,
                              "aggregation_and_fixed": 6.0, "evaluation": 4.0}
    assert sum(got["seconds"].values()) == pytest.approx(104.0)
    assert got["share_of_round_and_evaluation"]["local_training"] == pytest.approx(60 / 104, abs=1e-3)


def test_the_fedas_round_split_times_one_clients_fisher_pass_beside_one_epoch():
    """fedas_round_split.pass_seconds: both passes of the median client timed, the ratio the two medians'."""
    sys.path.insert(0, str(BENCH))
    import fedas_round_split

    engine = fedas_round_split.build([*fedas_round_split.QUICK, "--out", os.devnull])
    got = fedas_round_split.pass_seconds(engine, repeats=2)
    sizes = sorted(np.asarray(engine.train.n).tolist())
    assert got["client_samples"] == sizes[len(sizes) // 2]
    assert all(s > 0 for s in got["seconds"].values())
    assert got["fisher_over_epoch"] == pytest.approx(
        got["seconds"]["fisher_pass"] / got["seconds"]["training_epoch"], rel=1e-2)
