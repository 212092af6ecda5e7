"""scripts/gpu_check.sh, the one command of every GPU check, runs each of its steps and writes docs/speed.md's GPU
table; here in its CPU dry run (a tiny model, one length), as a lent GPU would run it at full size."""

import json
import os
import statistics
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_the_gpu_check_runs_every_step_on_a_cpu_and_writes_the_table_of_its_measurements(tmp_path):
    out = tmp_path / "results" / "gpu.json"
    command = ["bash", "scripts/gpu_check.sh", "--dry-run", "--lengths", "8", "--budget", "400", "--out", str(out)]
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    # the CUDA tests were collected and ran (those that need a GPU skipped on this CPU)
    assert report["tests"]["returncode"] == 0 and "skipped" in report["tests"]["summary"], report["tests"]
    # which SDPA kernel each mask's training step ran
    for mask in ("resonance", "none"):
        assert any(name.startswith("aten::_scaled_dot_product") for name in report["sdpa_backends"][mask])
    # one speed.py run per length, its result file beside the report
    assert report["speed"]["8"]["returncode"] == 0 and (out.parent / "speed_L8.json").is_file()
    table = report["table"]
    assert table["columns"] == ["L 8"]
    values = {(row["field"], row["key"]): row["values"] for row in table["rows"]}
    assert all(len(column) == 1 for column in values.values())
    resonance = "resonance (compiled_masks=True)"  # the default configuration on CUDA
    # the table carries the ratio speed.py measured: the median of its rounds' ratios (no timing is judged here)
    measured = json.loads((out.parent / "speed_L8.json").read_text())["ratios"][f"L8/train/{resonance} / none"]
    assert values["ratios", f"train/{resonance} / none"][0] == round(measured["value"], 3)
    assert measured["value"] == statistics.median(measured["per_round"]) and min(measured["per_round"]) > 0
    assert values["median_s", "train/none"][0] > 0
    assert values["kernels", f"train/{resonance}"][0] > values["kernels", "train/none"][0] > 0  # GA's own kernels
    # the first training step's seconds (on CUDA it compiles the masks) and the next's, per mask
    assert all(report["first_steps"][mask]["second_step_s"] > 0 for mask in ("resonance", "none"))
