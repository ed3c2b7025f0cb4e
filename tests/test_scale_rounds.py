"""benchmarks/scale_rounds.py end to end on a tiny federation: its records, not its speed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scale_rounds.py"
TINY = ["--methods", "ditto", "--clients", "30", "--cohort", "5", "--samples", "8", "--features", "5",
        "--rounds", "1"]


@pytest.mark.parametrize("device_bytes,fits", [(10**9, True), (1000, False)])
def test_records_name_variant_memory_and_fit(device_bytes, fits):
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--device-bytes", str(device_bytes)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["variant"] for r in records] == ["device", "host"]
    for r in records:
        assert r["workload"] == {"method": "ditto", "clients": 30, "cohort": 5, "samples": 8, "features": 5}
        assert r["device"] and r["fits_on_device"] is fits and r["state_and_data_bytes"] > 0 and r["rule"]
    device, host = records
    assert host["rounds_per_s"] > 0 and host["compile_s"] > 0 and host["peak_host_rss_bytes"] > 0
    if fits:
        assert device["rounds_per_s"] > 0 and device["peak_host_rss_bytes"] > 0
    else:
        assert "rounds_per_s" not in device and "not fit" in device["skipped"]
