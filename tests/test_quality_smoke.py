"""`benchmarks/quality.py --quick` trains every model end to end on the embedded template corpus and writes
results.json, keeping the flags given with --quick. No quality is asserted (a tiny model trained for a few steps says
nothing), except for the copy-source baseline, whose self-BLEU-4 must show that it copies; the full benchmark and its
reading are in docs/benchmarks.md."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METRIC_KEYS = ("ibleu", "ibleu_paper", "bleu2", "bleu4", "rougeL", "meteor", "sacrebleu", "self_bleu4")


@pytest.mark.slow
def test_quality_quick_scores_every_model(tmp_path):
    out = tmp_path / "quality"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "quality.py"),
            "--quick",
            "--max_steps",
            "6",
            "--output_dir",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,  # about 2 minutes on an idle 2-core CPU; several times that when the cores are shared
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "| copy the source |" in completed.stdout  # the table was printed

    results = json.loads((out / "results.json").read_text())
    assert results["config"]["max_steps"] == 6 and results["config"]["d_model"] == 32  # the flag given, then --quick's
    assert list(results["models"]) == ["none", "resonance", "scope", "bart", "copy-source"]
    for name, entry in results["models"].items():
        assert [run["seed"] for run in entry["runs"]] == [0], name
        metrics = entry["runs"][0]["metrics"]
        for key in METRIC_KEYS:
            assert math.isfinite(metrics[key]), (name, key, metrics[key])
            assert entry["summary"][key]["n"] == 1
        assert (out / name / "predictions.jsonl").is_file() or (out / f"{name}-seed0" / "predictions.jsonl").is_file()
    for name in ("none", "resonance", "scope", "bart"):
        run = results["models"][name]["runs"][0]
        assert run["steps"] == results["config"]["max_steps"], (name, run["steps"])
        assert math.isfinite(run["best_validation_loss"]), name

    copy = results["models"]["copy-source"]["runs"][0]["metrics"]
    assert copy["self_bleu4"] > 95  # BLEU-4 of the source against itself (method7 smoothing lets it exceed 100)
    predictions = [json.loads(line) for line in (out / "copy-source" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == results["config"]["max_test_samples"]
    assert all(row["prediction"] == row["source"] for row in predictions)
