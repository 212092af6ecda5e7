"""`benchmarks/speed.py --quick` runs end to end and writes every ratio. No timing is asserted: the ratios of a tiny
model on a shared machine say nothing; the full benchmark and its reading are in docs/speed.md."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_speed_quick_writes_every_ratio(tmp_path):
    out = tmp_path / "quick.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speed.py"), "--quick", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "PASS" in completed.stdout or "MISS" in completed.stdout  # the table was printed

    results = json.loads(out.read_text())
    expected = results["expected_ratio_keys"]
    lengths = results["options"]["seq_lens"]
    for length in lengths:  # every comparison is present at every length
        for name in ("train/product_vs_none", "train/none_vs_bart", "gen/product_nocache_vs_cache"):
            assert f"L{length}/{name}" in expected
    for variant in ("resonance", "scope", "product", "mean"):
        assert f"L{lengths[0]}/train/{variant}_vs_none" in expected
    assert any("sdpa_vs_eager" in key for key in expected)

    assert set(results["ratios"]) == set(expected)
    for key in expected:
        ratio = results["ratios"][key]
        for field in ("value", "value_wall", "ratio_of_medians"):
            assert math.isfinite(ratio[field]) and ratio[field] > 0, (key, field, ratio[field])
    assert set(results["memory_ratios"]) == set(expected)
    for key, ratio in results["memory_ratios"].items():
        assert math.isfinite(ratio["value"]) and ratio["value"] > 0, (key, ratio)

    for field in ("torch", "transformers", "cpu_count", "device_name"):
        assert results["machine"][field]
    for entry in results["settings"].values():
        for part in ("train", "generate"):
            assert all(t > 0 for times in entry[part]["times_s"]["wall"].values() for t in times)
